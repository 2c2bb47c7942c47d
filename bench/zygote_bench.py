"""What one small probe costs the node, with ranks forked by the rank zygote and spawned as new
interpreters, side by side in one run (issue 14).

Measured from outside on `netmon serve` (gloo, 2 CPU ranks, one all_reduce probe of 8 B and
1 KiB every second): the CPU time of the daemon and all its descendants over a window, divided by
the runs the daemon counted in it, and the wall time of each run in it (the daemon's `probe ok`
log lines, which `netmon_probe_duration_seconds` exports). The two ways alternate, phase by phase
(zygote, spawn, spawn, zygote, ...), each phase a fresh daemon whose window starts after its
first run (so the zygote's one torch import is reported apart, not spread over the window).

A third way, `floor`, is what no way of starting ranks can go under: the same collectives as one
run of that probe (per size its warm-up ops, a barrier, 20 samples of a barrier and 5 timed ops,
and the gather of the samples), every second, in two rank processes that import torch once and
keep their process group for the whole window. Its CPU per run is the collectives' own cost;
each way's `overhead_cpu_s_per_run` is its figure minus the floor's.

    python bench/zygote_bench.py [--phases 4] [--window 40]

One JSON document goes to stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_process import PROBE_OK, Daemon, log
from plain_loop import BATCH, BATCHED_ITERS, FLOAT32_BYTES, HOST, WARMUP, _free_port, _plain_env
from scrapes import parse_samples

from netmon.probe.processes import descendants_of
from netmon.probe.rankcpu import CPU_PHASES

TICKS = os.sysconf("SC_CLK_TCK")
TARGET_CPU_S, TARGET_WALL_S = 0.5, 1.0  # per small run, on this 2-core machine (issue 14)
SIZES = (8, 1024)  # the probe's, as in config() below
INTERVAL_S = 1.0
METHODS = ("zygote", "spawn", "floor")
RANK_CPU = re.compile(r"probe ok .*?rank_cpu=(\S+)")


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


def _times(pid: int) -> tuple[float, float]:
    """A process's own CPU time and its reaped children's (/proc/PID/stat: utime + stime,
    cutime + cstime), or zeros once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS, (int(fields[13]) + int(fields[14])) / TICKS


def zygote_pid(pid: int) -> int | None:
    for member in descendants_of(pid):
        try:
            if b"netmon.probe.zygote" in Path(f"/proc/{member}/cmdline").read_bytes():
                return member
        except OSError:
            continue
    return None


def parts_cpu_s(daemon_pid: int) -> dict[str, float]:
    """The outside figure by part: the daemon itself, the zygote itself, and the ranks it reaped
    (its children's time; spawned ranks are the daemon's children)."""
    own, children = _times(daemon_pid)
    zygote = zygote_pid(daemon_pid)
    z_own, z_children = _times(zygote) if zygote is not None else (0.0, 0.0)
    return {
        "daemon": own,
        "zygote": z_own,
        "ranks": z_children + children,
        "tree": tree_cpu_s(daemon_pid),
    }


def rank_phases(log_text: str, skip: int) -> list[dict[str, float]]:
    """Each run's rank CPU by phase, as the daemon logged it (netmon.probe.rankcpu), after the
    first `skip` runs."""
    runs = []
    for match in RANK_CPU.findall(log_text)[skip:]:
        runs.append({k: float(v) for k, v in (part.split(":") for part in match.split(","))})
    return runs


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


def phase(method: str, window_s: float, baseline: str | None = None) -> dict[str, Any]:
    """One way's window; `baseline` is ranks forked by the zygote of another checkout's netmon."""
    with tempfile.TemporaryDirectory(prefix="netmon-zygote-bench-") as directory:
        workdir = Path(directory)
        start = "zygote" if method == "baseline" else method
        daemon = Daemon(workdir, config(workdir, start), baseline if method == "baseline" else None)
        try:
            deadline = time.monotonic() + 120
            while runs(daemon) < 2:  # the first run finished, the second begun
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no run within 120 s: {daemon.log()[-1500:]}")
                time.sleep(0.2)
            zygote = zygote_pid(daemon.proc.pid)
            zygote_s = _times(zygote)[0] if zygote is not None else None
            before_log = len(PROBE_OK.findall(daemon.log()))
            parts0 = parts_cpu_s(daemon.proc.pid)
            cpu0, runs0, t0 = parts0["tree"], runs(daemon), time.monotonic()
            time.sleep(window_s)
            # At least one run in the window, however long a run takes on a loaded host (a
            # spawned one took 5.2 s beside a CPU hog): a window of none measures nothing.
            deadline = time.monotonic() + 120
            while runs(daemon) == runs0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no run within 120 s: {daemon.log()[-1500:]}")
                time.sleep(0.05)
            parts1 = parts_cpu_s(daemon.proc.pid)
            cpu1, runs1, t1 = parts1["tree"], runs(daemon), time.monotonic()
            text = daemon.log()
            walls = [float(w) for _, w in PROBE_OK.findall(text)[before_log:]]
            phases = rank_phases(text, before_log)
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
        # Outside, by part (per run): the parts add up to cpu_s_per_run.
        "outside_cpu_s_per_run": {
            part: round((parts1[part] - parts0[part]) / counted, 4) if counted else None
            for part in ("daemon", "zygote", "ranks")
        },
        # Inside: what the ranks marked and their reaper added, the mean run in the window
        # (the runs logged there, which can differ from those counted by one at either end).
        "inside_rank_cpu_s_per_run": _mean_phases(phases),
        "exit_code": code,
        "leftover_processes": leftovers,
    }
    log(f"{method}: {result}")
    return result


def _mean_phases(runs: list[dict[str, float]]) -> dict[str, float] | None:
    if not runs:
        return None
    names = [phase for phase in CPU_PHASES if any(phase in run for run in runs)]
    mean = {
        phase: round(sum(run.get(phase, 0.0) for run in runs) / len(runs), 4) for phase in names
    }
    return {**mean, "total": round(sum(mean.values()), 4)}


# ---- the floor: the probe's collectives alone, in two long-lived processes ----


def floor_rank(rank: int, port: int) -> None:
    """One rank of the floor: one run's collectives every INTERVAL_S until killed; rank 0 prints
    a line after each run."""
    import datetime
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")  # as the worker: all_gather_into_tensor's deprecation
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore(  # type: ignore[attr-defined]
        HOST, port, 2, is_master=rank == 0, timeout=timeout
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
    tensors = [torch.zeros(max(1, size // FLOAT32_BYTES)) for size in SIZES]
    done = 0
    while True:
        start = time.monotonic()
        for tensor in tensors:
            for _ in range(WARMUP):
                dist.all_reduce(tensor)
            dist.barrier()
            times = []
            for _ in range(BATCHED_ITERS):
                dist.barrier()
                began = time.perf_counter()
                for _ in range(BATCH):
                    dist.all_reduce(tensor)
                times.append(time.perf_counter() - began)
            mine = torch.tensor(times, dtype=torch.float64)
            everyone = torch.zeros(2 * len(times), dtype=torch.float64)
            dist.all_gather_into_tensor(everyone, mine)
        done += 1
        if rank == 0:
            print(json.dumps({"runs": done}), flush=True)
        time.sleep(max(0.0, start + INTERVAL_S - time.monotonic()))


def floor_phase(window_s: float) -> dict[str, Any]:
    port = _free_port()  # a race with another process is possible; the rank would then fail
    with tempfile.TemporaryFile() as out:
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, f"--floor-rank={rank}", f"--port={port}"],
                stdout=out if rank == 0 else subprocess.DEVNULL,
                env=_plain_env(),
                start_new_session=True,
            )
            for rank in range(2)
        ]

        def floor_runs() -> int:
            out.seek(0)
            lines = out.read().decode().splitlines(keepends=True)
            complete = [line for line in lines if line.endswith("\n")]
            return int(json.loads(complete[-1])["runs"]) if complete else 0

        try:
            deadline = time.monotonic() + 120
            while floor_runs() < 1:
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError("the floor's ranks did not finish a run within 120 s")
                time.sleep(0.2)
            cpu0, runs0 = sum(tree_cpu_s(p.pid) for p in procs), floor_runs()
            time.sleep(window_s)
            cpu1, runs1 = sum(tree_cpu_s(p.pid) for p in procs), floor_runs()
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    counted = runs1 - runs0
    result = {
        "method": "floor",
        "window_s": window_s,
        "runs": counted,
        "cpu_s": round(cpu1 - cpu0, 3),
        "cpu_s_per_run": round((cpu1 - cpu0) / counted, 4) if counted else None,
    }
    log(f"floor: {result}")
    return result


def _median_of(dicts: list[dict[str, float]]) -> dict[str, float]:
    keys = [k for k in dicts[0] if all(d.get(k) is not None for d in dicts)] if dicts else []
    return {k: round(statistics.median(d[k] for d in dicts), 4) for k in keys}


def _breakdown(mine: list[dict[str, Any]]) -> dict[str, Any]:
    """The zygote's figure by part from outside and by phase from inside, medians over phases,
    and how far the ranks' two figures lie apart (they count the same CPU: wait4's rusage is
    what the zygote's cutime adds up)."""
    outside = _median_of([p["outside_cpu_s_per_run"] for p in mine])
    inside = _median_of(
        [p["inside_rank_cpu_s_per_run"] for p in mine if p.get("inside_rank_cpu_s_per_run")]
    )
    gap = None
    if "ranks" in outside and "total" in inside and outside["ranks"]:
        gap = round((inside["total"] - outside["ranks"]) / outside["ranks"], 3)
    return {
        "outside_by_part": outside,
        "inside_rank_by_phase": inside,
        "inside_vs_outside_ranks": gap,
    }


def summary(phases: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, dict[str, Any]] = {}
    methods = [m for m in (*METHODS, "baseline") if any(p["method"] == m for p in phases)]
    for method in methods:
        mine = [p for p in phases if p["method"] == method and p["cpu_s_per_run"] is not None]
        by[method] = {"cpu_s_per_run_median": statistics.median(p["cpu_s_per_run"] for p in mine)}
        if method != "floor":
            by[method]["wall_s_median"] = statistics.median(p["wall_s_median"] for p in mine)
    for method in ("zygote", "baseline"):
        if method in by:
            by[method].update(_breakdown([p for p in phases if p["method"] == method]))
    zygote, floor = by["zygote"], by["floor"]["cpu_s_per_run_median"]
    for method in set(methods) - {"floor"}:
        by[method]["overhead_cpu_s_per_run"] = round(by[method]["cpu_s_per_run_median"] - floor, 4)
    compared: dict[str, Any] = {}
    if "baseline" in by:
        base = by["baseline"]
        compared["zygote_minus_baseline_cpu_s_per_run"] = round(
            zygote["cpu_s_per_run_median"] - base["cpu_s_per_run_median"], 4
        )
        compared["ratio_zygote_over_baseline_overhead"] = round(
            zygote["overhead_cpu_s_per_run"] / base["overhead_cpu_s_per_run"], 3
        )
    if "spawn" in by:
        compared["ratio_spawn_over_zygote"] = _spawn_ratios(by["spawn"], zygote)
    return {
        **by,
        **compared,
        "floor_share_of_zygote_cpu": round(floor / zygote["cpu_s_per_run_median"], 3),
        "targets": {"cpu_s_per_run": TARGET_CPU_S, "wall_s": TARGET_WALL_S},
        "zygote_within_targets": zygote["cpu_s_per_run_median"] <= TARGET_CPU_S
        and zygote["wall_s_median"] <= TARGET_WALL_S,
    }


def _spawn_ratios(spawn: dict[str, Any], zygote: dict[str, Any]) -> dict[str, float]:
    return {
        "cpu_s_per_run": round(spawn["cpu_s_per_run_median"] / zygote["cpu_s_per_run_median"], 2),
        "wall_s": round(spawn["wall_s_median"] / zygote["wall_s_median"], 2),
        "overhead_cpu_s_per_run": round(
            spawn["overhead_cpu_s_per_run"] / zygote["overhead_cpu_s_per_run"], 1
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", type=int, default=4, help="phases per method (default 4)")
    parser.add_argument("--window", type=float, default=40.0, help="seconds per phase window")
    parser.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="the ways to measure, in turn (default zygote,spawn,floor; zygote and floor needed)",
    )
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="another checkout (git worktree add DIR COMMIT): its netmon is measured too, as "
        "method baseline, in turn with this one's",
    )
    parser.add_argument("--floor-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_rank is not None:
        floor_rank(args.floor_rank, args.port)
        return 0
    methods = [m for m in args.methods.split(",") if m] + (["baseline"] if args.baseline else [])
    if not {"zygote", "floor"} <= set(methods) or not set(methods) <= {*METHODS, "baseline"}:
        parser.error(f"--methods: zygote and floor, and spawn if you like (got {args.methods})")
    order: list[str] = []
    for i in range(args.phases):
        # Each way takes each place in the order in turn.
        order += [methods[(i + j) % len(methods)] for j in range(len(methods))]
    phases = [
        floor_phase(args.window) if method == "floor" else phase(method, args.window, args.baseline)
        for method in order
    ]
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
