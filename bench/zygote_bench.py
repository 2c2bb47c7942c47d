"""What one small probe costs the node, with ranks forked by the rank zygote and spawned as new
interpreters, side by side in one run (issue 14).

Measured from outside on `netmon serve` (gloo, 2 CPU ranks, one all_reduce probe of 8 B and
1 KiB every second): the CPU time of the daemon and all its descendants over a window, divided by
the runs the daemon counted in it, and the wall time of each run in it (the daemon's `probe ok`
log lines, which `netmon_probe_duration_seconds` exports). The two ways alternate, phase by phase
(zygote, spawn, spawn, zygote, ...), each phase a fresh daemon whose window starts after its
first run (so the zygote's one torch import is reported apart, not spread over the window).

    python bench/zygote_bench.py [--phases 4] [--window 40]

One JSON document goes to stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_bench import _PROBE_OK, Daemon, log, parse_samples

from netmon.probe.processes import descendants_of

TICKS = os.sysconf("SC_CLK_TCK")
TARGET_CPU_S, TARGET_WALL_S = 0.5, 1.0  # per small run, on this 2-core machine (issue 14)


def tree_cpu_s(pid: int) -> float:
    """User and system time of a process and its descendants, reaped ones included (a reaped
    child's time is in its parent's cutime and cstime)."""
    total = 0
    for member in [pid, *descendants_of(pid)]:
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended between the listing and the read: its time is in its parent's
        total += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return total / TICKS


def zygote_cpu_s(pid: int) -> float | None:
    """The zygote's own CPU time: its torch import, paid once per daemon."""
    for member in descendants_of(pid):
        try:
            if b"netmon.probe.zygote" in Path(f"/proc/{member}/cmdline").read_bytes():
                fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / TICKS
        except OSError:
            continue
    return None


def runs(daemon: Daemon) -> float:
    samples = parse_samples(daemon.get().decode())
    return sum(v for (name, _), v in samples.items() if name == "netmon_probe_runs_total")


def config(workdir: Path, method: str) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "backend": "gloo",
        "ranks": 2,
        "rank_start": method,
        "state_dir": str(workdir / "state"),
        "pause_file": str(workdir / "pause"),
        "probes": [{"name": "small", "sizes": [8, "1K"], "interval": "1s"}],
    }


def phase(method: str, window_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="netmon-zygote-bench-") as directory:
        workdir = Path(directory)
        daemon = Daemon(workdir, config(workdir, method))
        try:
            deadline = time.monotonic() + 120
            while runs(daemon) < 2:  # the first run finished, the second begun
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no run within 120 s: {daemon.log()[-1500:]}")
                time.sleep(0.2)
            zygote_s = zygote_cpu_s(daemon.proc.pid)
            before_log = len(_PROBE_OK.findall(daemon.log()))
            cpu0, runs0, t0 = tree_cpu_s(daemon.proc.pid), runs(daemon), time.monotonic()
            time.sleep(window_s)
            cpu1, runs1, t1 = tree_cpu_s(daemon.proc.pid), runs(daemon), time.monotonic()
            walls = [float(w) for _, w in _PROBE_OK.findall(daemon.log())[before_log:]]
        finally:
            code, _ = daemon.stop()
            leftovers = daemon.kill_leftovers()
    counted = runs1 - runs0
    result = {
        "method": method,
        "window_s": round(t1 - t0, 2),
        "runs": counted,
        "cpu_s": round(cpu1 - cpu0, 3),
        "cpu_s_per_run": round((cpu1 - cpu0) / counted, 4) if counted else None,
        "wall_s_median": round(statistics.median(walls), 4) if walls else None,
        "wall_s_max": round(max(walls), 4) if walls else None,
        "zygote_start_cpu_s": zygote_s,
        "exit_code": code,
        "leftover_processes": leftovers,
    }
    log(f"{method}: {result}")
    return result


def summary(phases: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, dict[str, float]] = {}
    for method in ("zygote", "spawn"):
        mine = [p for p in phases if p["method"] == method and p["cpu_s_per_run"] is not None]
        by[method] = {
            "cpu_s_per_run_median": statistics.median(p["cpu_s_per_run"] for p in mine),
            "wall_s_median": statistics.median(p["wall_s_median"] for p in mine),
        }
    zygote, spawn = by["zygote"], by["spawn"]
    return {
        **by,
        "ratio_spawn_over_zygote": {
            "cpu_s_per_run": round(
                spawn["cpu_s_per_run_median"] / zygote["cpu_s_per_run_median"], 2
            ),
            "wall_s": round(spawn["wall_s_median"] / zygote["wall_s_median"], 2),
        },
        "targets": {"cpu_s_per_run": TARGET_CPU_S, "wall_s": TARGET_WALL_S},
        "zygote_within_targets": zygote["cpu_s_per_run_median"] <= TARGET_CPU_S
        and zygote["wall_s_median"] <= TARGET_WALL_S,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", type=int, default=4, help="phases per method (default 4)")
    parser.add_argument("--window", type=float, default=40.0, help="seconds per phase window")
    args = parser.parse_args()
    order = []
    for i in range(args.phases):
        order += ["zygote", "spawn"] if i % 2 == 0 else ["spawn", "zygote"]
    phases = [phase(method, args.window) for method in order]
    document = {
        "benchmark": "zygote_bench",
        "date": time.strftime("%Y-%m-%d"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "setup": {
            "probe": config(Path("WORKDIR"), "METHOD")["probes"][0],
            "ranks": 2,
            "backend": "gloo",
            "window_s": args.window,
            "order": order,
        },
        "phases": phases,
        "summary": summary(phases),
    }
    print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
