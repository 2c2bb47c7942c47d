"""Simulated GPU nodes for the tests: node files (`--simulate NODE.json`, netmon.sim) written from a
published `nvidia-smi topo -m` (tests/fixtures) plus what that output does not show: each GPU's
model, PCI bus id and UUID, MIG mode, the jobs on it and the pods the kubelet gave it to.

Everything above the file is netmon's own code: NVML answers through netmon.sim.nvml and
netmon.gpu.nvml, ranks are started by the real launcher and rank zygote and register on the GPU
CUDA would open for them. A test changes the node by rewriting the file, as an operator or a job
would change the machine: atomically, so a reader sees the old file or the new one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from netmon import sim
from netmon.gpu.fabric import FabricReading
from netmon.gpu.idle import GpuReading
from netmon.gpu.linkhealth import LinkHealth
from netmon.gpu.nvml import NvmlSource
from netmon.gpu.nvml_links import read_fabric, read_link_health
from netmon.sim.node import SimulatedNode, load_node_file
from netmon.sim.nvml import SimulatedNvml
from netmon.topology.model import Topology
from tests.conftest import wait_for

FIXTURES = Path(__file__).parent / "fixtures"
DGX_TOPO = "topo_8xH100_sxm_nv18_nonic_mlengineering.txt"


class SimNode:
    """A node file and the simulated node it describes. Activate it (`activate`) to put this
    process and every process it starts on it."""

    def __init__(self, path: Path, document: dict[str, Any]) -> None:
        self.path = path
        self.run_dir = path.parent / f"{path.stem}.run"
        self.document = document
        self.write()
        self.sim = SimulatedNode(path, self.run_dir)
        self.nvml = SimulatedNvml(self.sim)

    def write(self) -> None:
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.document, indent=1))
        os.replace(partial, self.path)

    def activate(self, monkeypatch: pytest.MonkeyPatch) -> SimNode:
        monkeypatch.setenv(sim.ENV_NODE, str(self.path))
        monkeypatch.setenv(sim.ENV_RUN, str(self.run_dir))
        return self

    @property
    def topology(self) -> Topology:
        return load_node_file(self.path)[1]

    def uuid(self, gpu: int) -> str:
        return str(self.document["gpus"][gpu]["uuid"])

    def index_of(self, uuid: str) -> int:
        return next(i for i, g in enumerate(self.document["gpus"]) if g["uuid"] == uuid)

    # ---- what happens on the node ----

    def job_appears(self, gpu: int, pid: int = 424242) -> None:
        self.document["processes"].append({"gpu": self.uuid(gpu), "pid": pid})
        self.write()

    def job_leaves(self, gpu: int) -> None:
        uuid = self.uuid(gpu)
        self.document["processes"] = [p for p in self.document["processes"] if p["gpu"] != uuid]
        self.write()

    def job_left(self, gpu: int) -> None:
        """The job leaves, and NVML's averaged utilization has come down: the GPU reads idle.
        (Read first: the job is seen until the moment it leaves, whoever else reads NVML.)"""
        self.read()
        self.job_leaves(gpu)
        wait_for(lambda: self.read()[gpu].utilization == 0 or None, 5, f"GPU {gpu} idle", 0.05)

    def pod_given(self, gpu: int, pod: str, phase: str = "Running", **how: Any) -> None:
        """A pod the kubelet gave the GPU to; `how`: the node file's `via` and `dra_fields`."""
        self.document.setdefault("pods", []).append(
            {"gpu": self.uuid(gpu), "pod": pod, "phase": phase, **how}
        )
        self.write()

    # ---- NVML, through netmon's own readers ----

    def read(self) -> list[GpuReading]:
        with NvmlSource(self.nvml) as source:
            return source.read()

    def link_health(self, under_load: bool) -> LinkHealth:
        return read_link_health(under_load, nvml=self.nvml)

    def fabric(self) -> tuple[FabricReading, ...]:
        return read_fabric(nvml=self.nvml)

    # ---- what the ranks did ----

    def opened(self) -> list[dict[str, Any]]:
        """Every rank that opened a GPU of this node, in order: pid, uuid and its CUDA env."""
        return self.sim.opened()

    def ranks_on(self, gpu: int) -> list[int]:
        uuid = self.uuid(gpu)
        return [r.pid for r in self.sim.ranks() if r.uuid == uuid]


def node_file(
    directory: Path,
    name: str,
    fixture: str,
    models: Sequence[tuple[str, float, int]],
    *,
    mig: Sequence[int] = (),
    nvswitch: bool = False,
    nvlinks: int = 0,
    idle_generation: int = 1,
) -> SimNode:
    """A node file for the fixture's topology, its GPUs of `models` (name, compute capability,
    multiprocessors) in PCI bus order. UUIDs and bus ids are SYNTHETIC."""
    directory.mkdir(parents=True, exist_ok=True)
    topo = directory / f"{name}.topo.txt"
    topo.write_text((FIXTURES / fixture).read_text())
    gpus = [
        {
            "uuid": f"GPU-{name[:4]}{index:04d}-0000-4000-8000-00000000{index:04d}",
            "pci_bus_id": f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            "name": model,
            "compute_capability": capability,
            "multiprocessors": sms,
            "mig": index in mig,
            "nvlinks": nvlinks,
            "pcie": {"generation": 5, "width": 16, "idle_generation": idle_generation},
        }
        for index, (model, capability, sms) in enumerate(models)
    ]
    document = {"topology": topo.name, "gpus": gpus, "processes": [], "nvswitch": nvswitch}
    return SimNode(directory / f"{name}.json", document)


def shipped_node(directory: Path, name: str) -> SimNode:
    """A copy of the node file tests/fixtures/nodes/NAME.json, its topology read where it lies."""
    shipped = FIXTURES / "nodes" / f"{name}.json"
    document = json.loads(shipped.read_text())
    document["topology"] = str((shipped.parent / document["topology"]).resolve())
    document.setdefault("processes", [])
    directory.mkdir(parents=True, exist_ok=True)
    return SimNode(directory / f"{name}.json", document)


def dgx_h100(directory: Path, mig: Sequence[int] = ()) -> SimNode:
    """8 x H100 SXM on NVSwitch, every pair NV18, GPUs 0-3 on NUMA node 0 and 4-7 on node 1."""
    models = [("NVIDIA H100 80GB HBM3", 9.0, 132)] * 8
    return node_file(directory, "dgxh", DGX_TOPO, models, mig=mig, nvswitch=True, nvlinks=18)


def pcie_workstation(directory: Path) -> SimNode:
    """4 x RTX 6000 Ada on PCIe only (no NVLink): every pair crosses the host bridge or CPUs."""
    models = [("NVIDIA RTX 6000 Ada Generation", 8.9, 142)] * 4
    return node_file(directory, "ws4a", "topo_4x_rtx6000ada_pcie_cx7_asus_esc8000a.txt", models)


def mixed_models(directory: Path) -> SimNode:
    """3 GPUs of two models where CUDA's default order differs from PCI order: NVML's GPU 0 is the
    slow board, so CUDA's device 0 (fastest first) is NVML's GPU 1."""
    models = [
        ("NVIDIA RTX A4000", 8.6, 48),
        ("NVIDIA RTX A6000", 8.6, 84),
        ("NVIDIA RTX A4000", 8.6, 48),
    ]
    return node_file(directory, "mixd", "topo_3x_rtxa6000_nv4_bridge_pair.txt", models)
