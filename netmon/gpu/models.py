"""The GPU model a node is known by (netmon_node_info{gpu_model}), so that a fleet's nodes are
compared with nodes of their own model: a pure choice among the names NVML gives.

One value per node, never one per GPU: a node whose probed GPUs differ (rare: a replaced board
of another model) is known by the model most of them have, on a tie the one of the lowest index,
and the daemon logs the others.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

CPU_MODEL = "cpu"  # CPU ranks (gloo): no GPU is probed
UNKNOWN_MODEL = "unknown"  # NVML could not name the probed GPUs


@dataclass(frozen=True)
class GpuName:
    """One GPU as NVML names it: its index, its UUID and its model (nvmlDeviceGetName)."""

    index: int
    uuid: str | None
    name: str | None


def probed_models(gpus: Sequence[GpuName], devices: Sequence[str] | None) -> list[str]:
    """The models of the GPUs the probes use (`devices`: indexes or UUIDs; None: every GPU), in
    index order; a GPU NVML could not name is left out."""
    wanted = None if devices is None else {d.strip() for d in devices}
    return [
        gpu.name.strip()
        for gpu in sorted(gpus, key=lambda g: g.index)
        if gpu.name
        and gpu.name.strip()
        and (wanted is None or str(gpu.index) in wanted or gpu.uuid in wanted)
    ]


def node_model(models: Sequence[str]) -> str:
    """The model most of the probed GPUs have (the first seen among equals); UNKNOWN_MODEL when
    none was named."""
    if not models:
        return UNKNOWN_MODEL
    # most_common keeps the order of first insertion among equal counts (collections docs).
    return Counter(models).most_common(1)[0][0]


def named(model: str) -> str | None:
    """`model` where it names GPUs; None for CPU ranks and GPUs NVML could not name (what a
    node of that model is expected to reach is then unknown: netmon.baseline.expect)."""
    return None if model in (CPU_MODEL, UNKNOWN_MODEL) else model
