"""A healthy but busy node, watched as an operator would (issue 16): does netmon ever page?

One daemon (gloo, 2 CPU ranks): `small` [8, 1K, 64K] every 5 s and `large` [1M, 16M] every 10 s,
the default baseline policy, nothing wrong with any link. Beside it a reproducible load: one
CPU-bound process pinned to one of the cores, switched on and off every `--period` seconds
(off first, so that baselines are learned on a quiet machine, as after a real start). /metrics
is read every second: every new result of every series is recorded (its busbw, cv, other
processes' CPU share, and whether the load was on), and every `--scrape` seconds the series
that are degraded are counted, as a Prometheus scraping the daemon would see them.

    python bench/noise_bench.py                      # 30 minutes, the load toggled every 2
    python bench/noise_bench.py --minutes 3 --period 40 --streams streams.json

One JSON document goes to stdout (with `--streams`, the recorded results also go to that file,
the shape tests/fixtures/healthy_streams.json has); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_process import Daemon, log
from scrapes import parse_samples

SeriesId = str  # "probe/op/size_bytes/path/ranks"
LABELS = ("probe", "op", "size_bytes", "path", "ranks")


def config(workdir: Path) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "backend": "gloo",
        "ranks": 2,
        "state_dir": str(workdir / "state"),
        "pause_file": str(workdir / "pause"),
        "probes": [
            {"name": "small", "sizes": [8, "1K", "64K"], "interval": "5s"},
            {"name": "large", "sizes": ["1M", "16M"], "interval": "10s"},
        ],
    }


class Load:
    """One CPU-bound process pinned to the last core, on or off."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.core = (os.cpu_count() or 1) - 1

    @property
    def on(self) -> bool:
        return self.proc is not None

    def switch(self, on: bool) -> None:
        if on and self.proc is None:
            self.proc = subprocess.Popen(
                ["taskset", "-c", str(self.core), sys.executable, "-c", "while True: pass"]
            )
        elif not on and self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@contextlib.contextmanager
def load_beside() -> Iterator[Load]:
    load = Load()
    try:
        yield load
    finally:
        load.switch(False)


def series_of(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float],
) -> dict[SeriesId, dict[str, float]]:
    """Per series: the families a verdict is made of, from one scrape."""
    wanted = {
        "netmon_measurement_timestamp_seconds": "at",
        "netmon_busbw_bytes_per_second": "busbw",
        "netmon_latency_variation_ratio": "cv",
        "netmon_foreign_cpu_ratio": "foreign_cpu",
        "netmon_busbw_baseline_ratio": "ratio",
        "netmon_degraded": "degraded",
        "netmon_judged": "judged",
    }
    found: dict[SeriesId, dict[str, float]] = {}
    for (name, labels), value in samples.items():
        if name in wanted:
            tags = dict(labels)
            if all(k in tags for k in LABELS):
                key = "/".join(tags[k] for k in LABELS)
                found.setdefault(key, {})[wanted[name]] = value
    return found


def watch(
    daemon: Daemon, load: Load, minutes: float, period: float, scrape: float
) -> dict[str, Any]:
    streams: dict[SeriesId, list[dict[str, Any]]] = {}
    last_at: dict[SeriesId, float] = {}
    scrapes = scrapes_degraded = 0
    ever_degraded: set[SeriesId] = set()
    start = time.monotonic()
    next_scrape = start
    end = start + minutes * 60
    while time.monotonic() < end:
        now = time.monotonic()
        load.switch(int((now - start) // period) % 2 == 1)
        samples = parse_samples(daemon.get().decode())
        current = series_of(samples)
        for key, values in current.items():
            if values.get("at") and values["at"] != last_at.get(key):
                last_at[key] = values["at"]
                streams.setdefault(key, []).append(
                    {
                        "t": round(now - start, 2),
                        "busbw": values.get("busbw"),
                        "cv": values.get("cv"),
                        "foreign_cpu": values.get("foreign_cpu"),
                        "load": load.on,
                        "ratio": values.get("ratio"),
                        "degraded": values.get("degraded") == 1.0,
                    }
                )
        if now >= next_scrape:
            next_scrape += scrape
            scrapes += 1
            degraded = {k for k, v in current.items() if v.get("degraded") == 1.0}
            ever_degraded |= degraded
            scrapes_degraded += bool(degraded)
            if degraded:
                log(f"{now - start:.0f} s: degraded {sorted(degraded)}")
        time.sleep(1.0)
    final = parse_samples(daemon.get().decode())
    counters: dict[str, dict[str, float]] = {}
    for (name, labels), value in final.items():
        if name in ("netmon_inconclusive_results_total", "netmon_probe_failures_total") and value:
            tags = dict(labels)
            counters.setdefault(name, {})[f"{tags['probe']}/{tags['reason']}"] = value
        if name == "netmon_probe_runs_total":
            counters.setdefault(name, {})[dict(labels)["probe"]] = value
    judged = {k for k, v in series_of(final).items() if v.get("judged") == 1.0}
    return {
        "scrapes": scrapes,
        "scrapes_with_a_degraded_series": scrapes_degraded,
        "series_ever_degraded": sorted(ever_degraded),
        "series": sorted(streams),
        "series_judged": sorted(judged),
        "counters": counters,
        "results": {k: len(v) for k, v in streams.items()},
        "results_under_load": {k: sum(s["load"] for s in v) for k, v in streams.items()},
        "streams": streams,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument(
        "--period", type=float, default=120.0, help="seconds the load is on, then off"
    )
    parser.add_argument(
        "--scrape", type=float, default=10.0, help="seconds between counted scrapes"
    )
    parser.add_argument("--streams", type=Path, help="also write the recorded results here")
    args = parser.parse_args()
    for name in ("minutes", "period", "scrape"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be > 0")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="netmon-noise-bench-") as directory:
        workdir = Path(directory)
        daemon = Daemon(workdir, config(workdir))
        try:
            with load_beside() as load:
                watched = watch(daemon, load, args.minutes, args.period, args.scrape)
        finally:
            code, _ = daemon.stop()
            leftovers = daemon.kill_leftovers()
    streams = watched.pop("streams")
    document = {
        "benchmark": "noise_bench",
        "date": datetime.date.today().isoformat(),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "setup": {
            "config": config(Path("STATE")),
            "minutes": args.minutes,
            "load": "one CPU-bound process pinned to the last core, "
            f"off then on every {args.period:g} s",
            "scrape_s": args.scrape,
        },
        **watched,
        "exit_code": code,
        "leftover_processes": leftovers,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(document, indent=2))
    if args.streams is not None:
        args.streams.write_text(json.dumps({"setup": document["setup"], "streams": streams}) + "\n")
    degraded = watched["scrapes_with_a_degraded_series"]
    ever = watched["series_ever_degraded"] or "none"
    log(f"{watched['scrapes']} scrapes, {degraded} with a degraded series; ever degraded: {ever}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
