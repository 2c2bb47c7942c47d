"""daemon_bench.py, part 1: the daemon's memory, threads and descriptors over a compressed hour.

The real `netmon serve` (gloo, 2 CPU ranks) runs the embedded CPU schedule with its intervals
divided by COMPRESSION while /proc is sampled and /metrics scraped every SAMPLE_S.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from daemon_process import (
    HOST,
    PROBE_FAILED,
    PROBE_OK,
    Daemon,
    forbidden_mappings,
    log,
    open_fds,
    proc_status,
)
from scrapes import latency_summary, parse_samples, series_lines

from netmon.probe.processes import descendants_of

COMPRESSION = 60  # an hour of scheduled rounds in a minute
SMALL_SIZES = (8, 1 << 10, 64 << 10)  # the embedded CPU default probes (netmon.config)
LARGE_SIZES = (1 << 20, 16 << 20)
SAMPLE_S = 1.0


def soak_config(workdir: Path) -> dict[str, Any]:
    return {
        "listen": f"{HOST}:0",
        "state_dir": str(workdir / "state"),
        "backend": "gloo",
        "ranks": 2,
        "pause_file": str(workdir / "pause"),
        "probes": [
            {"name": "small", "sizes": list(SMALL_SIZES), "interval": 60 / COMPRESSION},
            {"name": "large", "sizes": list(LARGE_SIZES), "interval": 900 / COMPRESSION},
        ],
    }


def _slope_per_minute(times: Sequence[float], values: Sequence[float]) -> float | None:
    if len(times) < 3:
        return None
    mean_t, mean_v = statistics.fmean(times), statistics.fmean(values)
    spread = sum((t - mean_t) ** 2 for t in times)
    if spread == 0:
        return None
    return (
        60 * sum((t - mean_t) * (v - mean_v) for t, v in zip(times, values, strict=True)) / spread
    )


def _counts(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
) -> dict[str, dict[str, float]]:
    """{probe: {reason: value}} of a counter by probe and reason, nonzero values only."""
    found: dict[str, dict[str, float]] = {}
    for (metric, labels), value in samples.items():
        label = dict(labels)
        if metric == name and value:
            found.setdefault(label["probe"], {})[label.get("reason", "")] = value
    return found


def _by_probe(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
) -> dict[str, float]:
    return {
        dict(labels)["probe"]: value
        for (metric, labels), value in samples.items()
        if metric == name
    }


def measure_memory(seconds: float, workdir: Path) -> dict[str, Any]:
    config = soak_config(workdir)
    log(f"memory: starting the daemon (small every 1 s, large every 15 s) for {seconds:g} s")
    daemon = Daemon(workdir, config)
    pid = daemon.proc.pid
    rows: list[list[float]] = []
    scrape_s: list[float] = []
    scrape_errors = 0
    forbidden: set[str] = set()
    control: list[str] = []  # torch as mapped in a rank: proof that the maps check can see it
    rank_rss_max = 0
    final_text = ""
    exit_code: int | None = None
    stop_s = 0.0
    leftovers: list[int] = []
    try:
        start = time.monotonic()
        for tick in itertools.count():
            due = start + tick * SAMPLE_S
            time.sleep(max(0.0, due - time.monotonic()))
            elapsed = time.monotonic() - start
            if daemon.proc.poll() is not None:
                raise RuntimeError(
                    f"daemon exited {daemon.proc.returncode}: {daemon.log()[-1500:]}"
                )
            status = proc_status(pid)
            forbidden.update(forbidden_mappings(pid))
            ranks_rss = 0
            for child in descendants_of(pid):
                with contextlib.suppress(OSError):
                    ranks_rss += proc_status(child).get("VmRSS", 0)
                    if not control:
                        control = forbidden_mappings(child)[:3]
            rank_rss_max = max(rank_rss_max, ranks_rss)
            rows.append(
                [
                    round(elapsed, 2),
                    status["VmRSS"],
                    status["VmHWM"],
                    status["RssAnon"],
                    status["Threads"],
                    open_fds(pid),
                    ranks_rss,
                ]
            )
            began = time.perf_counter()
            try:
                final_text = daemon.get().decode()
                scrape_s.append(time.perf_counter() - began)
            except OSError:
                scrape_errors += 1
            if elapsed >= seconds:
                break
        samples = parse_samples(final_text)
    finally:
        exit_code, stop_s = daemon.stop()
        leftovers = daemon.kill_leftovers()
    log(f"memory: daemon exited {exit_code} in {stop_s:.2f} s after SIGTERM")
    # The final scrape came before SIGTERM; the log also has the runs that ended after it.
    text = daemon.log()
    walls: dict[str, list[float]] = {}
    for match in PROBE_OK.finditer(text):
        walls.setdefault(match.group(1), []).append(float(match.group(2)))
    failed: dict[str, Counter[str]] = {}
    for match in PROBE_FAILED.finditer(text):
        failed.setdefault(match.group(1), Counter())[match.group(2)] += 1
    times = [row[0] for row in rows]
    rss = [row[1] for row in rows]
    steady = [i for i, t in enumerate(times) if t >= seconds / 4]
    runs = _by_probe(samples, "netmon_probe_runs_total")
    skips = _counts(samples, "netmon_probe_skips_total")
    scheduled = {p["name"]: seconds / float(p["interval"]) for p in config["probes"]}
    return {
        "setup": {
            "command": f"{sys.executable} -m netmon serve --config FILE",
            "config": config,
            "compression": COMPRESSION,
            "seconds": seconds,
            "sample_every_s": SAMPLE_S,
            "scrape_every_s": SAMPLE_S,
        },
        "rss_kib": {
            "start": rows[0][1],
            "end": rows[-1][1],
            "max": max(rss),
            "growth": rows[-1][1] - rows[0][1],
            "growth_after_first_quarter": rows[-1][1] - rows[steady[0]][1] if steady else None,
            "slope_after_first_quarter_kib_per_min": _slope_per_minute(
                [times[i] for i in steady], [rss[i] for i in steady]
            ),
        },
        "hwm_kib": {"start": rows[0][2], "end": rows[-1][2]},
        "rss_anon_kib": {"start": rows[0][3], "end": rows[-1][3], "max": max(r[3] for r in rows)},
        "threads": {"start": rows[0][4], "end": rows[-1][4], "max": max(r[4] for r in rows)},
        "open_fds": {"start": rows[0][5], "end": rows[-1][5], "max": max(r[5] for r in rows)},
        "rank_processes_rss_max_kib": rank_rss_max,
        "torch_or_cuda_mapped": sorted(forbidden),
        "maps_checked": len(rows),
        "control_rank_mapped": control,
        "scheduled_runs": scheduled,
        "runs": runs,
        "failures": _counts(samples, "netmon_probe_failures_total"),
        "skips": skips,
        "busy_seconds": _by_probe(samples, "netmon_probe_busy_seconds_total"),
        "failed_in_log": {name: dict(reasons) for name, reasons in failed.items()},
        "probe_wall_s_in_daemon": {
            name: {"runs": len(v), "median": statistics.median(v), "max": max(v)}
            for name, v in walls.items()
        },
        "scrapes": {
            "count": len(scrape_s),
            "errors": scrape_errors,
            "latency_s": latency_summary(scrape_s) if scrape_s else None,
            "bytes": len(final_text.encode()),
            "series_lines": series_lines(final_text),
        },
        "exit_code": exit_code,
        "stop_s": stop_s,
        "leftover_processes": leftovers,
        "columns": ["t_s", "rss_kib", "hwm_kib", "rss_anon_kib", "threads", "fds", "ranks_rss_kib"],
        "samples": rows,
    }
