"""Node classes: which nodes a sweep may compare with each other. Pure.

A fleet bought in batches has more than one node type (H100 and H200, 400 and 200 Gb/s NICs,
four and eight rails). Judged as one cohort, every node of the minority type would be named
every sweep; so each node has a class, made of what the scheduler says of it (Slurm: the GPU
type and count of its gres, its features; Kubernetes: the GPU product label and count), and a
sweep matches and judges nodes within their class (netmon.sweep.locate.plan,
netmon.sweep.locate.localise). The backend follows the class: NCCL where every node of a pair has
GPUs, gloo otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# gres as sinfo %G prints it: "gpu:8", "gpu:h100:8(S:0-1)", "gpu:a100:4,gpu:a10:2", "(null)".
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::([^:,(]+))?:(\d+)")


def gpus_of(gres: str) -> int:
    """GPUs in sinfo's %G."""
    return sum(int(m.group(2)) for m in _GPU_GRES.finditer(gres))


def gpu_types(gres: str) -> list[str]:
    """The GPU types of sinfo's %G, as written ("gpu:8" has none)."""
    return sorted({m.group(1) for m in _GPU_GRES.finditer(gres) if m.group(1)})


def node_class(gpus: int, types: Iterable[str] = (), features: Iterable[str] = ()) -> str:
    """A node's class: its GPU type(s) and count (or `cpu`), then its features, sorted:
    `h100x8`, `cpu`, `a100x4+ib200`."""
    kinds = "/".join(sorted(set(types))) or "gpu"
    head = f"{kinds}x{gpus}" if gpus > 0 else "cpu"
    extra = sorted({f.strip() for f in features if f.strip()})
    return "+".join([head, *extra])


def slurm_features(text: str) -> list[str]:
    """sinfo's %f (available features): "(null)" is none."""
    text = text.strip()
    if not text or text == "(null)":
        return []
    return [f for f in text.split(",") if f]


def backend_for(setting: str, gpus: Iterable[int]) -> str:
    """sweep.backend for one pair: as set, or (auto) NCCL when every node has GPUs."""
    if setting != "auto":
        return setting
    counts = list(gpus)
    return "nccl" if counts and min(counts) > 0 else "gloo"
