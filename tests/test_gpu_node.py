"""The runner and launcher on simulated GPU nodes (tests/gpu_node.py): the real readiness decision,
spec builder, launcher and rank processes (on gloo), with what each rank would have been given on
the GPU node recorded and asserted: which GPU CUDA would open, what is skipped and why, and how
fast ranks are gone once a job appears."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netmon import baseline
from netmon.config import NetmonConfig, parse_config, resolve
from netmon.gpu.linkhealth import LinkHealth
from netmon.serve.current import CurrentConfig
from netmon.serve.readiness import DeviceLocks, Readiness
from netmon.serve.results import Results
from netmon.serve.runner import ProbeRunner
from tests.conftest import live_processes, wait_for
from tests.gpu_node import SimNode, SimulatedLauncher, dgx_h100, mixed_models, pcie_workstation

# Long enough on gloo that a job can arrive mid-measure; cheap to start.
LONG = {"sizes": ["16M"], "iters": 400, "warmup": 1, "timeout": "60s"}


def config_for(tmp_path: Path, devices: list[str], probes: list[dict[str, Any]]) -> NetmonConfig:
    document = {
        "backend": "nccl",
        "devices": devices,
        "state_dir": str(tmp_path / "state"),
        "pause_file": str(tmp_path / "pause"),
        "probes": probes,
        "idle": {"samples": 1, "sample_interval": 0},
    }
    return resolve(parse_config(document), gpus=len(devices))


@pytest.fixture
def recorded() -> Iterator[list[dict[str, Any]]]:
    SimulatedLauncher.reset(None)
    yield SimulatedLauncher.given
    SimulatedLauncher.reset(None)


def runner_on(
    node: SimNode, config: NetmonConfig, monkeypatch: pytest.MonkeyPatch
) -> tuple[ProbeRunner, Results, Readiness]:
    SimulatedLauncher.node = node
    monkeypatch.setattr("netmon.probe.pairs.Launcher", SimulatedLauncher)
    current = CurrentConfig(config)
    results = Results(current, baseline.BaselineBook(config.baseline), None)
    readiness = Readiness(current, DeviceLocks(), node, threading.Event())
    runner = ProbeRunner(current, results, readiness, launcher=SimulatedLauncher)
    runner.topology = node.topology
    return runner, results, readiness


def test_on_a_mixed_node_each_rank_opens_the_gpu_that_was_found_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: list[dict[str, Any]]
) -> None:
    node = mixed_models()
    # CUDA's default order puts the A100 (NVML GPU 1) first: an index alone would land there.
    assert node.cuda_device({"CUDA_VISIBLE_DEVICES": "0"}).index == 1
    config = config_for(tmp_path, ["0", "2"], [{"name": "small", "sizes": [8], "iters": 2}])
    runner, results, _ = runner_on(node, config, monkeypatch)
    runner.run("small")
    assert results.snapshot().probes["small"].failures == {}
    assert {g["rank"]: g["gpu"].index for g in recorded} == {0: 0, 1: 2}
    for given in recorded:
        assert given["env"]["CUDA_VISIBLE_DEVICES"] == given["gpu"].uuid
        assert given["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_without_uuids_an_index_still_names_the_gpu_in_pci_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: list[dict[str, Any]]
) -> None:
    node = mixed_models()
    # A topology from a `topo -m` file has no UUIDs: the index must then count in PCI order.
    node.topology = dataclasses.replace(
        node.topology, gpus=tuple(dataclasses.replace(g, uuid=None) for g in node.topology.gpus)
    )
    config = config_for(tmp_path, ["0"], [{"name": "small", "sizes": [8], "iters": 2, "ranks": 1}])
    runner, _, _ = runner_on(node, config, monkeypatch)
    runner.run("small")
    (given,) = recorded
    assert given["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert given["gpu"].index == 0 and given["gpu"].model == "NVIDIA RTX A4000"


def test_pair_probes_on_a_mixed_node_are_labelled_by_the_gpus_they_ran_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: list[dict[str, Any]]
) -> None:
    node = mixed_models()
    probe = {"name": "pairs", "kind": "pairs", "sizes": [8], "iters": 2}
    config = config_for(tmp_path, ["0", "1", "2"], [probe])
    runner, results, _ = runner_on(node, config, monkeypatch)
    runner.run("pairs")
    assert len(recorded) == 6  # 3 pairs x 2 ranks
    for given in recorded:
        assert str(given["gpu"].index) == given["devices"][given["rank"]]
    labelled = {(p.gpu, p.peer_gpu, p.path) for p in results.snapshot().links}
    assert labelled == {(0, 1, "NV4"), (0, 2, "NODE"), (1, 2, "NODE")}


def test_mig_on_one_gpu_skips_the_probe_and_starts_no_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: list[dict[str, Any]]
) -> None:
    node = dgx_h100(mig=[6])
    config = config_for(tmp_path, [str(i) for i in range(8)], [{"name": "small", "sizes": [8]}])
    runner, results, _ = runner_on(node, config, monkeypatch)
    runner.run("small")
    assert recorded == []
    assert results.snapshot().probes["small"].skips == {"gpu_mig": 1}


def job_at_measure(node: SimNode, gpu: int, when: dict[str, float]) -> None:
    """A job starts on `gpu` as soon as a rank starts measuring."""

    def watch(kind: str, fields: dict[str, Any]) -> None:
        if kind == "phase" and fields.get("phase") == "measure" and "job" not in when:
            when["job"] = time.monotonic()
            node.job_appears(gpu)

    SimulatedLauncher.watch = watch


def test_a_job_stops_the_probe_and_no_later_path_starts_on_its_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: list[dict[str, Any]]
) -> None:
    node = dgx_h100()
    probe = {"name": "paths", "paths": ["default", "pcie"], **LONG}
    config = config_for(tmp_path, ["2", "3"], [probe])
    runner, results, readiness = runner_on(node, config, monkeypatch)
    when: dict[str, float] = {}
    job_at_measure(node, 3, when)
    runner.run("paths")
    gone = time.monotonic()
    stats = results.snapshot().probes["paths"]
    assert stats.failures == {"preempted": 1}
    assert stats.runs == 1  # the pcie path never started on the job's GPU
    assert {g["path"] for g in recorded} == {"default"}
    # Found within one NVML look (1 s by default) and the ranks killed and reaped.
    assert live_processes(SimulatedLauncher.pids_seen) == []
    assert gone - when["job"] < 3.0, gone - when["job"]
    assert readiness.preempted() == {"3": "process 424242"}

    # While the job runs, GPU 3 stays off limits: the next run is skipped by the full idle check.
    SimulatedLauncher.watch = None
    runner.run("paths")
    assert results.snapshot().probes["paths"].skips == {"gpu_busy_process": 1}
    assert {g["path"] for g in recorded} == {"default"}
    # Once the job has left, the full idle check clears the GPU and probing resumes.
    node.job_leaves(3)
    runner.current.publish(config_for(tmp_path, ["2", "3"], [{"name": "paths", "sizes": [8]}]))
    runner.run("paths")
    assert readiness.preempted() == {}
    assert results.snapshot().probes["paths"].runs == 2


def test_a_job_on_one_gpu_stops_every_pair_in_flight_at_its_next_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: list[dict[str, Any]]
) -> None:
    node = dgx_h100()
    probe = {"name": "pairs", "kind": "pairs", **LONG}
    runner, results, readiness = runner_on(
        node, config_for(tmp_path, ["0", "1", "2", "3"], [probe]), monkeypatch
    )
    when: dict[str, float] = {}
    job_at_measure(node, 1, when)
    runner.run("pairs")
    # Round 1 runs two pairs at once on GPUs; each launcher polls its abort check every 50 ms,
    # and NVML is read at most once a second: the job found by one check stops the other too at
    # its next poll, not a second later.
    stops = sorted(at for _, at in SimulatedLauncher.stopped_at)
    assert len(stops) == 2, SimulatedLauncher.stopped_at
    assert stops[1] - stops[0] < 0.5, stops
    assert len({tuple(g["devices"]) for g in recorded}) == 2  # no later round started
    assert results.snapshot().probes["pairs"].failures.get("preempted") == 2
    assert "1" in readiness.preempted()
    assert live_processes(SimulatedLauncher.pids_seen) == []


def test_a_gpu_given_to_a_pod_mid_probe_stops_it_before_the_pods_process_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: list[dict[str, Any]]
) -> None:
    node = dgx_h100()
    config = config_for(tmp_path, ["4", "5"], [{"name": "long", **LONG}])
    runner, results, readiness = runner_on(node, config, monkeypatch)

    def watch(kind: str, fields: dict[str, Any]) -> None:
        if kind == "phase" and fields.get("phase") == "measure":
            node.pod_given(5, "jobs/train-0")

    SimulatedLauncher.watch = watch
    runner.run("long")
    assert results.snapshot().probes["long"].failures == {"preempted": 1}
    assert readiness.preempted() == {
        "5": "given to pod jobs/train-0 (container main, nvidia.com/gpu)"
    }


class SlowReader:
    """NVML link health as read_link_health returns it, taking `seconds` to answer."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls: list[bool] = []

    def __call__(self, under_load: bool) -> LinkHealth:
        self.calls.append(under_load)
        time.sleep(self.seconds)
        return LinkHealth(pcie=(), nvlinks=(), throughput=(), under_load=under_load, read_at=0.0)


@pytest.mark.parametrize(
    ("path", "sizes", "iters", "read_s", "called", "published"),
    [
        # The default path rides NVLink: never a PCIe reading under load.
        ("default", ["8"], 2, 0.0, [False], False),
        # The pcie path, read while its largest size is measured: under load.
        ("pcie", ["8", "16M"], 60, 0.0, [True], True),
        # Traffic over before the reading came back: taken as an idle reading.
        ("pcie", ["8"], 2, 3.0, [True], False),
    ],
)
def test_pcie_is_judged_under_load_only_during_pcie_path_traffic(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    recorded: list[dict[str, Any]],
    path: str,
    sizes: list[str],
    iters: int,
    read_s: float,
    called: list[bool],
    published: bool,
) -> None:
    probe = {"name": "p", "paths": [path], "sizes": sizes, "iters": iters, "warmup": 1, "batch": 1}
    runner, results, _ = runner_on(
        dgx_h100(), config_for(tmp_path, ["0", "1"], [probe]), monkeypatch
    )
    reader = SlowReader(read_s)
    runner.link_health_reader = reader
    runner.run("p")
    health = wait_for(lambda: results.snapshot().link_health, 10, "the link health reading")
    assert reader.calls == called
    assert health.under_load is published


@pytest.mark.parametrize(
    ("node", "ran", "skipped"),
    [
        # NVSwitch fabric registered: every variant of all_reduce runs, nvls included.
        (dgx_h100, ["default", "tree", "nvls"], {}),
        # PCIe boards are in no NVLink fabric: nvls is skipped with its reason, the rest runs.
        (pcie_workstation, ["default", "tree"], {"path_unsupported": 1}),
    ],
)
def test_nvls_runs_only_where_the_fabric_has_nvswitch_multicast(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    recorded: list[dict[str, Any]],
    node: Any,
    ran: list[str],
    skipped: dict[str, int],
) -> None:
    sim = node()
    probe = {"name": "algos", "sizes": [8], "iters": 2, "paths": ["default", "tree", "nvls"]}
    runner, results, _ = runner_on(sim, config_for(tmp_path, ["0", "1"], [probe]), monkeypatch)
    runner.fabric = sim.fabric()
    runner.run("algos")
    assert [g["path"] for g in recorded if g["rank"] == 0] == ran
    assert results.snapshot().probes["algos"].skips == skipped
    for given in recorded:
        env = given["env"]
        # One collective's algorithm forced, NCCL's own multicast check left in force.
        assert env.get("NCCL_NVLS_ENABLE") != "1"
        if given["path"] == "nvls":
            assert env["NCCL_ALGO"] == "AllReduce:NVLS"
        if given["path"] == "tree":
            assert env["NCCL_ALGO"] == "AllReduce:Tree"
