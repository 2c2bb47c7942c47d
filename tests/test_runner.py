"""The scheduled run's decisions, with a replayed NVML and no real GPU: skips and preemption."""

from __future__ import annotations

import dataclasses
import subprocess
import threading
from pathlib import Path
from typing import Any

from netmon import baseline
from netmon.config import parse_config, resolve
from netmon.gpu import idle, idle_sources
from netmon.probe.launcher import Launcher
from netmon.serve.current import CurrentConfig
from netmon.serve.keeper import BaselineKeeper
from netmon.serve.readiness import DeviceLocks, Readiness
from netmon.serve.results import Results
from netmon.serve.runner import ProbeRunner


def _reading(index: int, pids: tuple[int, ...] = (), utilization: float = 0.0) -> idle.GpuReading:
    return idle.GpuReading(
        index=index, uuid=f"GPU-{index}", utilization=utilization, memory_used=0, compute_pids=pids
    )


def _runner(
    tmp_path: Path, source: idle.IdleSource, launcher: Any = Launcher
) -> tuple[ProbeRunner, Results]:
    config = resolve(
        parse_config(
            {
                "backend": "nccl",
                "devices": ["0", "1"],
                "state_dir": str(tmp_path),
                "pause_file": str(tmp_path / "pause"),
                "pause_dir": str(tmp_path / "pause.d"),
                "probes": [{"name": "small", "sizes": [8], "interval": "1s"}],
                "idle": {"samples": 2, "sample_interval": 0},
            }
        ),
        gpus=2,
    )
    current = CurrentConfig(config)
    results = Results(current, BaselineKeeper(baseline.BaselineBook(config.baseline)))
    readiness = Readiness(current, DeviceLocks(), source, threading.Event())
    return ProbeRunner(current, results, readiness, launcher=launcher), results


class _NeverLaunch:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a probe was launched on a busy GPU")


def test_a_busy_gpu_is_skipped_with_its_reason_and_never_probed(tmp_path: Path) -> None:
    busy = idle_sources.ReplaySource([[_reading(0), _reading(1, pids=(4242,))]])
    runner, results = _runner(tmp_path, busy, launcher=_NeverLaunch)
    runner.run("small")
    stats = results.snapshot().probes["small"]
    assert stats.runs == 0 and stats.skips == {"gpu_busy_process": 1}


def test_utilization_in_one_sample_is_enough_to_skip(tmp_path: Path) -> None:
    flicker = idle_sources.ReplaySource(
        [[_reading(0), _reading(1)], [_reading(0, utilization=90), _reading(1)]]
    )
    runner, results = _runner(tmp_path, flicker, launcher=_NeverLaunch)
    runner.run("small")
    assert results.snapshot().probes["small"].skips == {"gpu_busy_utilization": 1}


def test_pause_file_skips_before_reading_nvml(tmp_path: Path) -> None:
    runner, results = _runner(tmp_path, idle_sources.ReplaySource([[]]), launcher=_NeverLaunch)
    (tmp_path / "pause").touch()
    runner.run("small")
    assert results.snapshot().probes["small"].skips == {"paused": 1}
    assert results.snapshot().paused


def test_a_foreign_process_during_a_probe_preempts_it(tmp_path: Path) -> None:
    runner, _ = _runner(tmp_path, idle_sources.ReplaySource([[_reading(0), _reading(1)]]))
    readiness = runner.readiness
    readiness.foreign_check_s = 0.0
    abort = readiness.abort_check(("0", "1"))
    assert abort() is None
    # A child of this process stands for a rank: ours, so not foreign.
    rank = subprocess.Popen(["sleep", "30"])
    try:
        readiness.idle_source = idle_sources.ReplaySource(
            [[_reading(0, pids=(rank.pid,)), _reading(1)]]
        )
        assert abort() is None
        readiness.idle_source = idle_sources.ReplaySource(
            [[_reading(0), _reading(1, pids=(31337,))]]
        )
        assert abort() == "preempted"
        # The kubelet gave GPU 1 to a pod whose process has not started: preempted too.
        given = dataclasses.replace(_reading(1), allocated_to="jobs/train-0/worker")
        readiness.idle_source = idle_sources.ReplaySource([[_reading(0), given]])
        assert abort() == "preempted"
        # Gone from NVML, but a GPU once taken stays off limits, for this check and any other
        # on it, until a claim's full idle check finds it idle.
        readiness.idle_source = idle_sources.ReplaySource([[_reading(0), _reading(1)]])
        assert abort() == "preempted"
        assert readiness.abort_check(("1",))() == "preempted"
        assert readiness.abort_check(("0",))() is None
        with readiness.claim(frozenset({"0", "1"}), ("0", "1"), 1.0) as decision:
            assert decision.ready
        assert readiness.abort_check(("0", "1"))() is None
    finally:
        rank.kill()
        rank.wait()
    readiness.stopping.set()
    assert abort() == "shutdown"


def test_device_locks_are_fair(tmp_path: Path) -> None:
    locks = DeviceLocks()
    order: list[str] = []
    first_holds = threading.Event()
    release = threading.Event()

    def hold(name: str, keys: frozenset[str], signal: threading.Event | None = None) -> None:
        with locks.hold(keys, timeout=10) as got:
            assert got
            order.append(name)
            if signal is not None:
                signal.set()
                release.wait(10)

    first = threading.Thread(target=hold, args=("first", frozenset({"cpu"}), first_holds))
    first.start()
    first_holds.wait(10)
    rare = threading.Thread(target=hold, args=("rare", frozenset({"cpu"})))
    rare.start()
    while not locks._queue:
        threading.Event().wait(0.01)
    frequent = threading.Thread(target=hold, args=("frequent", frozenset({"cpu"})))
    frequent.start()
    while len(locks._queue) < 2:
        threading.Event().wait(0.01)
    release.set()
    for thread in (first, rare, frequent):
        thread.join(10)
    assert order == ["first", "rare", "frequent"]
    with locks.hold(frozenset({"gpu0"}), timeout=0.1) as got:
        assert got


def test_an_internal_error_is_counted_not_raised(tmp_path: Path) -> None:
    class Broken:
        def read(self) -> list[idle.GpuReading]:
            raise idle.IdleSourceError("unused")

    runner, results = _runner(tmp_path, Broken())
    runner.readiness = None  # type: ignore[assignment]  # any bug inside a run
    runner.run("small")
    assert results.snapshot().probes["small"].failures == {"internal": 1}


class _Script:
    """NVML's answers in order, the last one repeated."""

    def __init__(self, *readings: list[idle.GpuReading]) -> None:
        self.readings = list(readings)

    def read(self) -> list[idle.GpuReading]:
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


def _claim(tmp_path: Path, source: idle.IdleSource) -> Any:
    runner, _ = _runner(tmp_path, source)
    with runner.readiness.claim(frozenset({"0", "1"}), ["0", "1"], lock_timeout=1) as decision:
        return decision


NOBODY = 4_194_304 + 7  # above any pid_max: a PID with no /proc entry


def test_a_listed_pid_that_exited_by_the_time_it_is_looked_up_is_read_again_not_a_job(
    tmp_path: Path,
) -> None:
    gone = [_reading(0, (NOBODY,)), _reading(1)]
    assert _claim(tmp_path, _Script(gone, gone, [_reading(0), _reading(1)])).ready


def test_a_pid_that_stays_listed_but_unseen_is_a_job_after_the_wait(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr("netmon.serve.readiness.OWN_EXIT_S", 0.3)
    decision = _claim(tmp_path, _Script([_reading(0, (NOBODY,)), _reading(1)]))
    assert (decision.ready, decision.reason) == (False, "gpu_busy_process")


def test_our_own_ranks_are_waited_for_and_their_load_is_ours(tmp_path: Path) -> None:
    """Ranks of our last probe still on a GPU (exiting), with the utilization they left: the next
    probe waits for them and starts, never skipped as a job."""
    rank = subprocess.Popen(["sleep", "60"])
    try:
        ours = [_reading(0, (rank.pid,), utilization=90), _reading(1)]
        after = [_reading(0, utilization=90), _reading(1)]
        assert _claim(tmp_path, _Script(ours, ours, ours, after)).ready
    finally:
        rank.kill()
        rank.wait()


def test_our_own_ranks_that_stay_are_skipped_as_ours_not_as_a_job(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr("netmon.serve.readiness.OWN_EXIT_S", 0.3)
    rank = subprocess.Popen(["sleep", "60"])
    try:
        decision = _claim(tmp_path, _Script([_reading(0, (rank.pid,)), _reading(1)]))
    finally:
        rank.kill()
        rank.wait()
    assert (decision.ready, decision.reason) == (False, "own_probe")
    # A job beside them is still a job.
    rank = subprocess.Popen(["sleep", "60"])
    try:
        both = [_reading(0, (rank.pid, 1)), _reading(1)]
        decision = _claim(tmp_path, _Script(both))
    finally:
        rank.kill()
        rank.wait()
    assert (decision.ready, decision.reason) == (False, "gpu_busy_process")
