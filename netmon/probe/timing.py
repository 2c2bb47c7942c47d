"""The one timing loop in the house: every rank that times a collective, a probe's (netmon.probe.
worker) or a sweep pair's (netmon.sweep.ranks.rank), times it here, as nccl-tests does: all
ranks meet, then a sample is one batch of operations timed as one and divided by its length,
with CUDA events on a GPU (the host's clock would time the launch, not the work)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def synchronize(torch: Any, dist: Any, device: Any) -> None:
    """Every rank here, its GPU's queue drained: a sample starts together everywhere."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        dist.barrier(device_ids=[device.index])
        torch.cuda.synchronize(device)
    else:
        dist.barrier()


def time_host(issue: Callable[[], None], reps: int) -> float:
    start = time.perf_counter()
    issue()
    return (time.perf_counter() - start) / reps


def time_cuda(torch: Any, issue: Callable[[], None], reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    issue()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / 1e3 / reps


def samples(
    torch: Any,
    dist: Any,
    device: Any,
    issue: Callable[[], None],
    iters: int,
    reps: int,
    on_sample: Callable[[int], None] | None = None,
) -> list[float]:
    """`iters` samples, each `issue()` (a batch of `reps` operations) timed per operation;
    `on_sample(done)` after each, outside the timed region."""
    times = []
    for done in range(1, iters + 1):
        synchronize(torch, dist, device)
        if device.type == "cuda":
            times.append(time_cuda(torch, issue, reps))
        else:
            times.append(time_host(issue, reps))
        if on_sample is not None:
            on_sample(done)
    return times
