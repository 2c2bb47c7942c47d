"""daemon_bench.py, part 3: the default schedule's duty cycle, each probe run as the daemon would.

Every embedded CPU default probe runs with its ranks forked by a rank zygote started beforehand
(as the daemon's is by its first probe); the duty is wall / interval.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
from collections.abc import Iterator
from typing import Any

from daemon_process import log
from node_snapshots import GPUS

from netmon.config import NetmonConfig, load_config, resolve
from netmon.probe.build import build_spec
from netmon.probe.forking import Zygote
from netmon.probe.launcher import run_probe
from netmon.probe.starting import base_env

# A bench-side cap on each duty-cycle probe: a hung probe must not hold the run for 300 s.
PROBE_CAP_S = 90.0


def _schedule(config: NetmonConfig) -> list[dict[str, Any]]:
    return [
        {
            "name": p.name,
            "op": p.op,
            "sizes": list(p.sizes),
            "interval_s": p.interval,
            "timeout_s": p.timeout,
            "warmup": p.warmup,
            "iters": p.iters,
            "batch": p.batch,
        }
        for p in config.probes or ()
    ]


@contextlib.contextmanager
def _started_zygote(config: NetmonConfig) -> Iterator[Zygote | None]:
    """The daemon's rank zygote, its one torch import paid before any run is timed."""
    if config.rank_start != "zygote":
        yield None
        return
    zygote = Zygote(sys.executable, base_env())
    try:
        warm = zygote.session()
        if warm is not None:
            warm.close()
        yield zygote
    finally:
        zygote.close()


def measure_duty_cycle(repeats: int) -> dict[str, Any]:
    config = resolve(load_config(None, environ={}), gpus=0)
    probes = config.probes or ()
    walls: dict[str, list[float]] = {p.name: [] for p in probes}
    collective: dict[str, list[float]] = {p.name: [] for p in probes}
    failures: list[str] = []
    ranks: dict[str, int] = {}
    forked = spawned = 0
    with _started_zygote(config) as zygote:
        for repeat in range(repeats):
            for probe in probes:  # interleaved, so a drift of the machine spreads over both
                spec = build_spec(probe, config)
                ranks[probe.name] = max(len(spec.devices), spec.ranks)
                cap = min(spec.timeout, PROBE_CAP_S)
                spec = spec.model_copy(
                    update={"timeout": cap, "deadlines": spec.deadlines.capped(cap)}
                )
                outcome = run_probe(spec, zygote=zygote)
                if outcome.failure is not None:
                    failures.append(f"{probe.name}: {outcome.failure.describe()}")
                walls[probe.name].append(outcome.wall_s)
                collective[probe.name].append(outcome.collective_s)
                forked += outcome.ranks_forked
                spawned += outcome.ranks_spawned
                log(f"duty: {probe.name} run {repeat + 1}: {outcome.wall_s:.2f} s")
    per_probe: dict[str, dict[str, Any]] = {}
    duty = wall_per_hour = device_per_hour = 0.0
    for probe in probes:
        wall = statistics.median(walls[probe.name])
        per_hour = 3600 / probe.interval
        per_probe[probe.name] = {
            "interval_s": probe.interval,
            "sizes": list(probe.sizes),
            "wall_s": walls[probe.name],
            "wall_s_median": wall,
            "collective_s_median": statistics.median(collective[probe.name]),
            "duty": wall / probe.interval,
            "runs_per_hour": per_hour,
            "ranks": ranks[probe.name],
            # As netmon_probe_busy_seconds_total counts: wall time x CPU ranks (or GPUs).
            "device_seconds_per_hour": per_hour * wall * ranks[probe.name],
        }
        duty += wall / probe.interval
        wall_per_hour += per_hour * wall
        device_per_hour += per_hour * wall * ranks[probe.name]
    gpu = resolve(load_config(None, environ={}), gpus=GPUS)
    return {
        "config": "netmon.config.resolve(load_config(None, environ={}), gpus=0)",
        "backend": config.backend,
        "rank_start": config.rank_start,
        "ranks_started": {"fork": forked, "spawn": spawned},
        "repeats": repeats,
        "probes": per_probe,
        "failures": failures,
        "duty": duty,
        "wall_seconds_per_hour": wall_per_hour,
        "device_seconds_per_hour": device_per_hour,
        "gpu_default_reference": {
            "gpus": GPUS,
            "run": False,
            "why": "no GPU on this machine: the nccl schedule cannot run here",
            "schedule": _schedule(gpu),
        },
    }
