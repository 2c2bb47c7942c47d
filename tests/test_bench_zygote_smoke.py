"""bench/zygote_bench.py runs end to end on a short window, and its figures make sense: both
ways and the floor measured, forked ranks cheaper than spawned ones, the collectives alone cheaper
than spawned ranks, nothing left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "zygote_bench.py"


def test_the_zygote_bench_measures_both_ways() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--phases", "1", "--window", "6"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)
    phases = {p["method"]: p for p in document["phases"]}
    assert set(phases) == {"zygote", "spawn", "floor"}
    floor = phases.pop("floor")
    assert floor["runs"] >= 1 and floor["cpu_s_per_run"] > 0
    for phase in phases.values():
        assert phase["runs"] >= 1 and phase["exit_code"] == 0
        assert phase["leftover_processes"] == []
    assert phases["zygote"]["zygote_start_cpu_s"] > 0
    assert phases["spawn"]["zygote_start_cpu_s"] is None
    # Not the targets (a 6 s window on a busy CI host), only the direction: a fork is cheaper.
    ratio = document["summary"]["ratio_spawn_over_zygote"]
    assert ratio["cpu_s_per_run"] > 1.5, document["summary"]
    assert floor["cpu_s_per_run"] < phases["spawn"]["cpu_s_per_run"], document["summary"]
    # The zygote's figure by part from outside and its ranks' by phase from inside, which count
    # the same CPU (wait4's rusage, the zygote's cutime): the two cannot drift apart unseen.
    zygote = document["summary"]["zygote"]
    inside, outside = zygote["inside_rank_by_phase"], zygote["outside_by_part"]
    assert {"start", "rendezvous", "init", "warmup", "measure", "teardown", "exit"} <= set(inside)
    assert set(outside) == {"daemon", "zygote", "ranks"}
    assert outside["ranks"] > 0 and abs(zygote["inside_vs_outside_ranks"]) < 0.5, zygote
