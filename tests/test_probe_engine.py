"""The probe engine with real rank processes: gloo over loopback, real sockets, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from netmon import bandwidth
from netmon.bandwidth import OpName
from netmon.probe.build import rank_wrappers
from netmon.probe.forking import Zygote
from netmon.probe.launcher import Launcher, run_probe
from netmon.probe.spec import PhaseDeadlines, ProbeOutcome, ProbeSpec
from netmon.probe.starting import base_env
from tests.conftest import listening_ports, live_processes, shm_entries, wait_for

OPS: list[OpName] = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "alltoall",
    "sendrecv",
    "all_gather_object",
]


@pytest.mark.parametrize("op", OPS)
def test_every_op_is_correct_and_reports_its_bus_factor_at_3_ranks(op: OpName) -> None:
    spec = ProbeSpec(
        op=op, sizes=(4096, 1 << 20), ranks=3, iters=3, warmup=1, batch=2, check=True, timeout=120
    )
    outcome = run_probe(spec)
    assert outcome.ok, outcome.failure
    assert [r.check_ok for r in outcome.results] == [True, True]
    for result in outcome.results:
        assert result.busbw_bytes_per_second / result.algbw_bytes_per_second == pytest.approx(
            bandwidth.bus_factor(op, 3)
        )
        assert result.algbw_bytes_per_second == pytest.approx(result.size_bytes / result.time_s)
        assert result.samples == 3
        assert result.min_s <= result.p10_s <= result.time_s <= result.p90_s <= result.max_s
    assert outcome.environment is not None and outcome.environment.torch


@pytest.mark.parametrize("stat", bandwidth.RANK_STATS)
def test_a_samples_time_is_taken_over_the_ranks_as_asked_and_each_ranks_median_is_kept(
    stat: bandwidth.RankStat,
) -> None:
    outcome = run_probe(
        ProbeSpec(sizes=(8, 64 << 10), ranks=3, iters=9, warmup=1, rank_stat=stat, timeout=120)
    )
    assert outcome.ok, outcome.failure
    for result in outcome.results:
        medians = result.rank_medians_s
        assert len(medians) == 3 and all(m > 0 for m in medians)
        # Per sample, the max over ranks is at least every rank's time (and the min at most),
        # so the median of maxima is at least every rank's median. The mean has no such bound;
        # its arithmetic is tested in test_bandwidth.
        if stat == "max":
            assert result.time_s >= max(medians)
        elif stat == "min":
            assert result.time_s <= min(medians)
        assert result.min_s <= result.time_s <= result.max_s


def test_dtypes_and_per_op_timing_and_chunks() -> None:
    for dtype in ("bfloat16", "float16"):
        outcome = run_probe(
            ProbeSpec(
                sizes=(8, 64 << 10),
                dtype=dtype,
                timing="per_op",
                iters=4,
                warmup=1,
                chunks=4,
                check=True,
                timeout=120,
            )
        )
        assert outcome.ok, outcome.failure
        first = outcome.results[0]
        # 8 B in 4 chunks of bf16: one element each, so S = 4 x 2 B.
        assert (first.size_bytes, first.count, first.chunks) == (8, 4, 4)
        assert outcome.results[1].size_bytes == 64 << 10
        assert all(r.check_ok for r in outcome.results)


# Stands for a C library writing to a rank's stdout during the probe, as NCCL does with no log
# file: C stdio is fully buffered into a pipe, so it flushes whenever its buffer fills, in the
# middle of a line. Here: unterminated bytes on descriptor 1 every millisecond, beneath Python's
# sys.stdout, from the rank's start (spawned) or its fork (forked; never in the zygote itself).
STDOUT_NOISE = """\
import os, sys, threading, time

def _noise():
    try:
        while True:
            os.write(1, b"NCCL INFO a line cut short by a full buffer ")
            time.sleep(0.001)
    except OSError:
        pass

def _start():
    threading.Thread(target=_noise, daemon=True).start()

if "netmon.probe.worker" in sys.orig_argv:
    _start()
elif "netmon.probe.zygote" in sys.orig_argv:
    os.register_at_fork(after_in_child=_start)
"""


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_what_a_library_writes_to_a_ranks_stdout_cannot_corrupt_its_reports(
    start: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(STDOUT_NOISE)
    monkeypatch.setenv("PYTHONPATH", str(site))
    zygote = Zygote(sys.executable, base_env()) if start == "fork" else None
    spec = ProbeSpec(
        sizes=(8, 64 << 10),
        iters=5,
        warmup=1,
        check=True,
        timeout=30,
        deadlines=PhaseDeadlines().capped(30),
    )
    try:
        launcher = Launcher(spec, zygote=zygote)
        outcome = launcher.run()
    finally:
        if zygote is not None:
            zygote.close()
    assert outcome.ok, outcome.failure
    assert (outcome.ranks_forked, outcome.fork_fallback) == (2 if zygote else 0, None)
    assert [(r.size_bytes, r.samples, r.check_ok) for r in outcome.results] == [
        (8, 5, True),
        (64 << 10, 5, True),
    ]
    assert outcome.environment is not None and outcome.environment.torch
    assert live_processes(launcher.pids) == []


def _launch_in_thread(
    spec: ProbeSpec, when: str, act: Any
) -> tuple[list[ProbeOutcome], Launcher, threading.Thread]:
    """Run a probe in a thread and call act(launcher, event) once rank 1 reaches phase `when`."""
    outcomes: list[ProbeOutcome] = []
    fired = threading.Event()

    def on_event(kind: str, event: dict[str, Any]) -> None:
        if kind == "phase" and event["rank"] == 1 and event["phase"] == when and not fired.is_set():
            fired.set()
            act(launcher, event)

    launcher = Launcher(spec, on_event=on_event)
    thread = threading.Thread(target=lambda: outcomes.append(launcher.run()))
    thread.start()
    return outcomes, launcher, thread


LONG_MEASURE = dict(sizes=(16 << 20,), iters=500, warmup=1, ranks=2)


def test_a_stopped_rank_fails_the_probe_within_its_deadline_and_leaves_nothing() -> None:
    shm_before = shm_entries()
    ports: list[int] = []
    timeout = 8.0
    spec = ProbeSpec(timeout=timeout, deadlines=PhaseDeadlines().capped(timeout), **LONG_MEASURE)
    started = time.monotonic()
    outcomes, launcher, thread = _launch_in_thread(
        spec, "measure", lambda launcher, _: os.kill(launcher.pids[1], signal.SIGSTOP)
    )
    thread.join(timeout + 15)
    elapsed = time.monotonic() - started
    assert not thread.is_alive()
    failure = outcomes[0].failure
    assert failure is not None
    assert elapsed < timeout + 5, elapsed
    assert (failure.cause, failure.phase, failure.rank) == ("timeout", "measure", 1)
    assert "stopped" in failure.detail
    assert failure.reason == "timeout_measure"
    assert live_processes(launcher.pids) == []
    assert shm_entries() <= shm_before
    del ports


def test_a_killed_rank_fails_the_probe_naming_it_and_leaves_nothing() -> None:
    store_ports: list[int] = []

    def capture(kind: str, event: dict[str, Any]) -> None:
        if kind == "store":
            store_ports.append(int(event["port"]))

    spec = ProbeSpec(timeout=60, **LONG_MEASURE)
    started = time.monotonic()
    outcomes, launcher, thread = _launch_in_thread(
        spec, "measure", lambda launcher, _: os.kill(launcher.pids[1], signal.SIGKILL)
    )
    thread.join(70)
    failure = outcomes[0].failure
    assert failure is not None
    assert time.monotonic() - started < 30
    assert (failure.cause, failure.rank, failure.phase) == ("signal", 1, "measure")
    assert "SIGKILL" in failure.detail
    assert failure.reason == "rank_signal"
    assert live_processes(launcher.pids) == []


def test_the_rendezvous_port_is_released_after_a_probe() -> None:
    ports: list[int] = []
    launcher = Launcher(
        ProbeSpec(sizes=(8,), iters=2, warmup=0),
        on_event=lambda kind, ev: ports.append(ev["port"]) if kind == "store" else None,
    )
    outcome = launcher.run()
    assert outcome.ok, outcome.failure
    assert len(ports) == 1
    assert ports[0] not in listening_ports()
    assert live_processes(launcher.pids) == []


def test_a_rank_exception_is_reported_with_its_message() -> None:
    # A wrapper that makes rank 1 a program that is not python: it exits 127 at spawn.
    spec = ProbeSpec(
        sizes=(8,),
        iters=1,
        warmup=0,
        timeout=60,
        wrappers=rank_wrappers(
            ("sh", "-c", 'if [ {rank} = 1 ]; then echo boom >&2; exit 7; fi; exec "$@"', "wrapper"),
            ranks=(0, 1),
            devices=(),
            topology=None,
        ),
    )
    outcome = run_probe(spec)
    failure = outcome.failure
    assert failure is not None
    assert (failure.cause, failure.rank, failure.phase) == ("exit", 1, "spawn")
    assert "status 7" in failure.detail and "boom" in failure.detail


def test_abort_request_stops_the_probe_quickly() -> None:
    requested = threading.Event()
    spec = ProbeSpec(timeout=60, **LONG_MEASURE)
    outcomes, launcher, thread = _launch_in_thread(spec, "measure", lambda *_: requested.set())
    launcher.abort = lambda: "paused" if requested.is_set() else None
    wait_for(requested.is_set, 30, "rank 1 to start measuring")
    stopped_at = time.monotonic()
    thread.join(20)
    assert time.monotonic() - stopped_at < 5
    failure = outcomes[0].failure
    assert failure is not None and failure.cause == "cancelled" and failure.reason == "paused"
    assert live_processes(launcher.pids) == []


def test_the_launching_process_never_imports_torch() -> None:
    code = (
        "import sys\n"
        "from netmon.probe.launcher import run_probe\n"
        "from netmon.probe.spec import ProbeSpec\n"
        "outcome = run_probe(ProbeSpec(sizes=(8,), iters=1, warmup=0))\n"
        "assert outcome.ok, outcome.failure\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_nccl_transport_logs_are_parsed_and_judged(tmp_path: Path) -> None:
    # No GPU here: feed the launcher's log reader a real NCCL_DEBUG=INFO excerpt (8 GPUs, SHM
    # only) as if a rank had written it, with an NVLink intent that it contradicts.
    fixture = Path(__file__).parent / "fixtures" / "nccl_info_8gpu_shm_direct_nccl1817_excerpt.txt"
    (tmp_path / "nccl.rank0.host.123.log").write_text(fixture.read_text())
    spec = ProbeSpec(backend="nccl", ranks=2, devices=("0", "1"), intent="nvlink")
    transports, faults = Launcher(spec)._transports(tmp_path)
    assert transports == ("shm",)
    assert "shm_where_nvlink_expected" in faults
    assert Launcher(ProbeSpec())._transports(tmp_path) == (("gloo",), ())


def test_one_world_split_over_two_launchers_like_two_nodes() -> None:
    # Global ranks 0-1 on "node A", 2-3 on "node B": B learns the port A's rank 0 bound.
    spec = ProbeSpec(
        sizes=(64 << 10,), ranks=4, iters=3, warmup=1, reporters=(0, 2), check=True, timeout=120
    )
    port: list[int] = []
    node_a = Launcher(
        spec,
        local_ranks=(0, 1),
        on_event=lambda kind, ev: port.append(ev["port"]) if kind == "store" else None,
    )
    node_b = Launcher(spec, local_ranks=(2, 3), port_source=lambda: port[0] if port else None)
    outcomes: dict[str, ProbeOutcome] = {}
    threads = [
        threading.Thread(target=lambda n=name, node=launcher: outcomes.update({n: node.run()}))
        for name, launcher in (("a", node_a), ("b", node_b))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(150)
    assert outcomes["a"].ok and outcomes["b"].ok, (outcomes["a"].failure, outcomes["b"].failure)
    # Both nodes hold the same reduced samples: each has its own, identical view of the round.
    assert outcomes["a"].results == outcomes["b"].results
    result = outcomes["a"].results[0]
    assert result.check_ok and result.bus_factor == pytest.approx(1.5)
    assert len(node_a.pids) == 2 and len(node_b.pids) == 2
    assert live_processes([*node_a.pids, *node_b.pids]) == []
    with pytest.raises(ValueError, match="port_source"):
        Launcher(spec, local_ranks=(2, 3))


def test_the_process_group_timeout_lies_past_every_phase_a_collective_runs_in() -> None:
    """Issue 34: the process group's timeout was the init deadline (60 s), under the measure
    phase's (120 s): a hung collective was aborted by NCCL's watchdog (`rank_signal`) before
    netmon's own deadline could name it (`timeout_measure`)."""
    deadlines = PhaseDeadlines()
    longest = max(deadlines.init, deadlines.warmup, deadlines.measure, deadlines.check)
    assert deadlines.watchdog() >= longest + 10
    capped = deadlines.capped(20.0)
    assert 20.0 < capped.watchdog() <= 60.0
