"""Whether NCCL ranks started here can open their GPUs and be told from jobs: the driver must run
the CUDA that torch was built for, and the PIDs NVML lists must be the PIDs netmon sees.

Both fail the same way on a real node if nobody checks: every rank dies at its first CUDA call (a
driver too old), or every rank looks like a job on its own GPU and every probe ends `preempted`
half a second in (a PID namespace of its own). Checked once at start, each answered in one line
naming the fix (docs/GPU-ACCEPTANCE.md, "Before the first probe").

The pure rules (`driver_fault`, `namespace_fault`) are apart from the readings (`read_driver_cuda`,
`read_pid_namespace`), which a simulated node answers from its node file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from netmon import sim
from netmon.gpu.torch_build import CUDA_LINE, torch_name, torch_version_py

# The inode of the initial PID namespace, PROC_PID_INIT_INO in the kernel's include/linux/proc_ns.h:
# /proc/self/ns/pid points at it exactly when this process sees host PIDs.
INIT_PID_NAMESPACE_INODE = 0xEFFFFFFC
# The oldest Linux driver that runs each CUDA major release (the CUDA Toolkit release notes, "CUDA
# Driver" table of minor version compatibility): said in the message, not used to decide.
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580"}

# The CUDA version each Linux driver branch runs (the CUDA Toolkit release notes, table "CUDA
# Toolkit and Corresponding Driver Versions"; nvidia-smi's "CUDA Version"): how the forward
# compatibility package's libcuda.so.<driver version> says which CUDA it brings.
BRANCH_CUDA = {
    450: "11.0", 455: "11.1", 460: "11.2", 465: "11.3", 470: "11.4", 495: "11.5", 510: "11.6",
    515: "11.7", 520: "11.8", 525: "12.0", 530: "12.1", 535: "12.2", 545: "12.3", 550: "12.4",
    555: "12.5", 560: "12.6", 565: "12.7", 570: "12.8", 575: "12.9", 580: "13.0",
}  # fmt: skip
_COMPAT_LIB = re.compile(r"^libcuda\.so\.(\d+)\.\d+(?:\.\d+)?$")

PidNamespace = Literal["host", "container"]
# Skip reasons of their own (netmon_probe_skips_total): a node that cannot run ranks at all.
FAULT_REASONS = ("cuda_driver", "pid_namespace")


@dataclass(frozen=True, order=True)
class CudaVersion:
    major: int
    minor: int

    @classmethod
    def from_nvml(cls, value: int) -> CudaVersion:
        """NVML and cuDriverGetVersion give 1000 x major + 10 x minor (12040 is 12.4)."""
        return cls(value // 1000, (value % 1000) // 10)

    @classmethod
    def parse(cls, text: str) -> CudaVersion:
        found = re.fullmatch(r"\s*(\d+)\.(\d+)(?:\.\d+)?\s*", text)
        if found is None:
            raise ValueError(f"not a CUDA version (major.minor): {text!r}")
        return cls(int(found.group(1)), int(found.group(2)))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclass(frozen=True)
class Fault:
    """Why no rank may start on this node: a skip reason and the one line that says the fix."""

    reason: str
    message: str


def driver_fault(
    driver: CudaVersion | None,
    torch_cuda: CudaVersion | None,
    torch: str,
    compat: CudaVersion | None = None,
) -> Fault | None:
    """A driver whose CUDA major release is older than torch's build cannot run it: the CUDA
    runtime refuses at its first call (cudaErrorInsufficientDriver). An older minor release of
    the same major runs under minor version compatibility, so it passes, and so does an older
    driver under a forward compatibility package (`compat`: the CUDA its libcuda brings) that is
    new enough. Unknown either way: nothing to say."""
    if driver is None or torch_cuda is None or driver.major >= torch_cuda.major:
        return None
    if compat is not None and compat.major >= torch_cuda.major:
        return None
    need = MIN_DRIVER.get(torch_cuda.major)
    newer = f"R{need} or newer" if need else f"one for CUDA {torch_cuda.major}"
    return Fault(
        "cuda_driver",
        f"the NVIDIA driver runs CUDA up to {driver}, but {torch} is built for CUDA {torch_cuda}:"
        f" every rank would fail at its first CUDA call; upgrade the driver ({newer}) or install"
        f" a torch built for CUDA {driver.major}.x (its wheel index, download.pytorch.org/whl/"
        f"cu{driver.major}<minor>, as pytorch.org's install selector shows)",
    )


def namespace_fault(namespace: PidNamespace) -> Fault | None:
    """NVML lists host PIDs whatever namespace asks (the driver does not translate them:
    NVIDIA/nvidia-docker#1483), so a daemon in a PID namespace of its own cannot tell its ranks
    from a job."""
    if namespace == "host":
        return None
    return Fault(
        "pid_namespace",
        "netmon runs in a PID namespace of its own (a container without the host's PIDs): NVML"
        " lists host PIDs, so its own ranks would look like jobs and every probe would end"
        " preempted; run it with hostPID: true (Kubernetes, the chart's default) or"
        " docker run --pid=host",
    )


# ---- readings ----


def read_pid_namespace(ns_link: Path = Path("/proc/self/ns/pid")) -> PidNamespace:
    """`host` in the initial PID namespace, `container` in any other. A simulated node says what
    its node file says."""
    node = sim.active()
    if node is not None:
        return node.current().pid_namespace
    try:
        inode = os.stat(ns_link).st_ino
    except OSError:
        return "host"  # no /proc/self/ns (an old kernel): nothing says otherwise
    return "host" if inode == INIT_PID_NAMESPACE_INODE else "container"


def read_driver_cuda(nvml: Any = None) -> CudaVersion | None:
    """The newest CUDA the driver runs, as NVML reports it; None when NVML cannot say."""
    from netmon.gpu.nvml import session

    try:
        with session(nvml) as nv:
            try:
                value = int(nv.nvmlSystemGetCudaDriverVersion_v2())
            except nv.NVMLError:  # FunctionNotFound on an old libnvidia-ml: the first version
                value = int(nv.nvmlSystemGetCudaDriverVersion())
    except Exception:  # NvmlUnavailable, or an NVMLError: nothing to compare, let others say
        return None
    return CudaVersion.from_nvml(value) if value > 0 else None


def read_compat_cuda(
    environ: dict[str, str] | None = None,
) -> tuple[CudaVersion, Path] | None:
    """The CUDA a forward compatibility package brings (the cuda-compat package's libcuda.so.<driver
    version>, in a directory of LD_LIBRARY_PATH, which the ranks inherit), and where it lies; the
    newest found, or None. A simulated node says what its node file says."""
    node = sim.active()
    if node is not None:
        said = node.current().compat_cuda
        return (CudaVersion.parse(said), node.path) if said else None
    found: list[tuple[CudaVersion, Path]] = []
    paths = (environ if environ is not None else os.environ).get("LD_LIBRARY_PATH", "")
    for directory in filter(None, paths.split(os.pathsep)):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            match = _COMPAT_LIB.match(name)
            cuda = BRANCH_CUDA.get(int(match.group(1))) if match else None
            if cuda is not None:
                found.append((CudaVersion.parse(cuda), Path(directory) / name))
    return max(found, default=None)


def read_torch_cuda(version_py: Path | None = None) -> tuple[CudaVersion | None, str]:
    """The CUDA version the installed torch was built for (torch/version.py, read without
    importing torch), and torch's name for messages. A simulated node says what its node file
    says: its ranks run a CPU build on gloo."""
    node = sim.active()
    if node is not None:
        built = node.current().torch_cuda
        return (CudaVersion.parse(built) if built else None), "the simulated node's torch"
    text = torch_version_py(version_py)
    if text is None:
        return None, "torch"
    found = CUDA_LINE.search(text)
    built = found.group("value").strip("'\"") if found else ""
    name = torch_name(text)
    try:
        return CudaVersion.parse(built), name
    except ValueError:  # None: a CPU build, which torch_build.torch_without_cuda names
        return None, name


def node_fault() -> Fault | None:
    """The first reason no rank may start on this node, read now; None when none is known."""
    found = namespace_fault(read_pid_namespace())
    if found is not None:
        return found
    torch_cuda, torch = read_torch_cuda()
    compat = read_compat_cuda()
    return driver_fault(read_driver_cuda(), torch_cuda, torch, compat[0] if compat else None)
