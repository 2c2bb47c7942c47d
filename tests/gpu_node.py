"""A simulated GPU node, as strict as the hardware where netmon depends on it.

A node is built from a published `nvidia-smi topo -m` (tests/fixtures) plus what that output does
not show: each GPU's model, PCI bus id and UUID, MIG mode, the jobs on it and the pods the kubelet
gave it to. It answers as NVML does (netmon.gpu.idle.IdleSource: a GpuReading per GPU, indexed in
PCI bus order) and as CUDA would enumerate it: `cuda_device(env)` says which physical GPU a rank's
CUDA device 0 is, from CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, the way the CUDA runtime
documents them (docs/FACTS.md): UUIDs name a GPU outright; indexes count in PCI bus order under
CUDA_DEVICE_ORDER=PCI_BUS_ID and fastest first otherwise (the default).

SimulatedLauncher drives real rank processes on gloo for a spec built for NCCL: it records what
each rank would have been given on the GPU node (its command and CUDA environment), then runs the
same probe on CPU ranks, so preemption, deadlines and kills happen for real.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from netmon.gpu.fabric import FabricReading
from netmon.gpu.idle import GpuReading
from netmon.gpu.linkhealth import LinkHealth, NvLinkReading, NvLinkThroughput, PcieReading
from netmon.probe.launcher import Launcher
from netmon.probe.spec import ProbeOutcome
from netmon.topology.model import Topology
from netmon.topology.parse import parse_topo_matrix

FIXTURES = Path(__file__).parent / "fixtures"


@dataclass(frozen=True)
class Board:
    """One GPU as NVML and CUDA see it. `speed` orders CUDA's FASTEST_FIRST enumeration (CUDA
    ranks by compute capability and multiprocessor count; a larger number here is faster)."""

    index: int  # NVML's index: PCI bus order
    model: str
    pci_bus_id: str
    uuid: str
    speed: int
    mig: bool = False


@dataclass
class SimNode:
    name: str
    topology: Topology
    boards: tuple[Board, ...]
    jobs: dict[int, tuple[int, ...]] = field(default_factory=dict)  # NVML index -> PIDs
    pods: dict[int, str] = field(default_factory=dict)  # NVML index -> pod holding it
    nvswitch: bool = False  # GPUs joined by NVSwitches into one NVLink fabric (DGX/HGX)
    nvlinks: int = 0  # NVLinks per GPU that NVML lists (18 on H100 SXM)
    down: set[tuple[int, int]] = field(default_factory=set)  # (gpu, link) inactive
    link_reads: int = 0  # link health reads so far: each one adds a replay error on link 0
    reads: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- NVML, as netmon reads it ----

    def read(self) -> list[GpuReading]:
        with self._lock:
            self.reads += 1
            return [
                GpuReading(
                    index=board.index,
                    uuid=board.uuid,
                    utilization=90.0 if self.jobs.get(board.index) else 0.0,
                    memory_used=(8 << 30) if self.jobs.get(board.index) else (1 << 20),
                    compute_pids=self.jobs.get(board.index, ()),
                    mig_enabled=board.mig,
                    allocated_to=self.pods.get(board.index),
                )
                for board in self.boards
            ]

    # ---- what happens on the node ----

    def job_appears(self, gpu: int, pid: int = 424242) -> None:
        with self._lock:
            self.jobs[gpu] = (*self.jobs.get(gpu, ()), pid)

    def job_leaves(self, gpu: int) -> None:
        with self._lock:
            self.jobs.pop(gpu, None)

    def pod_given(self, gpu: int, pod: str) -> None:
        """The kubelet's device plugin gives the GPU to `pod` (namespace/name), as the kubelet
        guard then marks the reading."""
        with self._lock:
            self.pods[gpu] = f"pod {pod} (container main, nvidia.com/gpu)"

    # ---- CUDA's view ----

    def cuda_device(self, env: Mapping[str, str]) -> Board:
        """The physical GPU that is CUDA device 0 in a process with this environment."""
        order = sorted(self.boards, key=lambda b: b.index)
        if env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") != "PCI_BUS_ID":
            # Stable: equal speeds keep PCI order, as CUDA breaks ties by PCI bus id.
            order = sorted(order, key=lambda b: -b.speed)
        visible = env.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return order[0]
        first = visible.split(",")[0].strip()
        if first.startswith(("GPU-", "MIG-")):
            return next(b for b in self.boards if b.uuid == first)
        return order[int(first)]

    def fabric(self) -> tuple[FabricReading, ...]:
        """NVML's NVLink fabric state per GPU: registered on NVSwitch systems (state completed,
        status 0), NotSupported for a GPU in no fabric (PCIe boards, NVLink bridges)."""
        return tuple(
            FabricReading(b.index, b.uuid, "completed", 0, 0, None)
            if self.nvswitch
            else FabricReading(b.index, b.uuid, "not_supported", None, None, None)
            for b in self.boards
        )

    def link_health(self, under_load: bool) -> LinkHealth:
        """NVML's link health, as netmon.gpu.nvml.read_link_health gives it: PCIe Gen5 x16 (Gen1
        at idle, as GPUs save power), NVLinks active but for `down`, and error and throughput
        counters that grow with every read, as a link that keeps retrying would show."""
        with self._lock:
            self.link_reads += 1
            reads = self.link_reads
        pcie = tuple(
            PcieReading(b.index, 5 if under_load else 1, 5, 16, 16, replay_counter=0)
            for b in self.boards
        )
        links = tuple(
            NvLinkReading(
                b.index,
                link,
                active=(b.index, link) not in self.down,
                replay_errors=reads if link == 0 else 0,
                recovery_errors=0,
                crc_flit_errors=0,
                crc_data_errors=0,
            )
            for b in self.boards
            for link in range(self.nvlinks)
        )
        sent = tuple(
            NvLinkThroughput(b.index, reads << 20, reads << 20) for b in self.boards if self.nvlinks
        )
        return LinkHealth(pcie, links, sent, under_load=under_load, read_at=time.time())

    def board(self, index: int) -> Board:
        return next(b for b in self.boards if b.index == index)


def _uuid(node: str, index: int) -> str:
    return f"GPU-{node[:4]}{index:04d}-0000-4000-8000-00000000{index:04d}"


def _node(
    name: str,
    fixture: str,
    models: Sequence[tuple[str, int]],
    mig: Sequence[int] = (),
) -> SimNode:
    topology = parse_topo_matrix((FIXTURES / fixture).read_text())
    boards = tuple(
        Board(
            index=gpu.index,
            model=models[gpu.index][0],
            pci_bus_id=f"00000000:{0x18 + 0x10 * gpu.index:02X}:00.0",
            uuid=_uuid(name, gpu.index),
            speed=models[gpu.index][1],
            mig=gpu.index in mig,
        )
        for gpu in topology.gpus
    )
    # NVML gives the UUIDs and bus ids that `topo -m` does not print.
    gpus = tuple(
        dataclasses.replace(g, uuid=b.uuid, pci_bus_id=b.pci_bus_id)
        for g, b in zip(topology.gpus, boards, strict=True)
    )
    return SimNode(name, dataclasses.replace(topology, gpus=gpus), boards)


def dgx_h100(mig: Sequence[int] = ()) -> SimNode:
    """8 x H100 SXM, every pair NV18, GPUs 0-3 on NUMA node 0 and 4-7 on node 1."""
    models = [("NVIDIA H100 80GB HBM3", 90)] * 8
    node = _node("dgxh", "topo_8xH100_sxm_nv18_nonic_mlengineering.txt", models, mig)
    node.nvswitch, node.nvlinks = True, 18
    return node


def pcie_workstation() -> SimNode:
    """4 x RTX 6000 Ada on PCIe only (no NVLink): every pair crosses the host bridge or CPUs."""
    models = [("NVIDIA RTX 6000 Ada Generation", 89)] * 4
    return _node("ws4a", "topo_4x_rtx6000ada_pcie_cx7_asus_esc8000a.txt", models)


def mixed_models() -> SimNode:
    """3 GPUs of two models where CUDA's default order differs from PCI order: NVML's GPU 0 is the
    slow board, so CUDA's device 0 (fastest first) is NVML's GPU 1."""
    models = [("NVIDIA RTX A4000", 86), ("NVIDIA A100-PCIE-40GB", 90), ("NVIDIA RTX A4000", 86)]
    return _node("mixd", "topo_3x_rtxa6000_nv4_bridge_pair.txt", models)


class SimulatedLauncher(Launcher):
    """Records what each rank would have been given on the GPU node, then runs the same probe on
    gloo CPU ranks for real. Set `node` before use; `given` collects one record per rank."""

    node: ClassVar[SimNode | None] = None
    given: ClassVar[list[dict[str, Any]]] = []
    # Called with every launcher event (phase, size...) as on_event is: a test's hook for things
    # that happen on the node mid-probe.
    watch: ClassVar[Callable[[str, dict[str, Any]], None] | None] = None
    # Per launch: when its abort check first said stop, and the rank PIDs it started.
    stopped_at: ClassVar[list[tuple[str, float]]] = []
    pids_seen: ClassVar[list[int]] = []
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def reset(cls, node: SimNode | None) -> None:
        cls.node, cls.watch = node, None
        cls.given, cls.stopped_at, cls.pids_seen = [], [], []

    def run(self) -> ProbeOutcome:
        assert SimulatedLauncher.node is not None, "set SimulatedLauncher.node first"
        for rank in self.local_ranks:
            env = self._rank_env(rank)
            with SimulatedLauncher._lock:
                SimulatedLauncher.given.append(
                    {
                        "rank": rank,
                        "devices": self.spec.devices,
                        "path": self.spec.path,
                        "env": {k: v for k, v in env.items() if k.startswith(("CUDA_", "NCCL_"))},
                        "gpu": SimulatedLauncher.node.cuda_device(env),
                        "command": self._command(rank),
                    }
                )
        cpu = self.spec.model_copy(
            update={"backend": "gloo", "devices": (), "cuda_devices": (), "wrappers": ()}
        )
        cpu_launcher = Launcher(
            cpu,
            python=self.python,
            abort=self._recorded_abort(),
            on_event=self._watched,
            local_ranks=self.local_ranks,
            port_source=self.port_source,
        )
        self.pids = cpu_launcher.pids  # the same list object: live pids as they are spawned
        try:
            outcome = cpu_launcher.run()
        finally:
            with SimulatedLauncher._lock:
                SimulatedLauncher.pids_seen.extend(cpu_launcher.pids)
        return outcome.model_copy(update={"spec": self.spec})

    def _watched(self, kind: str, fields: dict[str, Any]) -> None:
        if SimulatedLauncher.watch is not None:
            SimulatedLauncher.watch(kind, fields)
        if self.on_event is not None:
            self.on_event(kind, fields)

    def _recorded_abort(self) -> Callable[[], str | None] | None:
        check, label = self.abort, ",".join(self.spec.devices)
        said: list[str] = []
        if check is None:
            return None

        def abort() -> str | None:
            reason = check()
            if reason is not None and not said:
                said.append(reason)
                with SimulatedLauncher._lock:
                    SimulatedLauncher.stopped_at.append((label, time.monotonic()))
            return reason

        return abort
