"""The runner and launcher on simulated GPU nodes (tests/gpu_node.py): the real readiness decision,
spec builder, launcher and rank processes (on gloo), with what each rank would have been given on
the GPU node recorded and asserted: which GPU CUDA would open, what is skipped and why, and how
fast ranks are gone once a job appears."""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netmon import baseline
from netmon.config import LinkTelemetryConfig, NetmonConfig, parse_config, resolve
from netmon.exposition.collector import SnapshotPage
from netmon.gpu.linkhealth import LinkHealth
from netmon.probe.processes import children_of
from netmon.serve.current import CurrentConfig
from netmon.serve.daemon import Daemon
from netmon.serve.readiness import DeviceLocks, Readiness
from netmon.serve.results import Results
from netmon.serve.runner import ProbeRunner
from tests.conftest import live_processes, wait_for
from tests.gpu_node import (
    FIXTURES,
    SimNode,
    SimulatedLauncher,
    dgx_h100,
    mixed_models,
    pcie_workstation,
)

# Long enough on gloo that a job can arrive mid-measure; cheap to start.
LONG = {"sizes": ["16M"], "iters": 400, "warmup": 1, "timeout": "60s"}


def config_for(tmp_path: Path, devices: list[str], probes: list[dict[str, Any]]) -> NetmonConfig:
    document = {
        "backend": "nccl",
        "devices": devices,
        "state_dir": str(tmp_path / "state"),
        "pause_file": str(tmp_path / "pause"),
        "pause_dir": str(tmp_path / "pause.d"),
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
    readiness = Readiness(current, DeviceLocks(), node, threading.Event(), node.topology)
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


def test_a_job_on_one_gpu_stops_its_pair_alone_and_the_idle_pairs_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: list[dict[str, Any]]
) -> None:
    node = dgx_h100()
    # Pairs that measure for about a second, and NVML looked at every 0.1 s: the job is found
    # while the pair on its GPU still measures, and the pairs that go on are soon done.
    probe = {"name": "pairs", "kind": "pairs", "sizes": ["4M"], "iters": 100, "warmup": 1}
    runner, results, readiness = runner_on(
        node, config_for(tmp_path, ["0", "1", "2", "3"], [probe]), monkeypatch
    )
    readiness.foreign_check_s = 0.1
    when: dict[str, float] = {}
    job_at_measure(node, 1, when)
    runner.run("pairs")
    # Round 1 runs two pairs at once; the job on GPU 1 stops the pair on it at its next NVML
    # look, and only that one: each pair holds and watches its own two GPUs.
    stopped = [label for label, _ in SimulatedLauncher.stopped_at]
    assert len(stopped) == 1 and "1" in stopped[0].split(","), stopped
    snapshot = results.snapshot()
    assert snapshot.probes["pairs"].failures.get("preempted") == 1
    # Every pair without GPU 1 was measured; the two later pairs with it were skipped, and no
    # rank was handed GPU 1 after the job appeared.
    assert {(p.gpu, p.peer_gpu) for p in snapshot.links} == {(0, 2), (0, 3), (2, 3)}
    assert snapshot.pair_skips[("pairs", "gpu_busy_process")] == 2
    on_gpu_1 = [g for g in recorded if g["gpu"].index == 1]
    assert len(on_gpu_1) == 1, on_gpu_1  # the pair that was running when the job came
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


# ---- shared nodes: probing whatever is idle ----

QUICK = {"sizes": [8], "iters": 2, "warmup": 1}
EIGHT = [str(i) for i in range(8)]


def dgx_with_jobs(*gpus: int) -> SimNode:
    """A DGX H100 with a job (its own PID) on each of `gpus`."""
    node = dgx_h100()
    for gpu in gpus:
        node.job_appears(gpu, pid=5000 + gpu)
    return node


def test_three_of_eight_gpus_busy_the_ten_idle_pairs_are_probed_and_the_rest_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: list[dict[str, Any]]
) -> None:
    node = dgx_with_jobs(2, 5, 7)
    config = config_for(tmp_path, EIGHT, [{"name": "pairs", "kind": "pairs", **QUICK}])
    runner, results, _ = runner_on(node, config, monkeypatch)
    runner.run("pairs")
    snapshot = results.snapshot()
    idle = [0, 1, 3, 4, 6]
    measured = {(p.gpu, p.peer_gpu) for p in snapshot.links}
    assert measured == {(a, b) for a in idle for b in idle if a < b}
    assert len(measured) == 10
    # The other 18 pairs are skipped with the reason of their busy GPU, and counted.
    assert snapshot.pair_skips[("pairs", "gpu_busy_process")] == 18
    assert sum(snapshot.pair_skips.values()) == 18
    assert snapshot.probes["pairs"].skips == {}  # the probe itself ran
    # No rank was ever handed a busy GPU, and each opened exactly the GPU its pair names.
    assert len(recorded) == 20
    assert {g["gpu"].index for g in recorded} == set(idle)
    for given in recorded:
        assert str(given["gpu"].index) == given["devices"][given["rank"]]
        assert given["env"]["CUDA_VISIBLE_DEVICES"] == given["gpu"].uuid
    first = {(p.gpu, p.peer_gpu): p.measured_at for p in snapshot.links}

    # Later, jobs hold GPUs 0 and 1 too, and 5 is free: the three pairs of GPUs 3, 4 and 6 are
    # measured again; the pairs of 0 and 1 keep their result and the time it was taken.
    node.job_appears(0)
    node.job_appears(1)
    node.job_leaves(5)
    runner.run("pairs")
    again = {(p.gpu, p.peer_gpu): p.measured_at for p in results.snapshot().links}
    assert set(again) == set(first) | {(3, 5), (4, 5), (5, 6)}
    fresh = {pair for pair in again if again[pair] > max(first.values())}
    assert fresh == {(3, 4), (3, 6), (4, 6), (3, 5), (4, 5), (5, 6)}
    assert all(again[pair] == first[pair] for pair in set(first) - fresh)
    exposed = render(results)
    assert (
        'netmon_link_measurement_timestamp_seconds{gpu="0",path="NV18",peer_gpu="1",probe="pairs"}'
        in exposed
    )
    assert 'netmon_pair_skips_total{probe="pairs",reason="gpu_busy_process"} 40.0' in exposed


def render(results: Results) -> str:
    return SnapshotPage(results.snapshot)().decode()


def test_a_collective_on_the_idle_set_runs_on_five_then_four_after_a_job_takes_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: list[dict[str, Any]]
) -> None:
    node = dgx_with_jobs(1, 3, 6)
    probe = {"name": "idle", "gpus": "idle", "min_gpus": 4, **QUICK}
    config = config_for(tmp_path, EIGHT, [probe])
    runner, results, readiness = runner_on(node, config, monkeypatch)
    runner.run("idle")
    snapshot = results.snapshot()
    assert snapshot.probes["idle"].failures == {}
    assert {p.ranks for p in snapshot.series} == {5}
    assert sorted(g["gpu"].index for g in recorded) == [0, 2, 4, 5, 7]
    assert 'ranks="5"' in render(results)

    # A job arrives on GPU 4 while the next run measures: that run stops, GPU 4 stays off
    # limits, and the run after it takes the 4 GPUs left, with its own series and baseline.
    recorded.clear()
    runner.current.publish(config_for(tmp_path, EIGHT, [{**probe, **LONG}]))
    job_at_measure(node, 4, {})
    runner.run("idle")
    assert results.snapshot().probes["idle"].failures == {"preempted": 1}
    assert "4" in readiness.preempted()
    assert live_processes(SimulatedLauncher.pids_seen) == []
    SimulatedLauncher.watch = None
    recorded.clear()
    runner.current.publish(config)
    runner.run("idle")
    snapshot = results.snapshot()
    assert sorted(g["gpu"].index for g in recorded) == [0, 2, 5, 7]
    assert {p.ranks for p in snapshot.series} == {4, 5}
    assert {key[4] for key in results._book.verdicts()} == {4, 5}

    # One more job leaves 3 idle, under min_gpus: skipped with the busy GPUs' reason, no rank.
    recorded.clear()
    node.job_appears(0)
    runner.run("idle")
    assert recorded == []
    assert results.snapshot().probes["idle"].skips == {"gpu_busy_process": 1}


def test_group_one_gpu_offers_an_idle_gpu_not_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from netmon.serve.readiness import Survey

    node = dgx_h100()
    node.job_appears(0)
    node.job_appears(1)
    config = config_for(tmp_path, [str(i) for i in range(8)], [])
    _, _, readiness = runner_on(node, config, monkeypatch)
    survey = readiness.survey(config.devices or ())
    assert isinstance(survey, Survey)
    assert survey.idle[0] == "2"
    assert survey.busy == {"0": "gpu_busy_process", "1": "gpu_busy_process"}


def test_a_slurm_job_pauses_its_own_gpus_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: list[dict[str, Any]]
) -> None:
    node = dgx_h100()
    pause_dir = tmp_path / "pause.d"
    pause_dir.mkdir()
    # A prolog names the job's GPUs, by index or UUID; a comment is fine.
    (pause_dir / "job-17").write_text(f"0, {node.board(1).uuid}  # job 17\n3\n")
    document = {"name": "pairs", "kind": "pairs", **QUICK}
    config = config_for(tmp_path, ["0", "1", "2", "3"], [document])
    config = config.model_copy(update={"pause_dir": pause_dir})
    runner, results, readiness = runner_on(node, config, monkeypatch)
    survey = readiness.survey(["0", "1", "2", "3"])
    assert survey.busy == {"0": "paused", "1": "paused", "3": "paused"}
    runner.run("pairs")  # one idle GPU: no pair
    assert recorded == []
    assert results.snapshot().probes["pairs"].skips == {"paused": 1}
    assert results.snapshot().pair_skips[("pairs", "paused")] == 6
    # An empty file pauses the whole node, as the pause file does.
    (pause_dir / "job-17").unlink()
    (pause_dir / "job-18").write_text("")
    assert readiness.survey(["2"]).blocked is not None
    (pause_dir / "job-18").unlink()
    assert readiness.survey(["0", "1", "2", "3"]).busy == {}


def test_link_counters_keep_updating_while_every_gpu_is_busy_with_no_rank_started(
    tmp_path: Path,
) -> None:
    node = dgx_with_jobs(*range(8))
    probes = [{"name": "small", "sizes": [8], "interval": "1s"}]
    config = config_for(tmp_path, [str(i) for i in range(8)], probes).model_copy(
        update={
            "listen": "127.0.0.1:0",
            "topology_file": FIXTURES / "topo_8xH100_sxm_nv18_nonic_mlengineering.txt",
            "link_telemetry": LinkTelemetryConfig(interval=0.2),
        }
    )
    daemon = Daemon(config, idle_source=node, link_reader=node.link_health)
    seen: set[float] = set()
    children: list[int] = []

    def replays() -> float | None:
        children.extend(children_of(os.getpid()))
        text = SnapshotPage(daemon.results.snapshot)().decode()
        found = re.search(r'netmon_nvlink_gpu_errors_total\{error="replay",gpu="3"\} (\S+)', text)
        if found:
            seen.add(float(found.group(1)))
        return len(seen) >= 3 or None

    daemon.start()
    try:
        wait_for(replays, 15.0, "three different replay counts while every GPU is busy")
        wait_for(
            lambda: (
                daemon.results.snapshot().probes["small"].skips.get("gpu_busy_process", 0) >= 2
                or None
            ),
            15.0,
            "probes skipped for the jobs",
        )
    finally:
        daemon.stop()
    snapshot = daemon.results.snapshot()
    assert snapshot.probes["small"].runs == 0
    assert children == []  # no rank process was ever started
    assert snapshot.link_health is not None and not snapshot.link_health.under_load
    text = SnapshotPage(daemon.results.snapshot)().decode()
    assert 'netmon_nvlink_active_links{gpu="7"} 18.0' in text
    assert "netmon_link_health_interval_seconds 0.2" in text
    # Idle links at Gen1 of Gen5 are power saving, not downtraining: not judged without load.
    assert 'reason="generation"' not in text
    assert 'netmon_pcie_link_downtrained{gpu="0",reason="width"} 0.0' in text
