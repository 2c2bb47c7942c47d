"""A simulated GPU node: the node file (what NVML, `nvidia-smi topo -m` and the kubelet would say)
and the ranks that opened its GPUs.

The file is the contract of `--simulate NODE.json` (docs/SIMULATE.md). It is read again whenever
it changes, so a test or an operator adds a job by writing it. A rank registers its PID on the GPU
CUDA would have opened for it (netmon.sim.rank); NVML's process list (netmon.sim.nvml) then holds
it until it exits, as the driver lists every process with a CUDA context.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from netmon import documents
from netmon.probe.processes import running_as, start_time
from netmon.topology.model import Topology
from netmon.topology.parse import parse_topo_matrix

GiB = 1 << 30
# What a rank's CUDA context and buffers hold, as NVML would count it.
RANK_MEMORY = 512 << 20
OPENED = "opened.jsonl"  # the run directory's journal of every rank that opened a GPU
# NVML averages utilization over a sample period of up to 1 s (nvml.h): a GPU reads busy for
# that long after its last process left.
UTILIZATION_WINDOW_S = 1.0
# Where a container's PID 1 sits among the host's PIDs, as far as a simulated node is concerned:
# beyond any PID of this machine (pid_max is at most 2^22), so a shifted PID is nobody here.
HOST_PID_SHIFT = 1 << 22


class SimulationError(ValueError):
    """The node file cannot be used; the message names the file, the field and the fix."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SimPcie(_Frozen):
    generation: int = Field(ge=1, le=6, description="under load, the link's trained generation")
    width: int = Field(ge=1, le=32)
    # An idle GPU drops its link to save power (Gen1 on most boards); a GPU with any process
    # reads `generation`.
    idle_generation: int | None = Field(None, ge=1, le=6)
    max_generation: int | None = Field(None, ge=1, le=6)  # default: `generation`
    max_width: int | None = Field(None, ge=1, le=32)  # default: `width`
    replay_counter: int = Field(0, ge=0)


# NVML errors a node file can make a call raise, by pynvml's name for them (NVML_ERROR_...).
NvmlFailure = Literal[
    "not_supported",
    "no_permission",
    "gpu_is_lost",
    "unknown",
    "driver_not_loaded",
    "lib_rm_version_mismatch",
    "timeout",
]


def _nvml_calls(value: dict[str, NvmlFailure]) -> dict[str, NvmlFailure]:
    import pynvml

    unknown = sorted(n for n in value if not (n.startswith("nvml") and hasattr(pynvml, n)))
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: name NVML calls as pynvml does (nvmlDevice...)")
    return value


NvmlErrors = Annotated[dict[str, NvmlFailure], AfterValidator(_nvml_calls)]


class SimGpu(_Frozen):
    uuid: str = Field(pattern=r"^GPU-[0-9A-Za-z-]+$")
    pci_bus_id: str = Field(pattern=r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
    name: str
    mig: bool = False
    nvlinks: int = Field(0, ge=0, le=18)
    nvlinks_down: tuple[int, ...] = ()
    pcie: SimPcie
    compute_mode: Literal["default", "exclusive_process", "prohibited"] = "default"
    memory_total: int = Field(80 * GiB, gt=0)
    # CUDA's default order (FASTEST_FIRST) puts the faster board first: compute capability,
    # then multiprocessors; equal boards keep PCI order.
    compute_capability: float = 9.0
    multiprocessors: int = Field(132, ge=1)
    # Cumulative NVLink error counters per link kind (replay, recovery, crc_flit, crc_data),
    # the same on every active link.
    nvlink_kib: int = Field(0, ge=0)  # NVLink data sent (and received) so far, KiB
    nvlink_errors: dict[Literal["replay", "recovery", "crc_flit", "crc_data"], int] = {}
    # Whether the board does CUDA peer-to-peer (NVML's P2P status with any other GPU): GeForce
    # boards and many VMs do not ("GPU not supported").
    p2p: bool = True
    # NVML calls on this GPU that fail, by pynvml's function name: {"nvmlDeviceGetComputeRunning
    # Processes": "no_permission"} (a container without the right capabilities), or
    # "gpu_is_lost" on nvmlDeviceGetUUID or nvmlDeviceGetHandleByIndex (a GPU fallen off the bus).
    nvml_errors: NvmlErrors = {}
    # Its minor number (/dev/nvidia<minor>; NVIDIA's DRA driver names it "gpu-<minor>"): its
    # index unless given, as on most nodes.
    minor: int | None = Field(None, ge=0)
    # The SM clock NVML reports (MHz): under load (an H100 SXM boosts to 1980) and idle.
    sm_clock_mhz: int = Field(1980, gt=0)
    idle_sm_clock_mhz: int = Field(345, gt=0)
    # Its NVLink fabric registration (nvmlDeviceGetGpuFabricInfoV) on an NVSwitch node: the state,
    # the status once completed (an nvmlReturn_t: 0 registered), and the multi-node NVLink
    # domain's cluster UUID (32 hex digits; none: a single-node fabric).
    fabric: Literal["not_started", "in_progress", "completed"] = "completed"
    fabric_status: int = Field(0, ge=0)
    cluster_uuid: str | None = Field(None, pattern=r"^[0-9a-f]{32}$")


class SimProcess(_Frozen):
    gpu: str  # the GPU's UUID
    pid: int = Field(gt=0)
    # None: NVML cannot say (it reports NVML_VALUE_NOT_AVAILABLE, which pynvml turns into None).
    used_memory: int | None = Field(8 * GiB, ge=0)


class SimPod(_Frozen):
    """A pod the kubelet gave a GPU to, and its phase: by NVIDIA's device plugin (by UUID), or
    by NVIDIA's DRA driver (`via: dra`: a ResourceClaim's device "gpu-<minor>"; `dra_fields:
    false` answers as a kubelet before 1.31, with the CDI device's name only)."""

    gpu: str  # the GPU's UUID
    pod: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    container: str = "main"
    phase: Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"] = "Running"
    via: Literal["device_plugin", "dra"] = "device_plugin"
    dra_fields: bool = True


class NodeFile(_Frozen):
    description: str = ""  # what machine this models, and which values are synthetic
    topology: str  # an `nvidia-smi topo -m` text, relative to the node file
    gpus: tuple[SimGpu, ...] = Field(min_length=1)  # in NVML index order (PCI bus order)
    processes: tuple[SimProcess, ...] = ()
    pods: tuple[SimPod, ...] = ()
    nvswitch: bool = False  # the GPUs are registered in an NVSwitch fabric (DGX/HGX)
    nccl: str | None = "2.27.5"  # the NCCL version a rank would report
    # What the driver and the installed torch would say (netmon.gpu.compat): the newest CUDA the
    # driver runs (NVML's nvmlSystemGetCudaDriverVersion_v2), the CUDA torch was built for, and
    # whether netmon sees the host's PIDs (`container`: a PID namespace of its own, where NVML
    # still lists host PIDs, so a rank's PID in NVML is not the one netmon knows).
    driver_cuda: str | None = Field("13.0", pattern=r"^\d+\.\d+$")
    torch_cuda: str | None = Field("13.0", pattern=r"^\d+\.\d+$")
    pid_namespace: Literal["host", "container"] = "host"
    # The CUDA a forward compatibility package in the ranks' library path brings (cuda-compat's
    # libcuda), over an older driver: None, none is installed.
    compat_cuda: str | None = Field(None, pattern=r"^\d+\.\d+$")
    # NVML calls made on no GPU that fail (nvmlInit, nvmlDeviceGetCount, ...), as `nvml_errors`
    # of a GPU: {"nvmlInit": "driver_not_loaded"}.
    nvml_errors: NvmlErrors = {}

    @model_validator(mode="after")
    def _known_gpus(self) -> NodeFile:
        uuids = [g.uuid for g in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise ValueError("gpus: every uuid must be unique")
        for kind, entries in (("processes", self.processes), ("pods", self.pods)):
            for entry in entries:
                if entry.gpu not in uuids:
                    raise ValueError(f"{kind}: gpu {entry.gpu} is not one of gpus' uuids")
        for gpu in self.gpus:
            if any(link >= gpu.nvlinks for link in gpu.nvlinks_down):
                raise ValueError(f"gpus: {gpu.uuid}: nvlinks_down names a link >= nvlinks")
        return self

    def gpu(self, uuid: str) -> SimGpu:
        return next(g for g in self.gpus if g.uuid == uuid)


def load_node_file(path: Path) -> tuple[NodeFile, Topology]:
    """The node file and its topology, or SimulationError in one line naming what is wrong."""
    try:
        document = json.loads(path.read_text(), object_pairs_hook=documents.unique_keys)
    except OSError as exc:
        raise SimulationError(f"--simulate: {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise SimulationError(f"--simulate: {path}: not JSON: {exc}") from None
    try:
        node = NodeFile.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise SimulationError(f"--simulate: {path}: {where}: {first['msg']}") from None
    topo_path = path.parent / node.topology
    try:
        topology = parse_topo_matrix(topo_path.read_text(errors="replace"))
    except OSError as exc:
        raise SimulationError(
            f"--simulate: {path}: topology: {topo_path}: {exc.strerror}"
        ) from None
    except ValueError as exc:
        raise SimulationError(f"--simulate: {path}: topology: {topo_path}: {exc}") from None
    if len(topology.gpus) != len(node.gpus):
        raise SimulationError(
            f"--simulate: {path}: gpus: {len(node.gpus)} listed, the topology shows "
            f"{len(topology.gpus)}: list one entry per GPU of {node.topology}, in PCI bus order"
        )
    # NVML gives the UUIDs and bus ids that `topo -m` does not print.
    gpus = tuple(
        dataclasses.replace(t, uuid=g.uuid, pci_bus_id=g.pci_bus_id)
        for t, g in zip(topology.gpus, node.gpus, strict=True)
    )
    return node, dataclasses.replace(topology, gpus=gpus)


@dataclasses.dataclass(frozen=True)
class RankRecord:
    pid: int
    uuid: str


class SimulatedNode:
    """The node file, read again when it changes, and the run directory where ranks register.

    A file that fails to parse after a change keeps the last good one in force (a writer that is
    not atomic must not make every GPU vanish); its error is kept in `last_error`.
    """

    def __init__(self, path: Path, run_dir: Path) -> None:
        self.path = path.resolve()
        self.run_dir = run_dir
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self.node, self._topology = load_node_file(self.path)
        self._stamp = self._stat()
        self.last_error: str | None = None
        self._busy_at: dict[str, float] = {}  # GPU -> when kernels last ran on it

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def current(self) -> NodeFile:
        with self._lock:
            stamp = self._stat()
            if stamp is not None and stamp != self._stamp:
                self._stamp = stamp
                try:
                    self.node, self._topology = load_node_file(self.path)
                    self.last_error = None
                except SimulationError as exc:
                    self.last_error = str(exc)
            return self.node

    def topology(self) -> Topology:
        self.current()
        return self._topology

    # ---- ranks ----

    def register(self, uuid: str, pid: int, env: Mapping[str, str]) -> None:
        """A rank opened `uuid`: listed among its processes until it exits. Written whole
        (rename), so a reader never sees half a record; also journalled in `opened`."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        record = {"pid": pid, "uuid": uuid, "start": start_time(pid)}
        partial = self.run_dir / f".{pid}.tmp"
        partial.write_text(json.dumps(record))
        os.replace(partial, self.run_dir / f"{pid}.rank")
        # What CUDA and NCCL would have been configured with.
        given = {k: v for k, v in env.items() if k.startswith(("CUDA_", "NCCL_"))}
        line = json.dumps({**record, "env": given}) + "\n"
        # One write() to a file opened with O_APPEND lands whole at its end, as other
        # ranks append theirs at the same moment.
        fd = os.open(self.run_dir / OPENED, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def opened(self) -> list[dict[str, Any]]:
        """Every rank that opened a GPU here, in order, with its CUDA and NCCL environment."""
        try:
            text = (self.run_dir / OPENED).read_text()
        except OSError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def kernels(self, pid: int, running: bool) -> None:
        """Rank `pid` started (`running`) or ended its collectives, now (CLOCK_MONOTONIC, one clock
        for every process of the machine). Written whole (rename), as `register` is."""
        partial = self.run_dir / f".{pid}.kernels.tmp"
        partial.write_text(json.dumps({"running": running, "at": time.monotonic()}))
        os.replace(partial, self.run_dir / f"{pid}.kernels")

    def _kernels_of(self, pid: int) -> tuple[bool, float] | None:
        """(running, since when) of rank `pid`'s collectives; None before its first."""
        try:
            record = json.loads((self.run_dir / f"{pid}.kernels").read_text())
        except (OSError, ValueError):
            return None
        return bool(record["running"]), float(record["at"])

    def ranks(self) -> list[RankRecord]:
        """The registered ranks still running; the records of those gone are removed. A PID
        reused by another process (another start time) is not a rank."""
        found = []
        try:
            entries = list(self.run_dir.glob("*.rank"))
        except OSError:
            return []
        for entry in entries:
            try:
                record = json.loads(entry.read_text())
            except (OSError, ValueError):
                continue
            pid = int(record["pid"])
            if not running_as(pid, record.get("start")):
                self._gone(pid, str(record["uuid"]))
                entry.unlink(missing_ok=True)
                continue
            found.append(RankRecord(pid, str(record["uuid"])))
        return sorted(found, key=lambda r: r.pid)

    def _gone(self, pid: int, uuid: str) -> None:
        """Rank `pid` has exited: the GPU was last busy when its collectives ended, or, killed
        while they ran, about now (one that ran none left no load)."""
        kernels = self._kernels_of(pid)
        (self.run_dir / f"{pid}.kernels").unlink(missing_ok=True)
        if kernels is None:
            return
        ended = time.monotonic() if kernels[0] else kernels[1]
        with self._lock:
            self._busy_at[uuid] = max(self._busy_at.get(uuid, ended), ended)

    def processes(self, uuid: str) -> list[tuple[int, int | None]]:
        """(pid, bytes used) on the GPU: the file's jobs, then netmon's ranks."""
        node = self.current()
        jobs = [(p.pid, p.used_memory) for p in node.processes if p.gpu == uuid]
        # NVML lists host PIDs: in a PID namespace of its own netmon knows its ranks by others.
        shift = HOST_PID_SHIFT if node.pid_namespace == "container" else 0
        ranks = [(r.pid + shift, RANK_MEMORY) for r in self.ranks() if r.uuid == uuid]
        return jobs + ranks

    def utilization(self, uuid: str) -> int:
        """Percent, as NVML averages it over its sample period: busy while kernels run (a job's
        always, a rank's during its collectives) and for up to a second after they stopped
        (UTILIZATION_WINDOW_S). A rank that holds its context and runs nothing is idle."""
        node = self.current()
        now = time.monotonic()
        if any(p.gpu == uuid for p in node.processes):
            with self._lock:
                self._busy_at[uuid] = now
            return 90
        for rank in self.ranks():
            kernels = self._kernels_of(rank.pid) if rank.uuid == uuid else None
            if kernels is None:
                continue
            running, at = kernels
            ended = now if running else at
            with self._lock:
                self._busy_at[uuid] = max(self._busy_at.get(uuid, ended), ended)
        with self._lock:
            since = now - self._busy_at.get(uuid, -UTILIZATION_WINDOW_S)
        return 90 if since < UTILIZATION_WINDOW_S else 0

    # ---- CUDA's view ----

    def cuda_device(self, env: Mapping[str, str]) -> SimGpu:
        """The GPU that is CUDA device 0 in a process with this environment, as the CUDA runtime
        enumerates (docs/SIMULATE.md): CUDA_VISIBLE_DEVICES names GPUs by UUID (or a unique
        prefix of one) or by index, counted in PCI bus order under CUDA_DEVICE_ORDER=PCI_BUS_ID
        and fastest first otherwise. No device: RuntimeError with CUDA's words."""
        node = self.current()
        order = list(node.gpus)
        if env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") != "PCI_BUS_ID":
            order.sort(key=lambda g: (-g.compute_capability, -g.multiprocessors))
        visible = env.get("CUDA_VISIBLE_DEVICES")
        first = order[0] if visible is None else _first_visible(visible, order)
        if first is None:
            raise RuntimeError(
                "CUDA error: no CUDA-capable device is detected "
                f"(CUDA_VISIBLE_DEVICES={visible!r} names no GPU of {self.path.name})"
            )
        if first.mig:
            raise RuntimeError(
                f"CUDA error: {first.uuid} is in MIG mode: CUDA sees only its MIG instances"
            )
        if "gpu_is_lost" in first.nvml_errors.values():
            # A GPU fallen off the bus (Xid 79): NVML says GPU_IS_LOST, CUDA cannot use it.
            raise RuntimeError(f"CUDA error: unknown error ({first.uuid} has fallen off the bus)")
        return first


def _first_visible(visible: str, order: list[SimGpu]) -> SimGpu | None:
    """CUDA reads CUDA_VISIBLE_DEVICES up to the first entry it cannot resolve."""
    entry = visible.split(",")[0].strip()
    if entry.startswith("GPU-"):
        matches = [g for g in order if g.uuid.lower().startswith(entry.lower())]
        return matches[0] if len(matches) == 1 else None
    if entry.isdigit() and int(entry) < len(order):
        return order[int(entry)]
    return None
