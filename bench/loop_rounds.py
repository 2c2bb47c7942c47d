"""One round of probe_vs_loop.py: every side once, and the CPU other processes took meanwhile.

Rounds alternate the order of the sides (A B, B A, ...), so that a drift of this noisy machine does
not favour one of them.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from netmon_side import run_netmon, zygote_ticks
from plain_loop import plain_times, run_plain


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def cpu_seconds() -> tuple[float, float]:
    """(CPU time the whole machine spent busy, CPU time of this process and its reaped children).

    Their difference over a round is work by other processes: the noise this round ran in.
    Steal time counts as busy: the hypervisor ran someone else on our CPU.
    """
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    busy = sum(fields[:3]) + sum(fields[5:8])
    own = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    ticks = os.sysconf("SC_CLK_TCK")
    return busy / ticks, sum(u.ru_utime + u.ru_stime for u in own) + zygote_ticks() / ticks


def foreign_share(start: float, busy: float, own: float) -> float:
    """CPU seconds other processes used since `start`, per second: 0 is a quiet machine."""
    busy_now, own_now = cpu_seconds()
    elapsed = time.monotonic() - start
    return max(0.0, (busy_now - busy) - (own_now - own)) / elapsed if elapsed > 0 else 0.0


def one_round(
    number: int, sizes: Sequence[int], iters: int, batched_iters: int, both: bool = False
) -> dict[str, Any]:
    sides: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("plain", lambda: run_plain(sizes, iters, batched_iters)),
        ("netmon_per_op", lambda: run_netmon(sizes, iters, "per_op")),
        ("netmon_batched", lambda: run_netmon(sizes, batched_iters, "batched")),
    ]
    if both:
        sides.append(("netmon_spawned", lambda: run_netmon(sizes, iters, "per_op", spawned=True)))
    # Alternate who goes first, so a drift of the machine does not favour one side.
    if number % 2:
        sides.reverse()
    start, (busy, own) = time.monotonic(), cpu_seconds()
    runs = {}
    for name, run in sides:
        runs[name] = run()
        log(f"round {number + 1}: {name} done in {runs[name]['wall_s']:.2f} s")
    plain, per_op, batched = runs["plain"], runs["netmon_per_op"], runs["netmon_batched"]
    result: dict[str, Any] = {
        "order": [name for name, _ in sides],
        # Other processes' CPU seconds per second of this round (the machine has cpu_count()).
        "foreign_cpu_share": foreign_share(start, busy, own),
        "sizes": {},
    }
    for size in sizes:
        key = str(size)
        slower_median, per_sample_max = plain_times(plain, size)
        result["sizes"][key] = {
            "plain_per_op_s": slower_median,
            "plain_per_op_per_sample_max_s": per_sample_max,
            "plain_batched_s": plain_times(plain, size, "batched_s")[0],
            "netmon_per_op_s": per_op["time_s"][key],
            "netmon_per_op_slower_rank_median_s": per_op["slower_rank_median_s"][key],
            "netmon_per_op_busbw": per_op["busbw"][key],
            "netmon_batched_s": batched["time_s"][key],
            "netmon_batched_busbw": batched["busbw"][key],
        }
        if both:
            result["sizes"][key]["netmon_spawned_busbw"] = runs["netmon_spawned"]["busbw"][key]
    result["plain_wall_s"] = plain["wall_s"]
    result["plain_outside_timed_s"] = plain["wall_s"] - plain["timed_s"]
    result["netmon_per_op_wall_s"] = per_op["wall_s"]
    result["netmon_per_op_phases_s"] = per_op["phases_s"]
    result["torch"] = per_op["torch"]
    return result
