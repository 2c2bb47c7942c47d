"""netmon's side of probe_vs_loop.py: a probe through its launcher, and a whole CLI run.

A probe's ranks are forked by the rank zygote `rank_zygote` starts, as in the daemon, unless the
run asks for spawned ranks. netmon is imported only where it runs: a plain rank never imports it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plain_loop import BATCH, RANKS, RUN_TIMEOUT_S, WARMUP

# The rank zygote netmon's probes fork their ranks from (None: ranks spawned): rank_zygote().
ZYGOTE: Any = None


@contextlib.contextmanager
def rank_zygote(rank_start: str) -> Any:
    global ZYGOTE
    if rank_start == "spawn":
        yield
        return
    from netmon.probe.forking import Zygote
    from netmon.probe.starting import base_env

    ZYGOTE = Zygote(sys.executable, base_env())
    try:
        yield
    finally:
        ZYGOTE.close()
        ZYGOTE = None


def zygote_ticks() -> int:
    """The live rank zygote's CPU and its reaped ranks' (RUSAGE_CHILDREN counts neither until
    the zygote itself is reaped): utime, stime, cutime, cstime of /proc/PID/stat."""
    pid = ZYGOTE.pid if ZYGOTE is not None else None
    if pid is None:
        return 0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return sum(int(v) for v in fields[11:15])  # fields 14-17 of proc(5), counted from 1


def run_netmon(
    sizes: Sequence[int], iters: int, timing: str, spawned: bool = False
) -> dict[str, Any]:
    """One netmon probe; its ranks forked by ZYGOTE when there is one, unless `spawned`."""
    from netmon.probe.launcher import run_probe
    from netmon.probe.spec import ProbeSpec

    spec = ProbeSpec.model_validate(
        {
            "op": "all_reduce",
            "sizes": list(sizes),
            "dtype": "float32",
            "warmup": WARMUP,
            "iters": iters,
            "batch": BATCH,
            "timing": timing,
            "backend": "gloo",
            "ranks": RANKS,
            "timeout": RUN_TIMEOUT_S,
        }
    )
    # When each rank entered each phase, from the launcher's view: where the fixed cost goes.
    entered: dict[str, list[float]] = {}
    start = time.monotonic()

    def on_event(kind: str, event: dict[str, Any]) -> None:
        if kind == "phase":
            entered.setdefault(str(event["phase"]), []).append(time.monotonic() - start)

    zygote = None if spawned else ZYGOTE
    outcome = run_probe(spec, on_event=on_event, zygote=zygote)
    if outcome.failure is not None:
        raise RuntimeError(f"netmon probe ({timing}) failed: {outcome.failure.describe()}")
    if zygote is not None and outcome.ranks_forked != RANKS:
        raise RuntimeError(f"netmon probe ({timing}): ranks not forked ({outcome.fork_fallback})")
    env = outcome.environment
    # The slower rank's entry into each phase; phases repeat per size, so take the first entry.
    ready = max(entered["rendezvous"])
    swept = sorted(entered["warmup"])[RANKS - 1]
    teardown = max(entered["teardown"])
    return {
        "wall_s": outcome.wall_s,
        "collective_s": outcome.collective_s,
        "phases_s": {
            "start_and_import": ready,
            "rendezvous_and_init": swept - ready,
            "sizes": teardown - swept,
            "teardown_and_reap": outcome.wall_s - teardown,
        },
        "torch": env.torch if env else None,
        "time_s": {str(r.size_bytes): r.time_s for r in outcome.results},
        "slower_rank_median_s": {str(r.size_bytes): max(r.rank_medians_s) for r in outcome.results},
        "busbw": {str(r.size_bytes): r.busbw_bytes_per_second for r in outcome.results},
    }


def _netmon_command() -> list[str]:
    script = Path(sys.executable).with_name("netmon")
    return [str(script)] if script.exists() else [sys.executable, "-m", "netmon"]


def cli_command(sizes: Sequence[int], rank_start: str) -> list[str]:
    return [
        *_netmon_command(),
        "probe",
        "--backend=gloo",
        f"--ranks={RANKS}",
        "--op=all_reduce",
        f"--sizes={','.join(map(str, sizes))}",
        f"--rank-start={rank_start}",
        "--json",
        "--quiet",
    ]


def run_cli(sizes: Sequence[int], rank_start: str) -> dict[str, float]:
    """A whole `netmon probe --json` run with default timing, timed from outside."""
    start = time.monotonic()
    done = subprocess.run(
        cli_command(sizes, rank_start), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    cli_wall = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(f"netmon probe exited {done.returncode}: {done.stderr[-1500:]}")
    probes = json.loads(done.stdout)["probes"]
    wall = sum(float(p["wall_s"]) for p in probes)
    collective = sum(float(p["collective_s"]) for p in probes)
    return {
        "cli_wall_s": cli_wall,
        "collective_s": collective,
        "fixed_s": cli_wall - collective,
        "cli_outside_launcher_s": cli_wall - wall,
        "launcher_outside_collectives_s": wall - collective,
    }
