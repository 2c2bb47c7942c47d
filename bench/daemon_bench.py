"""The daemon's own costs, side by side in one run (issue 3).

1. memory: the real `netmon serve` (gloo, 2 CPU ranks) runs the embedded CPU schedule with its
   intervals divided by 60 (an hour of probe rounds in a minute) while /proc is sampled every
   second: VmRSS, VmHWM, RssAnon, threads, open fds, and whether torch or CUDA is mapped into it.
2. metrics: /metrics of a hand-built Snapshot sized like an 8-GPU node with path and pair probes,
   served by netmon's MetricsServer in its own process, under a keep-alive loopback load at
   concurrency 1, 4 and 16; and the bare generate_latest in-process, for comparison. The same
   node in the exporter's own pair model (LinkPoints, NVML link health) is rendered in-process.
3. duty_cycle: each embedded CPU default probe run as the daemon would run it (its ranks forked
   by a rank zygote started beforehand, as the daemon's is by its first probe); wall / interval.

    python bench/daemon_bench.py [--quick]

The parts are modules beside this one: daemon_memory.py, daemon_metrics.py (with the node of
node_snapshots.py) and daemon_duty_cycle.py; daemon_process.py starts and reads the daemon.

One JSON document goes to stdout; progress goes to stderr. This machine is noisy (2 cores, other
jobs): the load averages before and after are part of the document.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path

from daemon_duty_cycle import measure_duty_cycle
from daemon_memory import measure_memory
from daemon_metrics import measure_metrics
from daemon_process import log


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="15 s of daemon, fewer requests, 1 run per probe"
    )
    return parser.parse_args(argv)


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="netmon-daemon-bench-") as name:
        yield Path(name)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git_state() -> str | None:
    """The commit and whether the tree had changes: netmon may be edited between runs."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    # As Ctrl-C does: unwind, so that every finally stops the processes this run started.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    soak_s = 15.0 if args.quick else 60.0
    requests = 48 if args.quick else 300
    repeats = 1 if args.quick else 3
    started = time.monotonic()
    load_before = os.getloadavg()
    with _workdir() as workdir:
        memory = measure_memory(soak_s, workdir)
    metrics = measure_metrics(requests, 20 if args.quick else 100, 3.0 if args.quick else 15.0)
    duty = measure_duty_cycle(repeats)
    document = {
        "benchmark": "daemon",
        "issue": 3,
        "quick": args.quick,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": _version("torch"),
            "prometheus_client": _version("prometheus-client"),
            "netmon_tree": _git_state(),
            # Other work on this machine skews every figure here; these say how busy it was.
            "loadavg_1m_before": load_before[0],
            "loadavg_1m_after": os.getloadavg()[0],
        },
        "memory": memory,
        "metrics": metrics,
        "duty_cycle": duty,
        "elapsed_s": time.monotonic() - started,
    }
    print(json.dumps(document, indent=2))
    rss = memory["rss_kib"]
    log(
        f"done in {document['elapsed_s']:.0f} s: daemon RSS {rss['start'] / 1024:.1f} -> "
        f"{rss['end'] / 1024:.1f} MiB, torch mapped: {bool(memory['torch_or_cuda_mapped'])}, "
        f"duty {duty['duty']:.4f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
