"""The runner, launcher and rank zygote on simulated GPU nodes (`--simulate`, netmon.sim;
tests/gpu_node.py writes the node files): the real readiness decision, NVML readers, spec builder,
launcher, zygote and rank processes. Each rank registers on the GPU CUDA would open for it, and
NVML lists it there as it would on the node; what each rank was given is read back from the
node's journal and asserted: which GPU CUDA would open, what is skipped and why, and how fast
ranks are gone once a job appears."""

from __future__ import annotations

import dataclasses
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from netmon import baseline
from netmon.config import LinkTelemetryConfig, NetmonConfig, parse_config, resolve
from netmon.exposition.collector import SnapshotPage
from netmon.gpu.idle_policy import IdlePolicy
from netmon.gpu.linkhealth import LinkHealth
from netmon.gpu.nvml import NvmlSource
from netmon.gpu.nvml_links import read_link_health
from netmon.probe.forking import Zygote
from netmon.probe.starting import base_env
from netmon.serve.current import CurrentConfig
from netmon.serve.daemon import Daemon
from netmon.serve.keeper import BaselineKeeper
from netmon.serve.readiness import DeviceLocks, Readiness
from netmon.serve.results import Results
from netmon.serve.runner import ProbeRunner
from tests.conftest import live_processes, wait_for
from tests.gpu_node import SimNode, dgx_h100, mixed_models, pcie_workstation, shipped_node

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


def skipped_daemon(
    tmp_path: Path, devices: list[str], probe: dict[str, Any], reason: str, count: int = 3
) -> Daemon:
    """A daemon on the active simulated node, run until `probe` has been skipped `count` times
    as `reason`, then stopped: what it counted is in its results."""
    config = config_for(tmp_path, devices, [probe]).model_copy(update={"listen": "127.0.0.1:0"})
    daemon = Daemon(config)
    daemon.start()
    name = probe["name"]
    try:
        wait_for(
            lambda: daemon.results.snapshot().probes[name].skips.get(reason, 0) >= count or None,
            60,
            f"{count} runs of {name} skipped as {reason}",
        )
    finally:
        daemon.stop()
    return daemon


@dataclasses.dataclass
class OnNode:
    node: SimNode
    runner: ProbeRunner
    results: Results
    readiness: Readiness

    def opened(self) -> list[dict[str, Any]]:
        """Ranks that opened a GPU: pid, uuid, gpu (NVML index), env (CUDA_*, NCCL_*)."""
        return [{**o, "gpu": self.node.index_of(o["uuid"])} for o in self.node.opened()]


def runner_on(
    node: SimNode,
    config: NetmonConfig,
    monkeypatch: pytest.MonkeyPatch,
    zygotes: list[Zygote],
) -> OnNode:
    """The daemon's runner on `node`: NVML through netmon's reader of the simulated library,
    ranks forked by a real rank zygote."""
    node.activate(monkeypatch)
    current = CurrentConfig(config)
    results = Results(current, BaselineKeeper(baseline.BaselineBook(config.baseline)))
    readiness = Readiness(current, DeviceLocks(), NvmlSource(), threading.Event(), node.topology)
    runner = ProbeRunner(current, results, readiness)
    runner.topology = node.topology
    zygote = Zygote(sys.executable, base_env())
    zygotes.append(zygote)
    runner.zygote = zygote
    return OnNode(node, runner, results, readiness)


def job_when_ranks_run(node: SimNode, gpu: int, when: dict[str, Any], after: float = 0.5) -> None:
    """In the background: once ranks hold `gpu` (their CUDA context made) and have measured for
    `after` s, a job appears on it; `when` gets the moment, the ranks' PIDs and when they were
    all gone."""

    def watch() -> None:
        ranks = wait_for(lambda: node.ranks_on(gpu), 60, f"ranks on GPU {gpu}", poll=0.01)
        time.sleep(after)
        when["ranks"] = ranks
        when["job"] = time.monotonic()
        node.job_appears(gpu)
        when["gone"] = gone_at(ranks)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    when["thread"] = thread


def gone_at(pids: list[int], deadline: float = 10.0) -> float:
    """The moment none of `pids` exists any more."""
    wait_for(lambda: not live_processes(pids) or None, deadline, f"ranks {pids} gone", poll=0.005)
    return time.monotonic()


def test_on_a_mixed_node_each_rank_opens_the_gpu_that_was_found_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zygotes: list[Zygote]
) -> None:
    node = mixed_models(tmp_path)
    # CUDA's default order puts the A6000 (NVML GPU 1) first: an index alone would land there.
    assert node.sim.cuda_device({"CUDA_VISIBLE_DEVICES": "0"}).uuid == node.uuid(1)
    config = config_for(tmp_path, ["0", "2"], [{"name": "small", "sizes": [8], "iters": 2}])
    on = runner_on(node, config, monkeypatch, zygotes)
    on.runner.run("small")
    assert on.results.snapshot().probes["small"].failures == {}
    opened = on.opened()
    assert sorted(o["gpu"] for o in opened) == [0, 2]
    for given in opened:
        assert given["env"]["CUDA_VISIBLE_DEVICES"] == given["uuid"]
        assert given["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert on.results.snapshot().rank_starts == {"fork": 2, "spawn": 0}


def test_without_uuids_an_index_still_names_the_gpu_in_pci_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zygotes: list[Zygote]
) -> None:
    node = mixed_models(tmp_path)
    config = config_for(tmp_path, ["0"], [{"name": "small", "sizes": [8], "iters": 2, "ranks": 1}])
    on = runner_on(node, config, monkeypatch, zygotes)
    # A topology from a `topo -m` file has no UUIDs: the index must then count in PCI order.
    on.runner.topology = dataclasses.replace(
        node.topology, gpus=tuple(dataclasses.replace(g, uuid=None) for g in node.topology.gpus)
    )
    on.runner.run("small")
    (given,) = on.opened()
    assert given["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert given["gpu"] == 0  # the A4000, not CUDA's fastest board


def test_pair_probes_on_a_mixed_node_are_labelled_by_the_gpus_they_ran_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zygotes: list[Zygote]
) -> None:
    node = mixed_models(tmp_path)
    probe = {"name": "pairs", "kind": "pairs", "sizes": [8], "iters": 2}
    on = runner_on(node, config_for(tmp_path, ["0", "1", "2"], [probe]), monkeypatch, zygotes)
    on.runner.run("pairs")
    opened = on.opened()
    assert len(opened) == 6  # 3 pairs x 2 ranks
    assert sorted(o["gpu"] for o in opened) == [0, 0, 1, 1, 2, 2]
    labelled = {(p.gpu, p.peer_gpu, p.path) for p in on.results.snapshot().links}
    assert labelled == {(0, 1, "NV4"), (0, 2, "NODE"), (1, 2, "NODE")}
    assert on.results.snapshot().probes["pairs"].failures == {}


def test_mig_on_one_gpu_skips_the_probe_and_starts_no_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zygotes: list[Zygote]
) -> None:
    node = dgx_h100(tmp_path, mig=[6])
    config = config_for(tmp_path, [str(i) for i in range(8)], [{"name": "small", "sizes": [8]}])
    on = runner_on(node, config, monkeypatch, zygotes)
    on.runner.run("small")
    assert on.opened() == []
    assert on.results.snapshot().probes["small"].skips == {"gpu_mig": 1}


def test_a_job_stops_the_probe_within_1_5_s_and_no_later_path_starts_on_its_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zygotes: list[Zygote]
) -> None:
    node = dgx_h100(tmp_path)
    probe = {"name": "paths", "paths": ["default", "pcie"], **LONG}
    config = config_for(tmp_path, ["2", "3"], [probe])
    on = runner_on(node, config, monkeypatch, zygotes)
    when: dict[str, Any] = {}
    job_when_ranks_run(node, 3, when)
    on.runner.run("paths")
    when["thread"].join(timeout=15)
    gone = when["gone"]
    stats = on.results.snapshot().probes["paths"]
    assert stats.failures == {"preempted": 1}
    assert stats.runs == 1  # the pcie path never started on the job's GPU
    assert {o["env"].get("NCCL_P2P_DISABLE") for o in on.opened()} == {None}
    # Found within one NVML look and the ranks killed and reaped: the ranks that held the GPU
    # (zygote-forked, so grandchildren of this process) were ours until then.
    assert gone - when["job"] < 1.5, gone - when["job"]
    assert on.readiness.preempted() == {"3": "process 424242"}

    # While the job runs, GPU 3 stays off limits: the next run is skipped by the full idle check.
    on.runner.run("paths")
    assert on.results.snapshot().probes["paths"].skips == {"gpu_busy_process": 1}
    assert len(on.opened()) == 2
    # Once the job has left, the full idle check clears the GPU and probing resumes.
    node.job_left(3)
    on.runner.current.publish(config_for(tmp_path, ["2", "3"], [{"name": "paths", "sizes": [8]}]))
    on.runner.run("paths")
    assert on.readiness.preempted() == {}
    assert on.results.snapshot().probes["paths"].runs == 2


def test_a_job_on_one_gpu_stops_its_pair_alone_and_the_idle_pairs_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zygotes: list[Zygote]
) -> None:
    node = dgx_h100(tmp_path)
    # Pairs that measure for a few seconds, and NVML looked at every 0.1 s: the job is found
    # while the pair on its GPU still measures.
    probe = {"name": "pairs", "kind": "pairs", "sizes": ["4M"], "iters": 100, "warmup": 1}
    on = runner_on(node, config_for(tmp_path, ["0", "1", "2", "3"], [probe]), monkeypatch, zygotes)
    on.readiness.foreign_check_s = 0.1
    when: dict[str, Any] = {}
    job_when_ranks_run(node, 1, when, after=0.3)
    on.runner.run("pairs")
    snapshot = on.results.snapshot()
    assert snapshot.probes["pairs"].failures.get("preempted") == 1
    # Every pair without GPU 1 was measured; the two later pairs with it were skipped, and no
    # rank opened GPU 1 after the job appeared.
    assert {(p.gpu, p.peer_gpu) for p in snapshot.links} == {(0, 2), (0, 3), (2, 3)}
    assert snapshot.pair_skips[("pairs", "gpu_busy_process")] == 2
    on_gpu_1 = [o for o in on.opened() if o["gpu"] == 1]
    assert len(on_gpu_1) == 1, on_gpu_1  # the pair that was running when the job came
    assert "1" in on.readiness.preempted()
    assert live_processes([o["pid"] for o in on.opened()]) == []


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
    zygotes: list[Zygote],
    path: str,
    sizes: list[str],
    iters: int,
    read_s: float,
    called: list[bool],
    published: bool,
) -> None:
    probe = {"name": "p", "paths": [path], "sizes": sizes, "iters": iters, "warmup": 1, "batch": 1}
    on = runner_on(
        dgx_h100(tmp_path), config_for(tmp_path, ["0", "1"], [probe]), monkeypatch, zygotes
    )
    reader = SlowReader(read_s)
    on.runner.link_health_reader = reader
    on.runner.run("p")
    health = wait_for(lambda: on.results.snapshot().link_health, 10, "the link health reading")
    assert reader.calls == called
    assert health.under_load is published


def test_a_pcie_path_probe_judges_the_generation_of_its_own_gpus_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zygotes: list[Zygote]
) -> None:
    """NVML read while the pcie path's largest size is measured: the two GPUs whose ranks carry
    the traffic read their trained generation (GPU 5's link came up at Gen3 of Gen5), the six
    others idle at Gen1 and are not judged on generation."""
    node = dgx_h100(tmp_path)
    node.document["gpus"][5]["pcie"].update(generation=3, max_generation=5)
    node.write()
    probe = {"name": "p", "paths": ["pcie"], "sizes": ["8", "4M"], "iters": 30, "warmup": 1}
    config = config_for(tmp_path, [node.uuid(2), "5"], [probe])
    on = runner_on(node, config, monkeypatch, zygotes)
    on.runner.link_health_reader = read_link_health  # NVML's reader, answered by the node
    on.runner.run("p")
    assert on.results.snapshot().probes["p"].failures == {}
    load = wait_for(lambda: on.results.snapshot().link_load, 10, "the reading under load")
    assert load.under_load and load.loaded == {2, 5}
    text = render(on.results)
    flagged = re.findall(
        r'netmon_pcie_link_downtrained\{gpu="(\d)",reason="generation"\} 1.0', text
    )
    assert flagged == ["5"]
    assert 'netmon_pcie_link_downtrained{gpu="2",reason="generation"} 0.0' in text
    assert 'gpu="0",reason="generation"' not in text  # idle at Gen1: no verdict at all


@pytest.mark.parametrize(
    ("make", "devices", "ran", "skipped"),
    [
        # NVSwitch fabric registered: every variant of all_reduce runs, nvls included.
        (dgx_h100, ["0", "1", "2"], ["default", "tree", "nvls"], {}),
        # NCCL before 2.28.7 turns NVLS off for 2 GPUs (and fails a forced NVLS from 2.24 on).
        (dgx_h100, ["0", "1"], ["default", "tree"], {"path_unsupported": 1}),
        # PCIe boards are in no NVLink fabric: nvls is skipped with its reason, the rest runs.
        (pcie_workstation, ["0", "1", "2"], ["default", "tree"], {"path_unsupported": 1}),
    ],
)
def test_nvls_runs_only_where_the_fabric_has_nvswitch_multicast(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    zygotes: list[Zygote],
    make: Any,
    devices: list[str],
    ran: list[str],
    skipped: dict[str, int],
) -> None:
    node = make(tmp_path)
    probe = {"name": "algos", "sizes": [8], "iters": 2, "paths": ["default", "tree", "nvls"]}
    on = runner_on(node, config_for(tmp_path, devices, [probe]), monkeypatch, zygotes)
    on.runner.fabric = node.fabric()
    on.runner.run("algos")
    assert on.results.snapshot().probes["algos"].skips == skipped
    first_ranks = [o for o in on.opened() if o["uuid"] == node.uuid(0)]
    algos = [o["env"].get("NCCL_ALGO") for o in first_ranks]
    expected = {"default": None, "tree": "AllReduce:Tree", "nvls": "AllReduce:NVLS"}
    assert algos == [expected[p] for p in ran]
    for given in on.opened():
        # One collective's algorithm forced, NCCL's own multicast check left in force.
        assert given["env"].get("NCCL_NVLS_ENABLE") != "1"


# ---- shared nodes: probing whatever is idle ----

QUICK = {"sizes": [8], "iters": 2, "warmup": 1}
EIGHT = [str(i) for i in range(8)]


def dgx_with_jobs(directory: Path, *gpus: int) -> SimNode:
    """A DGX H100 with a job (its own PID) on each of `gpus`."""
    node = dgx_h100(directory)
    for gpu in gpus:
        node.job_appears(gpu, pid=5000 + gpu)
    return node


def test_three_of_eight_gpus_busy_the_ten_idle_pairs_are_probed_and_the_rest_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zygotes: list[Zygote]
) -> None:
    node = dgx_with_jobs(tmp_path, 2, 5, 7)
    config = config_for(tmp_path, EIGHT, [{"name": "pairs", "kind": "pairs", **QUICK}])
    on = runner_on(node, config, monkeypatch, zygotes)
    # NVML looked at while every pair runs: each sees its own two ranks on its GPUs.
    on.readiness.foreign_check_s = 0.05
    on.runner.run("pairs")
    snapshot = on.results.snapshot()
    idle = [0, 1, 3, 4, 6]
    measured = {(p.gpu, p.peer_gpu) for p in snapshot.links}
    assert measured == {(a, b) for a in idle for b in idle if a < b}
    assert len(measured) == 10
    # The other 18 pairs are skipped with the reason of their busy GPU, and counted.
    assert snapshot.pair_skips[("pairs", "gpu_busy_process")] == 18
    assert sum(snapshot.pair_skips.values()) == 18
    assert snapshot.probes["pairs"].skips == {}  # the probe itself ran
    assert snapshot.probes["pairs"].failures == {}
    # No rank ever opened a busy GPU, and each opened the GPU by its UUID.
    opened = on.opened()
    assert len(opened) == 20
    assert {o["gpu"] for o in opened} == set(idle)
    assert all(o["env"]["CUDA_VISIBLE_DEVICES"] == o["uuid"] for o in opened)
    first = {(p.gpu, p.peer_gpu): p.measured_at for p in snapshot.links}

    # Later, jobs hold GPUs 0 and 1 too, and 5 is free: the three pairs of GPUs 3, 4 and 6 are
    # measured again; the pairs of 0 and 1 keep their result and the time it was taken.
    node.job_appears(0)
    node.job_appears(1)
    node.job_left(5)
    on.runner.run("pairs")
    again = {(p.gpu, p.peer_gpu): p.measured_at for p in on.results.snapshot().links}
    assert set(again) == set(first) | {(3, 5), (4, 5), (5, 6)}
    fresh = {pair for pair in again if again[pair] > max(first.values())}
    assert fresh == {(3, 4), (3, 6), (4, 6), (3, 5), (4, 5), (5, 6)}
    assert all(again[pair] == first[pair] for pair in set(first) - fresh)
    exposed = render(on.results)
    assert (
        'netmon_link_measurement_timestamp_seconds{gpu="0",path="NV18",peer_gpu="1",probe="pairs"}'
        in exposed
    )
    assert 'netmon_pair_skips_total{probe="pairs",reason="gpu_busy_process"} 40.0' in exposed


def render(results: Results) -> str:
    return SnapshotPage(results.snapshot)().decode()


def test_a_collective_on_the_idle_set_runs_on_five_then_four_after_a_job_takes_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zygotes: list[Zygote]
) -> None:
    node = dgx_with_jobs(tmp_path, 1, 3, 6)
    probe = {"name": "idle", "gpus": "idle", "min_gpus": 4, **QUICK}
    config = config_for(tmp_path, EIGHT, [probe])
    on = runner_on(node, config, monkeypatch, zygotes)
    on.runner.run("idle")
    snapshot = on.results.snapshot()
    assert snapshot.probes["idle"].failures == {}
    assert {p.ranks for p in snapshot.series} == {5}
    assert sorted(o["gpu"] for o in on.opened()) == [0, 2, 4, 5, 7]
    assert 'ranks="5"' in render(on.results)

    # A job arrives on GPU 4 while the next run measures: that run stops, GPU 4 stays off
    # limits, and the run after it takes the 4 GPUs left, with its own series and baseline.
    on.runner.current.publish(config_for(tmp_path, EIGHT, [{**probe, **LONG}]))
    when: dict[str, Any] = {}
    job_when_ranks_run(node, 4, when)
    on.runner.run("idle")
    when["thread"].join(timeout=15)
    gone = when["gone"]
    assert gone - when["job"] < 1.5, gone - when["job"]
    assert on.results.snapshot().probes["idle"].failures == {"preempted": 1}
    assert "4" in on.readiness.preempted()
    before = len(on.opened())
    on.runner.current.publish(config)
    on.runner.run("idle")
    snapshot = on.results.snapshot()
    assert sorted(o["gpu"] for o in on.opened()[before:]) == [0, 2, 5, 7]
    assert {p.ranks for p in snapshot.series} == {4, 5}
    assert 'ranks="4"' in render(on.results)

    # The job leaves: the GPU comes back, and the probe runs on five again.
    node.job_left(4)
    before = len(on.opened())
    on.runner.run("idle")
    assert sorted(o["gpu"] for o in on.opened()[before:]) == [0, 2, 4, 5, 7]
    assert on.readiness.preempted() == {}

    # Two more jobs leave 3 idle, under min_gpus: skipped with the busy GPUs' reason, no rank.
    node.job_appears(0)
    node.job_appears(4)
    before = len(on.opened())
    on.runner.run("idle")
    assert len(on.opened()) == before
    assert on.results.snapshot().probes["idle"].skips == {"gpu_busy_process": 1}


def test_group_one_gpu_offers_an_idle_gpu_not_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zygotes: list[Zygote]
) -> None:
    from netmon.serve.readiness import Survey

    node = dgx_h100(tmp_path)
    node.job_appears(0)
    node.job_appears(1)
    config = config_for(tmp_path, [str(i) for i in range(8)], [])
    on = runner_on(node, config, monkeypatch, zygotes)
    survey = on.readiness.survey(config.devices or ())
    assert isinstance(survey, Survey)
    assert survey.idle[0] == "2"
    assert survey.busy == {"0": "gpu_busy_process", "1": "gpu_busy_process"}


def test_a_slurm_job_pauses_its_own_gpus_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zygotes: list[Zygote]
) -> None:
    node = dgx_h100(tmp_path)
    pause_dir = tmp_path / "pause.d"
    pause_dir.mkdir()
    # A prolog names the job's GPUs, by index or UUID; a comment is fine.
    (pause_dir / "job-17").write_text(f"0, {node.uuid(1)}  # job 17\n3\n")
    document = {"name": "pairs", "kind": "pairs", **QUICK}
    config = config_for(tmp_path, ["0", "1", "2", "3"], [document])
    config = config.model_copy(update={"pause_dir": pause_dir})
    on = runner_on(node, config, monkeypatch, zygotes)
    survey = on.readiness.survey(["0", "1", "2", "3"])
    assert survey.busy == {"0": "paused", "1": "paused", "3": "paused"}
    on.runner.run("pairs")  # one idle GPU: no pair
    assert on.opened() == []
    assert on.results.snapshot().probes["pairs"].skips == {"paused": 1}
    assert on.results.snapshot().pair_skips[("pairs", "paused")] == 6
    # An empty file pauses the whole node, as the pause file does.
    (pause_dir / "job-17").unlink()
    (pause_dir / "job-18").write_text("")
    assert on.readiness.survey(["2"]).blocked is not None
    (pause_dir / "job-18").unlink()
    assert on.readiness.survey(["0", "1", "2", "3"]).busy == {}


def test_link_counters_keep_updating_while_every_gpu_is_busy_with_no_rank_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = dgx_with_jobs(tmp_path, *range(8)).activate(monkeypatch)
    probes = [{"name": "small", "sizes": [8], "interval": "1s"}]
    config = config_for(tmp_path, [str(i) for i in range(8)], probes).model_copy(
        update={"listen": "127.0.0.1:0", "link_telemetry": LinkTelemetryConfig(interval=0.2)}
    )
    daemon = Daemon(config)
    seen: set[float] = set()

    def replays() -> float | None:
        # A link that keeps retrying: its replay counter grows on the node.
        for gpu in node.document["gpus"]:
            gpu["nvlink_errors"] = {"replay": len(seen) + 1}
        node.write()
        text = SnapshotPage(daemon.results.snapshot)().decode()
        found = re.search(r'netmon_nvlink_gpu_errors_total\{error="replay",gpu="3"\} (\S+)', text)
        if found:
            seen.add(float(found.group(1)))
        return len(seen) >= 3 or None

    daemon.start()
    try:
        wait_for(replays, 15.0, "three different replay counts while every GPU is busy", 0.3)
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
    assert node.opened() == []  # no rank was ever started
    assert snapshot.link_health is not None and not snapshot.link_health.under_load
    text = SnapshotPage(daemon.results.snapshot)().decode()
    assert 'netmon_nvlink_active_links{gpu="7"} 18.0' in text
    assert "netmon_link_health_interval_seconds 0.2" in text
    assert "netmon_simulated 1.0" in text
    # Idle links at Gen1 of Gen5 are power saving, not downtraining: not judged without load.
    assert 'reason="generation"' not in text
    assert 'netmon_pcie_link_downtrained{gpu="0",reason="width"} 0.0' in text


def test_the_default_daemon_on_a_simulated_dgx_never_takes_its_own_ranks_for_a_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded default of an 8-GPU node, as `netmon serve --simulate` runs it: every rank
    forked by the zygote and listed by NVML on its GPU while it runs, no probe preempted."""
    from netmon import config as cfg

    node = dgx_h100(tmp_path).activate(monkeypatch)
    config = cfg.resolve(cfg.load_config(None), 8).model_copy(
        update={
            "listen": "127.0.0.1:0",
            "state_dir": tmp_path / "state",
            "pause_file": tmp_path / "pause",
            "pause_dir": tmp_path / "pause.d",
        }
    )
    daemon = Daemon(config)
    daemon.readiness.foreign_check_s = 0.1  # many looks while the ranks hold their GPUs
    held: set[tuple[int, str]] = set()

    def both_ran() -> bool | None:
        held.update((r.pid, r.uuid) for r in node.sim.ranks())
        probes = daemon.results.snapshot().probes
        ended = (s.last_success is not None or sum(s.failures.values()) for s in probes.values())
        return all(ended) or None

    daemon.start()
    try:
        wait_for(both_ran, 240, "a run of the small and the large probe", poll=0.05)
    finally:
        daemon.stop()
    snapshot = daemon.results.snapshot()
    assert {p: s.failures for p, s in snapshot.probes.items()} == {"small": {}, "large": {}}
    runs = sum(s.runs for s in snapshot.probes.values())
    assert runs >= 2  # small may have come round again while large ran on a loaded machine
    # NVML saw the ranks on the GPUs (8 per run), each opened the GPU its spec named.
    assert {uuid for _, uuid in held} == {node.uuid(i) for i in range(8)}
    opened = node.opened()
    assert len(opened) == 8 * runs
    assert all(o["env"]["CUDA_VISIBLE_DEVICES"] == o["uuid"] for o in opened)
    assert snapshot.rank_starts == {"fork": 8 * runs, "spawn": 0}
    text = render(daemon.results)
    assert "netmon_simulated 1.0" in text
    # The model NVML names (from the node file), read once at start: the fleet's join label.
    assert 'netmon_node_info{gpu_model="NVIDIA H100 80GB HBM3"} 1.0' in text
    assert (
        'netmon_busbw_bytes_per_second{op="all_reduce",path="default",probe="large",ranks="8",size_bytes="1073741824"}'
        in text
    )
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(series) < 500, len(series)  # tests/test_cardinality.py: 466 at most


def test_a_pair_sweep_that_comes_due_while_a_collective_runs_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zygotes: list[Zygote]
) -> None:
    """A sweep sharing the collective's interval comes due while the collective holds every GPU:
    it waits for our own probe, then measures every pair, instead of skipping them all."""
    node = dgx_h100(tmp_path)
    collective = {"name": "small", "sizes": ["4M"], "iters": 60, "warmup": 1}
    pairs = {"name": "pairs", "kind": "pairs", **QUICK}
    on = runner_on(
        node, config_for(tmp_path, ["0", "1", "2"], [collective, pairs]), monkeypatch, zygotes
    )
    first = threading.Thread(target=on.runner.run, args=("small",))
    first.start()
    wait_for(lambda: node.ranks_on(0), 60, "the collective's ranks on GPU 0", poll=0.01)
    on.runner.run("pairs")
    first.join(timeout=60)
    snapshot = on.results.snapshot()
    assert snapshot.probes["small"].failures == {} and snapshot.probes["small"].runs == 1
    assert {(p.gpu, p.peer_gpu) for p in snapshot.links} == {(0, 1), (0, 2), (1, 2)}
    assert sum(snapshot.pair_skips.values()) == 0, snapshot.pair_skips
    assert snapshot.probes["pairs"].skips == {}


def nvlink_pair_node(directory: Path) -> SimNode:
    """The shipped 3 x RTX A6000 node: GPUs 0 and 1 on an NVLink bridge, GPU 2 on PCIe only."""
    return shipped_node(directory, "nvlink-pair-3x-a6000")


def test_a_shared_node_never_takes_its_own_probes_for_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: `gpus: idle` every 3 s and pairs every 4 s on a 3-GPU NVLink-pair node with no
    job at all. The ranks one probe leaves exiting, and the utilization their collectives leave,
    are netmon's own: no run or pair is skipped as a job's, and none is preempted."""
    node = nvlink_pair_node(tmp_path).activate(monkeypatch)
    probes: list[dict[str, Any]] = [
        {"name": "idle_set", "sizes": ["1M"], "interval": "3s", "gpus": "idle", "min_gpus": 2},
        {"name": "pairs", "kind": "pairs", "sizes": ["1M"], "interval": "4s"},
    ]
    config = config_for(tmp_path, ["0", "1", "2"], probes).model_copy(
        update={"listen": "127.0.0.1:0", "idle": IdlePolicy(samples=3, sample_interval=0.2)}
    )
    daemon = Daemon(config)
    daemon.start()
    started = time.monotonic()
    try:
        wait_for(lambda: time.monotonic() - started > 60 or None, 70, "a minute", poll=1)
        # The pairs measured, read before the stop: the pair the stop ends in flight fails
        # (`shutdown`), and a failed pair has no point until it succeeds again.
        measured = {(p.gpu, p.peer_gpu) for p in daemon.results.snapshot().links}
    finally:
        daemon.stop()
    snapshot = daemon.results.snapshot()
    skips = {p: s.skips for p, s in snapshot.probes.items()}
    # The test's own stop ends the run in flight then, if any (`shutdown`): nothing else fails.
    failures = {
        p: {r: n for r, n in s.failures.items() if (r, n) != ("shutdown", 1)}
        for p, s in snapshot.probes.items()
    }
    assert not [r for s in skips.values() for r, n in s.items() if n and r.startswith("gpu_")]
    pair_skips = {k: n for k, n in snapshot.pair_skips.items() if n}
    assert not [k for k in pair_skips if k[1].startswith("gpu_")], pair_skips
    assert failures == {"idle_set": {}, "pairs": {}}
    runs = {p: s.runs for p, s in snapshot.probes.items()}
    # About 20 and 15 come due; on a loaded 2-core machine one may wait for the other.
    assert runs["idle_set"] >= 8 and runs["pairs"] >= 6, runs
    assert measured == {(0, 1), (0, 2), (1, 2)}
    assert node.opened()  # the ranks were there for NVML to list


def pcie_only_node(directory: Path) -> SimNode:
    """The shipped 2 x RTX 5090 node: PCIe only, and no P2P between the boards (GeForce)."""
    return shipped_node(directory, "pcie-2x-rtx5090")


@pytest.mark.parametrize(("make", "p2p_off"), [(pcie_only_node, True), (nvlink_pair_node, False)])
def test_a_set_nvml_says_cannot_do_p2p_runs_with_p2p_disabled_and_says_so(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    zygotes: list[Zygote],
    make: Any,
    p2p_off: bool,
) -> None:
    """Issue 34: each rank sees one GPU, so NCCL takes its peer's P2P status from NVML and a set
    without P2P would fail every run; netmon reads the same status and runs such a set through
    host memory, its intent following. A set with P2P is left to NCCL."""
    from netmon.gpu.nvml import read_topology

    node = make(tmp_path).activate(monkeypatch)
    topology = read_topology()
    assert topology.p2p is not None
    assert bool(topology.p2p.without([0, 1])) == p2p_off
    config = config_for(tmp_path, ["0", "1"], [{"name": "small", **QUICK}])
    on = runner_on(node, config, monkeypatch, zygotes)
    on.runner.topology = topology
    on.runner.run("small")
    stats = on.results.snapshot().probes["small"]
    assert stats.runs == 1 and stats.failures == {}
    opened = on.opened()
    assert len(opened) == 2
    assert {o["env"].get("NCCL_P2P_DISABLE") for o in opened} == ({"1"} if p2p_off else {None})
