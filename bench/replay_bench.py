"""Replay and the verdict's per-result cost: `netmon replay` on a month of one series and on a
week of 20 series interleaved in time order, and BaselineBook.observe's own cost per result.

Each figure comes from a child process (its user+sys CPU seconds and maximum RSS from wait4),
so the runs do not share a heap. With --baseline DIR the same figures are taken with the
netmon package of DIR (e.g. a `git worktree` of the commit before a change), in turn with this
checkout's, and the document holds both side by side: the least CPU of --repeats runs each.
The week of 20 series is timed with --json only: a run of it takes minutes here.

    python bench/replay_bench.py [--baseline /tmp/netmon-before] [--repeats 2] [--quick]

The streams are bench/streams.py's: a month of `healthy --seed 5` (43,200 results), and 20
series of a week each (healthy, swing, wander, cut, step, flap, decline by turns; 201,600
results). One JSON document goes to stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import streams as s

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("healthy", "swing", "wander", "cut", "step", "flap", "decline")


def month(path: Path, days: float = 30.0) -> None:
    """One series: `python bench/streams.py healthy --days 30 --seed 5`."""
    _write(path, s.main_stream(["healthy", "--days", str(days), "--seed", "5"]))


def many(path: Path, series: int = 20, days: float = 7.0) -> None:
    """`series` series of `days` each, one shape each by turns, interleaved in time order (a
    stable sort: at one time, the series in their order)."""
    results: list[dict[str, Any]] = []
    for n in range(series):
        kind = KINDS[n % len(KINDS)]
        labels = {**s.SERIES, "size": (256 << 20) + n}  # a key of its own, judged like 256 MiB
        argv = [kind, "--days", str(days), "--seed", str(100 + n)]
        results += [{**r, **labels} for r in s.main_stream(argv)]
    results.sort(key=lambda r: r["t"])
    _write(path, iter(results))


def _write(path: Path, results: Iterator[dict[str, Any]]) -> None:
    with path.open("w") as out:
        for result in results:
            out.write(json.dumps(result) + "\n")


def measured(argv: Sequence[str], tree: Path) -> dict[str, Any]:
    """Run `argv` in `tree`, its netmon first on the path (`python -m` puts the working
    directory first), its output thrown away: its CPU seconds and maximum RSS."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.TemporaryFile() as err:
        wall = time.monotonic()
        child = subprocess.Popen(argv, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.monotonic() - wall
        child.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        message = err.read().decode()
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({child.returncode}): {message[-2000:]}")
    return {
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "wall_s": round(wall, 2),
        "max_rss_mb": round(usage.ru_maxrss / 1024, 1),  # ru_maxrss is in KiB on Linux
    }


def observe_cost(stream: Path) -> dict[str, Any]:
    """In this process (a child of the bench): the results parsed first, then only
    BaselineBook.observe timed, as the daemon calls it (no restarts, no pauses)."""
    import netmon
    from netmon.baseline import BaselineBook, BaselinePolicy

    rows = [json.loads(line) for line in stream.read_text().splitlines()]
    book = BaselineBook(BaselinePolicy())
    calls = [
        ((r["probe"], r["op"], r["size"], r["path"], r["ranks"]), r["busbw"], r["t"]) for r in rows
    ]
    start = time.process_time()
    for key, busbw, at in calls:
        book.observe(key, busbw, 0.0, None, at=at)
    cpu = time.process_time() - start
    return {
        "results": len(calls),
        "observe_us": round(1e6 * cpu / len(calls), 1),
        "netmon": str(Path(netmon.__file__).parent),  # the tree it measured
    }


def figures(tree: Path, stream: Path, every: bool) -> dict[str, Any]:
    """One tree's figures on one stream: the command with --json, and unless `every` is False
    without it (the summary) and observe() alone."""
    python = sys.executable
    lines = measured([python, "-m", "netmon", "replay", "--json", str(stream)], tree)
    if not every:
        return {"json": lines}
    summary = measured([python, "-m", "netmon", "replay", str(stream)], tree)
    child = subprocess.run(
        [python, str(Path(__file__).resolve()), "--observe", str(stream)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    return {"summary": summary, "json": lines, "observe": json.loads(child.stdout)}


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The least CPU of the runs (another job on the machine only ever adds to it), the most
    memory, and every run's figures, for the spread."""
    figures: dict[str, Any] = {
        "json_cpu_s": min(r["json"]["cpu_s"] for r in runs),
        "max_rss_mb": max(c["max_rss_mb"] for r in runs for k, c in r.items() if k != "observe"),
    }
    if "observe" in runs[0]:
        figures["summary_cpu_s"] = min(r["summary"]["cpu_s"] for r in runs)
        figures["observe_us"] = min(r["observe"]["observe_us"] for r in runs)
        figures["results"] = runs[0]["observe"]["results"]
    return figures | {"runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        type=Path,
        help="another checkout (git worktree add DIR COMMIT): its netmon is measured too, in "
        "turn with this one's",
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of each (default 1)")
    parser.add_argument("--quick", action="store_true", help="a day, 3 series: a smoke run")
    parser.add_argument("--observe", type=Path, help=argparse.SUPPRESS)  # the children's modes
    parser.add_argument("--write", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.observe:
        print(json.dumps(observe_cost(args.observe)))
        return 0
    if args.write:
        month(args.write / "month.jsonl", 1.0 if args.quick else 30.0)
        many(args.write / "week20.jsonl", 3 if args.quick else 20, 1.0 if args.quick else 7.0)
        return 0
    trees = {"this": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    doc: dict[str, Any] = {
        "benchmark": "replay_bench",
        "date": time.strftime("%Y-%m-%d"),
        "host": {"cpus": os.cpu_count(), "load_before": os.getloadavg()},
    }
    with tempfile.TemporaryDirectory(prefix="replay-bench-") as tmp:
        streams = {"month": Path(tmp, "month.jsonl"), "week20": Path(tmp, "week20.jsonl")}
        # Written by a child: a child's maximum RSS counts the parent's pages it forked with.
        quick = ["--quick"] if args.quick else []
        subprocess.run([sys.executable, __file__, "--write", tmp, *quick], check=True)
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            name: {side: [] for side in trees} for name in streams
        }
        for repeat in range(args.repeats):
            for name, stream in streams.items():
                sides = list(trees.items())
                # Each side takes each place in the order in turn.
                for side, tree in sides[repeat % len(sides) :] + sides[: repeat % len(sides)]:
                    print(f"replay_bench: {name} {side} run {repeat + 1}", file=sys.stderr)
                    runs[name][side].append(figures(tree, stream, every=name == "month"))
    doc["streams"] = {
        name: {side: best(r) for side, r in sides.items()} for name, sides in runs.items()
    }
    doc["host"]["load_after"] = os.getloadavg()
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
