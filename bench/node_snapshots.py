"""Snapshots shaped like an 8-GPU node, for timing /metrics (daemon_bench.py, part 2)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from netmon.exposition.snapshot import LinkPoint, ProbeStats, SeriesPoint, Snapshot
from netmon.gpu.linkhealth import LinkHealth, NvLinkReading, NvLinkThroughput, PcieReading

GPUS = 8
NVLINKS = 18  # per GPU on an H100 SXM board


def _stats(
    rng: random.Random, now: float, schedule: Sequence[tuple[str, float]]
) -> dict[str, ProbeStats]:
    return {
        name: ProbeStats(
            runs=rng.randint(10, 1000),
            failures={"timeout_measure": 1},
            skips={"devices_busy": rng.randint(0, 50), "still_running": 2},
            last_success=now - 60,
            last_run=now - 60,
            duration_s=rng.uniform(2, 40),
            busy_seconds=rng.uniform(100, 10000),
            peak_device_memory=rng.randint(1 << 30, 2 << 30),
            interval_s=interval,
        )
        for name, interval in schedule
    }


def node_snapshot(now: float) -> Snapshot:
    """The snapshot of an 8-GPU node: small and large probes on two paths, plus 28 pair probes.

    The label set stays SeriesPoint's (probe, op, size_bytes, path): each GPU pair is a probe of
    its own (pairs_0_1 ...) on the nvlink and pcie paths, two sizes each. Every optional value
    (baseline, ratio, threshold) is set, so every family carries every series: an upper bound.
    """
    rng = random.Random(3)
    points = _path_points(rng, now)
    pairs = [f"pairs_{a}_{b}" for a, b in itertools.combinations(range(GPUS), 2)]
    for name in pairs:
        for path, rate in (("nvlink", 1.5e11), ("pcie", 2.4e10)):
            points.append(_point(rng, now, name, "sendrecv", 8, path, rate * 8 / 4e5))
            points.append(_point(rng, now, name, "sendrecv", 256 << 20, path, rate))
    points.sort(key=lambda p: (p.probe, p.op, p.size_bytes, p.path))
    schedule = [("small", 60.0), ("large", 900.0), *((p, 3600.0) for p in pairs)]
    return Snapshot(
        series=tuple(points),
        probes=_stats(rng, now, schedule),
        build={"version": "0.1.0", "torch": "2.5.1", "nccl": "2.21.5"},
        started_at=now - 86400,
    )


def _path_points(rng: random.Random, now: float) -> list[SeriesPoint]:
    """small (4 sizes) and large (3 sizes) all_reduce on the default and pcie paths."""
    points: list[SeriesPoint] = []
    for path, rate in (("default", 2.3e11), ("pcie", 2.2e10)):
        for size in (8, 256, 8 << 10, 64 << 10):
            small_rate = rate * size / (size + 4e5)  # latency-bound sizes
            points.append(_point(rng, now, "small", "all_reduce", size, path, small_rate))
        for size in (256 << 20, 512 << 20, 1 << 30):
            points.append(_point(rng, now, "large", "all_reduce", size, path, rate))
    return points


def _point(
    rng: random.Random, now: float, probe: str, op: str, size: int, path: str, busbw: float
) -> SeriesPoint:
    busbw *= rng.uniform(0.9, 1.1)
    return SeriesPoint(
        probe=probe,
        op=op,
        size_bytes=size,
        path=path,
        busbw=busbw,
        algbw=busbw / 1.75,
        latency_s=size / busbw,
        cv=rng.uniform(0.001, 0.2),
        measured_at=now - rng.uniform(0, 900),
        baseline=busbw * rng.uniform(0.95, 1.05),
        ratio=rng.uniform(0.9, 1.1),
        degraded=rng.random() < 0.05,
        min_busbw=busbw / 2,
    )


def linked_node_snapshot(now: float) -> Snapshot:
    """The same node as the exporter now models pairs: LinkPoints with gpu and peer_gpu labels.

    Two pairs probes (pairs, and pairs_pcie with P2P off) over 28 pairs x 2 sizes, the topology
    of an NVSwitch board (NV18 everywhere), transports, and NVML link health of 8 GPUs with 18
    NVLinks each.
    """
    rng = random.Random(4)
    pairs = list(itertools.combinations(range(GPUS), 2))
    links = [
        LinkPoint(
            probe=probe,
            size_bytes=size,
            gpu=a,
            peer_gpu=b,
            path="NV18",
            busbw=rate * rng.uniform(0.9, 1.1) * (1 if size > 8 else 2e-5),
            ratio=rng.uniform(0.9, 1.1),
            low=False,
            suspect=False,
        )
        for probe, rate in (("pairs", 1.5e11), ("pairs_pcie", 2.4e10))
        for a, b in pairs
        for size in (8, 256 << 20)
    ]
    health = LinkHealth(
        pcie=tuple(PcieReading(gpu, 5, 5, 16, 16, 0) for gpu in range(GPUS)),
        nvlinks=tuple(
            NvLinkReading(gpu, link, True, 0, 0, 0, 0)
            for gpu in range(GPUS)
            for link in range(NVLINKS)
        ),
        throughput=tuple(NvLinkThroughput(gpu, 1 << 40, 1 << 40) for gpu in range(GPUS)),
        under_load=True,
        read_at=now - 30,
    )
    schedule = [("small", 60.0), ("large", 900.0), ("pairs", 3600.0), ("pairs_pcie", 3600.0)]
    return Snapshot(
        series=tuple(sorted(_path_points(rng, now), key=lambda p: (p.probe, p.size_bytes, p.path))),
        probes=_stats(rng, now, schedule),
        build={"version": "0.1.0", "torch": "2.5.1", "nccl": "2.21.5"},
        started_at=now - 86400,
        links=tuple(links),
        pair_members={"pairs": tuple(range(GPUS)), "pairs_pcie": tuple(range(GPUS))},
        topology=tuple((a, b, "NV18") for a, b in pairs),
        transports=(
            ("large", "default", "nvls"),
            ("large", "default", "p2p"),
            ("large", "pcie", "shm"),
            ("small", "default", "p2p"),
            ("small", "pcie", "shm"),
            ("pairs", "NV18", "p2p"),
            ("pairs_pcie", "NV18", "shm"),
        ),
        link_health=health,
    )
