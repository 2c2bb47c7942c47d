"""What reading the jobs' NCCL Inspector files costs the daemon (issue 36), side by side in one run.

An 8-GPU node's job with 16 communicators (tests/inspector_files.py: a tensor-parallel group, four
pairs, eight data-parallel groups across 4 nodes, three more) writes a dump every 30 s, as the
plugin's textfile mode does; the same in JSON lines. Figures:

- `read`: CPU time of one read (files, collectives, shape windows, the baseline book's verdicts),
  per mode, and what it is of one core at a 30 s interval (the budget: 1 %), measured in-process;
- `daemon`: the same from outside, a real daemon's CPU time (/proc) reading a dump a second for
  `--daemon-s` seconds against the same daemon with no `inspector:`, so the two cannot drift;
- `memory`: what the process keeps at each hour of `--hours` of dumps (a new job with new
  communicators every 2 hours, ended jobs' directories removed), by the code that allocated it:
  the inspector's reader, shapes and record; the baseline book (whose tracks keep a week of hour
  medians per judged series by design, as a probe's do); everything else.

    python bench/inspector_bench.py                 # 24 h of dumps, 60 s daemons: about 10 min
    python bench/inspector_bench.py --quick         # 2 h, 10 s

One JSON document goes to stdout; progress to stderr.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from netmon.baseline import BaselineBook, BaselinePolicy
from netmon.inspector.files import DumpReader
from netmon.inspector.settings import InspectorConfig
from netmon.inspector.shapes import Shapes
from netmon.serve.jobs_record import JobsRecord
from tests.daemon_harness import DaemonProcess, fast_config, wait_until
from tests.inspector_files import Comm, json_dump, marked_root, prom_dump, training_comms

EVERY = 30.0
START = 1_790_000_000.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _busbw(n: int) -> Callable[[Comm, int], float]:
    def of(comm: Comm, gpu: int) -> float:
        level = 330.0 if comm.nnodes == 1 else 45.0
        return level * (1.0 - 0.02 * ((n + gpu) % 5) / 5)

    return of


def _pipeline(root: Path) -> tuple[DumpReader, Shapes, JobsRecord]:
    settings = InspectorConfig(dir=root)
    book = BaselineBook(BaselinePolicy())
    return (
        DumpReader(settings),
        Shapes(settings.max_shapes, settings.shape_idle, settings.window),
        JobsRecord(settings, book),
    )


def read_cost(mode: str, reads: int) -> dict[str, Any]:
    """CPU seconds per read, the dump's writing left out."""
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        reader, shapes, record = _pipeline(root)
        comms = training_comms()
        spent = []
        for n in range(reads):
            at = START + n * EVERY
            if mode == "prom":
                prom_dump(root / "1", comms, _busbw(n), at, n + 1)
            else:
                json_dump(root / "1", comms, _busbw(n), at, n + 1)
            started = time.process_time()
            reading = reader.read(at + 1)
            record.took(shapes.take(reading.collectives, at + 1), reading, at + 1, {})
            spent.append(time.process_time() - started)
        per_read = statistics.median(spent)
        return {
            "reads": reads,
            "collectives_per_read": len(reading.collectives),
            "cpu_s_per_read": {"median": per_read, "max": max(spent)},
            "share_of_a_core_at_30s": per_read / EVERY,
        }


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    return total


def daemon_cost(seconds: float, with_inspector: bool) -> dict[str, Any]:
    """A real daemon's own CPU over `seconds`: its probes every 600 s (none runs in the window),
    with or without a dump a second to read."""
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        config = fast_config(tmp)
        for probe in config["probes"]:
            probe["interval"] = "600s"
        if with_inspector:
            root = marked_root(tmp / "inspector")  # as the site's setup makes it
            config["inspector"] = {"dir": str(root), "interval": 1, "window": 1}
        daemon = DaemonProcess(tmp, config)
        try:
            # Its first probe runs (start-up) done: the window below is the steady state.
            wait_until(lambda: daemon.value("netmon_probe_runs_total", probe="large"), 30, "a run")
            time.sleep(2.0)
            comms = training_comms()
            before = _cpu_seconds([daemon.proc.pid])
            started = time.monotonic()
            n = 0
            while time.monotonic() - started < seconds:
                if with_inspector:
                    prom_dump(tmp / "inspector" / "1", comms, _busbw(n), time.time(), n + 1)
                n += 1
                time.sleep(1.0)
            spent = _cpu_seconds([daemon.proc.pid]) - before
            elapsed = time.monotonic() - started
        finally:
            daemon.stop()
    return {"seconds": elapsed, "dumps": n if with_inspector else 0, "cpu_s": spent}


# What each part of the process keeps, by the file that allocated it.
GROUPS = {
    "inspector": ("netmon/inspector/", "netmon/serve/jobs_record.py"),
    "book": ("netmon/baseline/",),
}


def _kept_by_group() -> dict[str, int]:
    # A full collection first, which also empties the interpreter's free lists: without it a
    # tuple let go each window counts as kept until the free list holds 2,000 of its size.
    gc.collect()
    kept = dict.fromkeys((*GROUPS, "other"), 0)
    for stat in tracemalloc.take_snapshot().statistics("filename"):
        name = stat.traceback[0].filename
        group = next((g for g, parts in GROUPS.items() if any(p in name for p in parts)), "other")
        kept[group] += stat.size
    return kept


def memory(hours: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        reader, shapes, record = _pipeline(root)
        per_job = int(2 * 3600 / EVERY)
        hourly: list[dict[str, int]] = []
        tracemalloc.start()
        try:
            for n in range(int(hours * 3600 / EVERY)):
                at = START + n * EVERY
                job = n // per_job
                comms = [
                    Comm(
                        c.comm_id + job * 0x1000,
                        c.coll,
                        c.message_bytes,
                        c.nranks,
                        c.nnodes,
                        c.gpus,
                    )
                    for c in training_comms()
                ]
                prom_dump(root / str(job), comms, _busbw(n), at, n + 1, job=str(job))
                if n % per_job == per_job - 1:
                    (root / str(job) / ".ended").touch()
                    os.utime(root / str(job) / ".ended", (at, at))
                reading = reader.read(at + 1)
                record.took(shapes.take(reading.collectives, at + 1), reading, at + 1, {})
                if n % 120 == 119:
                    hourly.append(_kept_by_group())
                    log(f"memory: hour {len(hourly)}: {hourly[-1]}")
        finally:
            tracemalloc.stop()
        return {
            "hours": hours,
            "kept_bytes_each_hour": hourly,
            "growth_per_hour_after_the_first": {
                group: (hourly[-1][group] - hourly[0][group]) / (len(hourly) - 1)
                for group in hourly[0]
            }
            if len(hourly) > 1
            else None,
            "jobs_removed": record.view().removed,
            "reader_files_tracked": len(reader._seen),
            "shapes_pending": sum(len(v) for v in shapes.pending.values()),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 h of dumps, 10 s daemons")
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--reads", type=int, default=240)
    parser.add_argument("--daemon-s", type=float, default=60.0)
    args = parser.parse_args()
    hours, reads, daemon_s = (
        (2.0, 40, 10.0) if args.quick else (args.hours, args.reads, args.daemon_s)
    )
    doc: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "setup": {"ranks": 8, "communicators": len(training_comms()), "dump_interval_s": EVERY},
    }
    log("read cost, textfile dumps")
    prom = read_cost("prom", reads)
    log("read cost, JSON lines")
    jsonl = read_cost("json", reads)
    doc["read"] = {
        "prom": prom,
        "json": jsonl,
        "ratio_prom_over_json": prom["cpu_s_per_read"]["median"]
        / jsonl["cpu_s_per_read"]["median"],
        "budget_share_of_a_core": 0.01,
    }
    log("daemon cost from outside: without, then with inspector")
    without = daemon_cost(daemon_s, with_inspector=False)
    with_ = daemon_cost(daemon_s, with_inspector=True)
    per_dump = (with_["cpu_s"] - without["cpu_s"]) / max(1, with_["dumps"])
    doc["daemon"] = {
        "without_inspector": without,
        "with_inspector": with_,
        "added_cpu_s_per_dump": per_dump,
        "added_share_of_a_core_at_30s": per_dump / EVERY,
    }
    log(f"memory over {hours:g} h of dumps")
    doc["memory"] = memory(hours)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
