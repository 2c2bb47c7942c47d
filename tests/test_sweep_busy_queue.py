"""`netmon sweep` on a Slurm run as production runs it: the scheduler's default intervals
(`sched_interval=60`, `bf_interval=30`) and a queue that is never empty. Two nodes hold a long
user job; a higher-tier job wants all six and is pending on Resources, which keeps the main
scheduler off the four idle nodes (and backfill marks them `plnd`): a pair starts only when a
backfill pass finds it a gap before that job's start.

The lab Slurm of tests/test_sweep_slurm.py (intervals of 1 s, an empty queue) starts a pair at
once; here the sweep must wait for backfill, give up only what its own clocks say, and clean up
after itself when it is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import wait_for
from tests.slurm_cluster import SlurmCluster
from tests.test_sweep_slurm import CUT, HEALTHY, PAIR_SIZE, Sweeps, _report

# Slurm's own defaults (slurm.conf(5), SchedulerParameters), written out so that the lab's
# fast intervals cannot leak in.
PRODUCTION = {"SchedulerParameters": "sched_interval=60,bf_interval=30"}
BUSY = ("n5", "n6")  # held by a user job for an hour
IDLE = ("n1", "n2", "n3", "n4")
LAUNCH_TIMEOUT = 75  # two backfill passes and the ranks' start


class Queue:
    def __init__(self, cluster: SlurmCluster, work: Path) -> None:
        self.cluster = cluster
        self.work = work

    def config(self, name: str, **sweep: Any) -> Path:
        settings = {
            "size": PAIR_SIZE,
            "warmup": 2,
            "iters": 5,
            "launch_timeout": LAUNCH_TIMEOUT,
            "pair_timeout": 60,
            "deadline": 290,
            "node_config": str(self.work / "node.yaml"),
            "state_dir": str(self.work / f"{name}-state"),
            "fabric": "flat",  # every node on one bridge: one switch
            **sweep,
        }
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"sweep": settings, "state_dir": str(self.work)}))
        return path

    def argv(self, config: Path, seed: int) -> list[str]:
        return [
            sys.executable,
            *("-m", "netmon", "sweep", "--partition", "sweep", "--json"),
            *("--config", str(config), "--seed", str(seed)),
        ]

    def sweep_jobs(self) -> list[str]:
        listed = self.cluster.run(["squeue", "-h", "-o", "%i|%j|%T"], timeout=10).stdout
        return [line for line in listed.splitlines() if "|netmon-sweep-" in line]

    def pending_on_resources(self) -> bool:
        listed = self.cluster.run(["squeue", "-h", "-p", "batch", "-o", "%T|%r"], timeout=10)
        return "PENDING|Resources" in listed.stdout


@pytest.fixture(scope="module")
def queue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Queue]:
    work = tmp_path_factory.mktemp("busy")
    work.chmod(0o755)
    (work / "node.yaml").write_text(yaml.safe_dump({"env": {"GLOO_SOCKET_IFNAME": "eth0"}}))
    with SlurmCluster(nodes=6, net=238, settings=PRODUCTION) as cluster:
        for name in cluster.node_names:
            cluster.shape(name, HEALTHY)
        held = ",".join(BUSY)
        cluster.sbatch(
            "-p", "batch", "-w", held, "-N2", "--exclusive", "--time=60", "--wrap", "sleep 3600"
        )
        wait_for(
            lambda: {cluster.node_states().get(n) for n in BUSY} == {"alloc"},
            60,
            "the user job on n5, n6",
        )
        cluster.sbatch("-p", "batch", "-N6", "--exclusive", "--time=60", "--wrap", "sleep 60")
        built = Queue(cluster, work)
        wait_for(built.pending_on_resources, 30, "the wide job pending on Resources")
        try:
            yield built
        finally:
            cluster.run(["scancel", "--quiet", "--user=root"], timeout=10)


@pytest.fixture
def busy(queue: Queue) -> Iterator[Queue]:
    """The queue as the test found it: links healthy, no sweep job, the wide job pending."""
    yield queue
    for name in queue.cluster.node_names:
        queue.cluster.shape(name, HEALTHY)
    wait_for(lambda: not queue.sweep_jobs(), 60, "the sweep's jobs to end")
    assert queue.pending_on_resources()


def _outcomes(report: dict[str, Any], round_: int) -> list[str]:
    return [p["outcome"] for p in report["pairs"] if p["round"] == round_]


def test_every_idle_pair_is_measured_by_backfill_and_a_cut_cable_named(busy: Queue) -> None:
    """No pair is `busy` although none can start at submission: each waits for backfill within
    its launch deadline; one cut cable's node is named within two rounds, in under 5 minutes."""
    cut = IDLE[2]
    busy.cluster.shape(cut, CUT)
    started = time.monotonic()
    done = busy.cluster.run(busy.argv(busy.config("cut"), 7), timeout=300)
    wall = time.monotonic() - started
    report = _report(done.stdout, done.stderr)
    assert done.returncode == 1, report
    assert wall < 300
    assert sorted(report["nodes"]) == sorted(IDLE), report["nodes"]  # plnd nodes taken too
    outcomes = [p["outcome"] for p in report["pairs"]]
    assert set(outcomes) <= {"pass", "fail"}, report["pairs"]
    assert len(_outcomes(report, 1)) == 2
    assert [(s["kind"], s["node"]) for s in report["suspects"]] == [("node", cut)]
    assert report["suspects"][0]["round"] <= 2
    # Backfill started them, so they waited: a pair started at submission would be the lab's.
    waits = [p["overhead_seconds"] for p in report["pairs"] if p["overhead_seconds"] is not None]
    assert waits and max(waits) > 2.0, report["pairs"]


def _stop_ranks_of(queue: Queue, node: str, deadline: float) -> list[int]:
    """SIGSTOP the sweep's ranks on `node` as soon as they appear: a hung rank."""
    finder = Sweeps(queue.cluster, {}, queue.work)
    while time.monotonic() < deadline:
        found = finder.rank_processes(node)
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no sweep rank appeared on {node}")


def test_a_hung_rank_gives_up_its_pair_alone(busy: Queue) -> None:
    """A rank stopped as it starts: its pair is `timeout` at its launch deadline (its ranks
    never all met), while the round's other pair is measured; the sweep does not wait for the
    run clock or its own deadline."""
    hung = IDLE[0]
    stopped: list[int] = []
    watcher = threading.Thread(
        target=lambda: stopped.extend(_stop_ranks_of(busy, hung, time.monotonic() + 120))
    )
    watcher.start()
    started = time.monotonic()
    config = busy.config("hung", max_rounds=1, pair_timeout=200)
    done = busy.cluster.run(busy.argv(config, 11), timeout=300)
    wall = time.monotonic() - started
    watcher.join(10)
    report = _report(done.stdout, done.stderr)
    assert stopped, "no rank was stopped"
    by_pair = {tuple(p["nodes"]): p for p in report["pairs"]}
    mine = next(p for nodes, p in by_pair.items() if hung in nodes)
    other = next(p for nodes, p in by_pair.items() if hung not in nodes)
    assert mine["outcome"] == "timeout" and "did not all meet" in mine["detail"], mine
    assert other["outcome"] == "pass", other
    # Given up at its launch deadline (plus srun's grace), not at launch + the 200 s run clock.
    assert wall < LAUNCH_TIMEOUT + 60, wall


def test_sigterm_mid_round_cancels_the_sweeps_jobs(busy: Queue) -> None:
    """`kill -TERM` while the pairs wait for backfill (or run): their jobs leave the queue
    within 10 s, and the sweep exits 128 + SIGTERM."""
    process = busy.cluster.popen(busy.argv(busy.config("killed"), 13))
    try:
        wait_for(lambda: bool(busy.sweep_jobs()), 60, "the sweep's pair jobs in the queue")
        process.send_signal(signal.SIGTERM)
        killed = time.monotonic()
        wait_for(lambda: not busy.sweep_jobs(), 10, "no sweep job in squeue")
        assert time.monotonic() - killed <= 10
        assert process.wait(30) == 128 + signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
