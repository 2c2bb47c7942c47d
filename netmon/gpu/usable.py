"""Whether this machine can run NCCL probes at all: an NVIDIA driver, NVML that lists GPUs, a
torch built with CUDA, a driver that runs that CUDA and host PIDs (netmon.gpu.compat). Read
without importing torch or creating a CUDA context, so the daemon and the commands can ask before
they start anything; the answer names the first part missing."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from netmon import sim

_DRIVER = Path("/proc/driver/nvidia/version")
_DEVICE = Path("/dev/nvidiactl")
# torch/version.py, written when torch is built: `cuda: Optional[str] = '12.4'`, or None in a
# CPU build (older releases leave out the annotation).
CUDA_LINE = re.compile(r"^cuda\s*(?::[^=]*)?=\s*(?P<value>.+?)\s*$", re.MULTILINE)


def missing_for_nccl() -> str | None:
    """What keeps NCCL probes from running here, in one phrase; None when nothing does. On a
    simulated node the node file stands for driver and NVML (its `nvml_errors` included), and
    ranks run on gloo: only what the node file can say is asked (netmon.gpu.compat)."""
    from netmon.gpu.compat import node_fault

    real = sim.active() is None
    if real and not (_DRIVER.exists() or _DEVICE.exists()):
        return f"no NVIDIA driver loaded ({_DRIVER} and {_DEVICE} are missing)"
    missing = _nvml_gpus() or (torch_without_cuda() if real else None)
    if missing is not None:
        return missing
    fault = node_fault()
    return fault.message if fault is not None else None


def _nvml_gpus() -> str | None:
    from netmon.gpu.idle import IdleSourceError
    from netmon.gpu.nvml import _session

    try:
        with _session() as nv:
            count = int(nv.nvmlDeviceGetCount())
    except IdleSourceError as exc:
        return str(exc)
    except Exception as exc:  # NVMLError on the count: a driver that lost its GPUs
        return f"NVML answers no GPU count: {exc}"
    return None if count else "NVML lists no GPU (in a container: is the GPU passed in?)"


def torch_without_cuda(version_py: Path | None = None) -> str | None:
    """Why the installed torch (or the one whose torch/version.py is given) cannot run NCCL
    ranks; None for a CUDA build."""
    if version_py is None and importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    text = torch_version_py(version_py)
    if text is None:
        return None  # no way to tell without importing it: let the ranks say
    found = CUDA_LINE.search(text)
    if found is None or found.group("value") not in ("None", "''", '""'):
        return None
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.MULTILINE)
    built = f"torch {version.group(1)}" if version else "torch"
    return f"{built} is a CPU build (torch.version.cuda is None): install a CUDA build of torch"


def torch_version_py(version_py: Path | None = None) -> str | None:
    """The text of the installed torch's torch/version.py (or of the file given); None when it
    cannot be read."""
    if version_py is None:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            return None
        version_py = Path(spec.origin).parent / "version.py"
    try:
        return version_py.read_text()
    except OSError:
        return None
