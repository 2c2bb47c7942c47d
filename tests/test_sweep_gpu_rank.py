"""A sweep rank on GPUs, set up as a site runs NCCL between nodes: its GPU's CPUs, the HCA
nearest its GPU, the transport its NCCL log shows (netmon.sweep.ranks.gpu); and the pair's srun
as a GPU pair gets it. Rehearsed on a simulated DGX H100 with a sysfs tree laid out like a
real one's: the GPU path needs hardware this machine does not have."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from netmon.sweep.locate.plan import PairPlan
from netmon.sweep.ranks import gpu as gpu_rank
from netmon.sweep.ranks.rank import PREFIX
from netmon.sweep.settings import SweepConfig
from netmon.sweep.slurm import srun_result
from netmon.sweep.slurm.scheduler import SlurmScheduler
from tests.gpu_node import dgx_h100

# What NCCL writes (src/transport/net_ib: "NET/IB : Using%s %s; OOB %s:%s", each device as
# " [%d]%s:%d/%s"), and a connection line as tests/fixtures' NCCL issue 687 log shows them.
USING = "n1:1:2 [0] NCCL INFO NET/IB : Using [0]{dev}:1/IB [RO]; OOB ib0:10.0.0.1<0>\n"
VIA = "n1:1:2 [0] NCCL INFO Channel 00/0 : 0[18000] -> 1[18000] [send] via {via}\n"


def _pci(sys_root: Path, root: str, chain: list[str], name: str | None = None) -> Path:
    """A PCI device under a root port, with its bus/pci/devices link (and an IB device)."""
    device = sys_root / "devices" / root
    for hop in chain:
        device /= hop
    device.mkdir(parents=True, exist_ok=True)
    link = sys_root / "bus" / "pci" / "devices" / chain[-1]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(device)
    if name is not None:
        ib = sys_root / "class" / "infiniband" / name
        ib.mkdir(parents=True)
        (ib / "device").symlink_to(device)
    return device


def _dgx_sysfs(sys_root: Path) -> None:
    """GPU0 (18:00.0) and mlx5_0 behind one PCIe switch; GPU5 (68:00.0) and mlx5_5 behind
    another on the far socket; mlx5_1 beside the first switch, not behind it."""
    _pci(sys_root, "pci0000:00", ["0000:00:01.0", "0000:16:00.0", "0000:18:00.0"])
    _pci(sys_root, "pci0000:00", ["0000:00:01.0", "0000:16:00.0", "0000:17:00.0"], "mlx5_0")
    _pci(sys_root, "pci0000:00", ["0000:00:03.0", "0000:30:00.0"], "mlx5_1")
    _pci(sys_root, "pci0000:a0", ["0000:a0:01.0", "0000:66:00.0", "0000:68:00.0"])
    _pci(sys_root, "pci0000:a0", ["0000:a0:01.0", "0000:66:00.0", "0000:6a:00.0"], "mlx5_5")


def test_the_hca_nearest_a_gpu_shares_its_pci_switch(tmp_path: Path) -> None:
    _dgx_sysfs(tmp_path)
    assert gpu_rank.nearest_hca(tmp_path, "00000000:18:00.0") == "mlx5_0"
    assert gpu_rank.nearest_hca(tmp_path, "00000000:68:00.0") == "mlx5_5"
    assert gpu_rank.nearest_hca(tmp_path, "00000000:C1:00.0") is None  # not in sysfs
    assert gpu_rank.nearest_hca(tmp_path / "empty", "00000000:18:00.0") is None


def test_cpu_lists_and_the_sites_own_hca() -> None:
    assert gpu_rank.cpu_set("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}
    assert gpu_rank.cpu_set(None) == set() and gpu_rank.cpu_set("N/A") == set()
    assert gpu_rank.site_hca({"NCCL_IB_HCA": "=mlx5_2:1"}) == "mlx5_2"
    assert gpu_rank.site_hca({"NCCL_IB_HCA": "mlx5"}) is None  # a prefix: any mlx5 device
    assert gpu_rank.site_hca({"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}) is None
    assert gpu_rank.site_hca({}) is None


def test_the_log_must_show_infiniband_on_the_rails_hca() -> None:
    ib = USING.format(dev="mlx5_0") + VIA.format(via="NET/IB/0/GDRDMA")
    assert gpu_rank.ib_devices(ib) == ["mlx5_0"]
    assert gpu_rank.transport_faults(ib, "mlx5_0") == []
    assert gpu_rank.transport_faults(ib, "mlx5_3") == ["wrong_hca"]
    socket = VIA.format(via="NET/Socket/0")
    assert gpu_rank.transport_faults(socket, "mlx5_0") == ["socket_where_ib_expected"]
    assert gpu_rank.transport_faults("", "mlx5_0") == []  # nothing known: nothing judged


def test_a_rail_over_the_wrong_network_makes_the_pair_transport_mismatch() -> None:
    line = '{"rail": 1, "busbw": 4e9, "started_at": 1, "hca": "mlx5_1", '
    good = PREFIX + '{"rail": 0, "busbw": 4e10, "started_at": 1, "transport_faults": []}'
    bad = PREFIX + line + '"transport_faults": ["socket_where_ib_expected"]}'
    found = srun_result.parse(f"{good}\n{bad}\n", 2)
    assert found.busbw == (4e10, 4e9)
    outcome, detail = srun_result.classify(0, "COMPLETED", "", found)
    assert outcome == "transport_mismatch"
    assert detail == "rail 1 (mlx5_1): socket_where_ib_expected"


def test_a_rank_on_a_simulated_dgx_binds_to_its_gpus_cpus_and_hca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a DGX's 208 CPUs (the affinity calls stand in for the kernel's: this machine has
    two), GPU0's rank runs on 0-51,104-155 and GPU5's on the other socket's."""
    dgx_h100(tmp_path).activate(monkeypatch)
    sys_root = tmp_path / "sys"
    _dgx_sysfs(sys_root)
    affinity = {"cpus": set(range(208))}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(affinity["cpus"]))
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: affinity.update(cpus=set(cpus)))
    log = str(tmp_path / "nccl.log")
    binding, added = gpu_rank.prepare({"NETMON_SYSFS": str(sys_root)}, 0, log)
    assert set(binding.cpus) == gpu_rank.cpu_set("0-51,104-155")
    assert binding.hca == "mlx5_0"
    assert added["NCCL_IB_HCA"] == "=mlx5_0"
    assert added["NCCL_DEBUG"] == "INFO" and added["NCCL_DEBUG_FILE"] == log
    affinity["cpus"] = set(range(208))
    binding, added = gpu_rank.prepare({"NETMON_SYSFS": str(sys_root)}, 5, log)
    assert set(binding.cpus) == gpu_rank.cpu_set("52-103,156-207")
    assert added["NCCL_IB_HCA"] == "=mlx5_5"
    # The site's own NCCL_IB_HCA and NCCL_DEBUG stand; srun's CPUs bound the binding.
    affinity["cpus"] = {0, 1, 2, 60}
    site = {"NETMON_SYSFS": str(sys_root), "NCCL_IB_HCA": "=mlx5_9", "NCCL_DEBUG": "WARN"}
    binding, added = gpu_rank.prepare(site, 5, log)
    assert binding.hca == "mlx5_9" and added == {} and binding.cpus == (60,)


def test_a_gpu_pairs_srun_gets_cores_per_rank_and_a_bandwidth_bound_size(tmp_path: Path) -> None:
    srun = tmp_path / "srun"
    srun.write_text('#!/bin/sh\necho "$NETMON_SWEEP_SIZE $NETMON_SWEEP_ITERS $*"\n')
    srun.chmod(0o755)
    environ = {"PATH": f"{tmp_path}:{os.environ['PATH']}"}
    scheduler = SlurmScheduler(SweepConfig(), "s", "sweep", environ=environ)
    scheduler.gpus |= {"g1": 8, "g2": 8, "c1": 0, "c2": 0}
    scheduler.cpus |= {"g1": 224, "g2": 192, "c1": 2, "c2": 2}
    hard = time.time() + 3600
    gpu = scheduler._launch(PairPlan(("g1", "g2"), 1, 8), 0, hard)
    cpu = scheduler._launch(PairPlan(("c1", "c2"), 1, 1), 1, hard)
    assert gpu.process.wait(10) == 0 and cpu.process.wait(10) == 0
    size, iters, argv = gpu.text()[0].split(" ", 2)
    assert (int(size), int(iters)) == (1 << 30, 20)
    assert "--cpus-per-task=24" in argv.split() and "--gpus-per-node=8" in argv.split()
    size, iters, argv = cpu.text()[0].split(" ", 2)
    assert (int(size), int(iters)) == (16 << 20, 10)
    assert not any(a.startswith(("--cpus-per-task", "--gpus")) for a in argv.split())
