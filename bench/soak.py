"""Soak: the daemon with one-second probe intervals, watched every few seconds for growth.

    python bench/soak.py                   # 10 minutes, a sample every 10 s (docs/RELIABILITY.md)
    python bench/soak.py --minutes 0.75 --every 1 # the short variant CI runs

Prints one JSON document: the samples (daemon RSS, open file descriptors, threads, live child
processes, /dev/shm entries, and the TCP sockets the daemon and its children listen on) and a
verdict against stated bounds. Growth is judged after warm-up, so start-up allocations do not
count, and between floors: the least value of the first third of the samples and of the last
third. A probe in flight holds its ranks' pipes, processes and listeners (a forked rank's three
pipes in the daemon, say), for seconds on end when probes run back to back on a loaded host:
each sample waits up to half its period for a moment between probes, and the floors are taken
over the samples that found one. A leak raises the floor.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

# Bounds on growth of the floor (the least value) from the first third of the samples after
# warm-up to the last third.
BOUNDS = {
    "rss_kib": 8 * 1024,  # allocator warm-up settles within a few MiB
    "fds": 4,
    "threads": 4,
    # Every descendant: the rank zygote (alive from the first probe on) and its ranks, which may
    # be alive at the moment of a sample.
    "children": 4,
    "shm_entries": 0,
    # A probe in flight at the last sample (and not the first) listens with its rendezvous
    # store and one gloo listener per rank: 3 at the soak's 2 ranks (seen in CI).
    "listening_sockets": 3,
    # The rank zygote forks ranks and reaps them: it keeps its memory, descriptors and thread.
    "zygote_rss_kib": 8 * 1024,
    "zygote_fds": 2,
    "zygote_threads": 0,
}
_SERVING = re.compile(r"listen\W+https?://127\.0\.0\.1:(\d+)/metrics")


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                found.append(int(entry.name))
    return found


def _socket_inodes(pids: list[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    return inodes


def _listening(pids: list[int]) -> int:
    """Listening TCP sockets held by these processes (not the whole machine's)."""
    owned = _socket_inodes(pids)
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        count += sum(1 for row in rows if row.split()[3] == "0A" and row.split()[9] in owned)
    return count


def _descendants(pid: int) -> list[int]:
    found, parents = [], [pid]
    while parents:
        parents = [child for parent in parents for child in _children(parent)]
        found += parents
    return found


def _zygote(pids: list[int]) -> int | None:
    for pid in pids:
        try:
            if b"netmon.probe.zygote" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def _zygote_sample(pid: int | None) -> dict[str, int]:
    if pid is None:
        return {"zygote_rss_kib": 0, "zygote_fds": 0, "zygote_threads": 0}
    try:
        return {
            "zygote_rss_kib": _status_kib(pid, "VmRSS"),
            "zygote_fds": len(os.listdir(f"/proc/{pid}/fd")),
            "zygote_threads": _status_kib(pid, "Threads"),
        }
    except OSError:
        return _zygote_sample(None)


def sample(pid: int, started: float) -> dict[str, Any]:
    children = _descendants(pid)
    return {
        **_zygote_sample(_zygote(children)),
        "t_s": round(time.monotonic() - started, 1),
        "rss_kib": _status_kib(pid, "VmRSS"),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": _status_kib(pid, "Threads"),
        "children": len(children),
        "shm_entries": len(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else 0,
        "listening_sockets": _listening([pid, *children]),
    }


def idle_sample(pid: int, started: float, patience: float) -> dict[str, Any]:
    """A sample taken while no probe is in flight, if one comes within `patience` seconds: a
    probe's ranks hold pipes, sockets and children in the daemon for as long as it runs (for
    seconds back to back on a loaded host), and a leak check must not count them. Flagged
    `in_flight` when none came."""
    deadline = time.monotonic() + patience
    while True:
        found = sample(pid, started)
        busy = found["children"] > 1  # more than the rank zygote: ranks are alive
        if not busy or time.monotonic() >= deadline:
            return {**found, "in_flight": busy}
        time.sleep(0.05)


def _floor(samples: list[dict[str, Any]], key: str) -> int:
    """The least value of `key` over the samples taken between probes (all of them when no
    sample was)."""
    idle = [s for s in samples if not s.get("in_flight")]
    return int(min(s[key] for s in (idle or samples)))


def _runs(port: int) -> dict[str, float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    totals: dict[str, float] = {"runs": 0.0, "failures": 0.0, "skips": 0.0}
    for family in text_string_to_metric_families(text):
        for metric in family.samples:
            for key in totals:
                if metric.name == f"netmon_probe_{key}_total":
                    totals[key] += metric.value
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds before judging")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="netmon-soak-"))
    config = {
        "listen": "127.0.0.1:0",
        "backend": "gloo",
        "ranks": 2,
        "state_dir": str(work / "state"),
        "pause_file": str(work / "pause"),
        "probes": [
            {"name": "small", "sizes": [8, "1K"], "interval": "1s", "iters": 5, "warmup": 1},
            {"name": "large", "sizes": ["1M"], "interval": "1s", "iters": 5, "warmup": 1},
        ],
    }
    (work / "soak.yaml").write_text(yaml.safe_dump(config))
    log_path = work / "daemon.log"
    with open(log_path, "wb") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "netmon", "serve", "--config", str(work / "soak.yaml")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    started = time.monotonic()
    samples: list[dict[str, Any]] = []
    try:
        port = 0
        while not port:
            match = _SERVING.search(log_path.read_text(errors="replace"))
            port = int(match.group(1)) if match else 0
            if daemon.poll() is not None or time.monotonic() - started > 60:
                raise SystemExit(f"the daemon did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        end = started + args.minutes * 60
        while time.monotonic() < end:
            due = time.monotonic() + args.every
            samples.append(idle_sample(daemon.pid, started, patience=args.every / 2))
            print(f"soak: {samples[-1]}", file=sys.stderr, flush=True)
            time.sleep(max(0.0, min(due, end) - time.monotonic()))
        samples.append(idle_sample(daemon.pid, started, patience=args.every / 2))
        counters = _runs(port)
        daemon.send_signal(signal.SIGTERM)
        exit_status = daemon.wait(20)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    judged = [s for s in samples if s["t_s"] >= args.warmup] or samples
    third = max(1, len(judged) // 3)
    growth = {key: _floor(judged[-third:], key) - _floor(judged[:third], key) for key in BOUNDS}
    within = {key: growth[key] <= bound for key, bound in BOUNDS.items()}
    print(
        json.dumps(
            {
                "benchmark": "soak",
                "date": time.strftime("%Y-%m-%d"),
                "minutes": args.minutes,
                "every_s": args.every,
                "probe_intervals_s": 1,
                "counters": counters,
                "daemon_exit_status": exit_status,
                "bounds": BOUNDS,
                "growth_after_warmup": growth,
                "within_bounds": within,
                "passed": all(within.values()) and exit_status == 0 and counters["runs"] > 0,
                "samples": samples,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
