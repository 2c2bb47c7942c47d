"""Path variants: the same probe under NCCL environments that force one path or algorithm.

NCCL never routes GPU-to-GPU traffic over PCIe when the GPUs share NVLink, so the honest PCIe
path is P2P disabled with SHM on: GPU -> PCIe -> host memory -> PCIe -> GPU
(docs/FACTS.md, "PCIe path"). The `tree` and `nvls` variants force the algorithm of the probe's
own collective only, and only where NCCL implements that algorithm for it (docs/FACTS.md,
"Algorithms"). NCCL reads these variables once per process, so every variant runs in rank
processes of its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Literal

from netmon.bandwidth import OpName
from netmon.gpu.fabric import FabricReading, nvls_supported
from netmon.probe.nccl_debug import version_tuple

# net_ib, net_socket and net are a node group's `transport` across nodes (netmon.probe.crossnode).
Intent = Literal["nvlink", "pcie", "any", "net_ib", "net_socket", "net"]

# The counted skip reason of a variant that cannot run here (see `unsupported`).
SKIP_REASON = "path_unsupported"

# Variants whose environment is the same for every op. Ring implements every collective, so these
# may force it for all of them, the worker's own barrier and gathers included, in the plain form
# that every NCCL version reads.
_FIXED: Mapping[str, Mapping[str, str]] = {
    "default": {},
    "pcie": {
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "0",
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_ALGO": "Ring",
    },
    "ring": {"NCCL_ALGO": "Ring"},
}
# Variants that force one algorithm on the probe's collective: NCCL's name of the algorithm and
# the collectives NCCL implements it for (src/graph/tuning.cc). NCCL_NVLS_ENABLE is left alone,
# so NCCL's own check for NVSwitch multicast stays in force.
_ALGORITHMS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "tree": ("Tree", ("AllReduce",)),
    "nvls": ("NVLS", ("AllReduce", "AllGather", "ReduceScatter")),
}
PATHS: tuple[str, ...] = (*_FIXED, *_ALGORITHMS)

# NCCL's name of the collective each op runs (its ncclFuncStr), the prefix of NCCL_ALGO's
# per-collective form. torch's all_gather_object gathers its pickled bytes with all_gather. The
# point-to-point ops (send/recv; alltoall is made of them) have none: NCCL_ALGO does not reach them.
NCCL_FUNCTION: Mapping[OpName, str | None] = {
    "all_reduce": "AllReduce",
    "all_gather": "AllGather",
    "all_gather_object": "AllGather",
    "reduce_scatter": "ReduceScatter",
    "broadcast": "Broadcast",
    "alltoall": None,
    "sendrecv": None,
}
# NCCL reads "function:algorithm" in NCCL_ALGO since 2.24.3; older versions take the whole entry
# for one unknown algorithm name and fall back to their own choice (docs/FACTS.md, "Algorithms").
PER_COLLECTIVE_ALGO_SINCE = (2, 24)


def runs(path: str, op: OpName) -> bool:
    """Whether the variant `path` can measure `op` at all (whatever the node)."""
    if path in _FIXED:
        # NCCL_ALGO does not reach the point-to-point ops: `ring` would measure `default` again.
        return path != "ring" or NCCL_FUNCTION[op] is not None
    return path in _ALGORITHMS and NCCL_FUNCTION[op] in _ALGORITHMS[path][1]


def cannot_run(path: str, op: OpName) -> str | None:
    """Why `path` cannot measure `op` (one line naming the fix), or None when it can."""
    if path not in PATHS:
        return _unknown(path)
    if runs(path, op):
        return None
    choices = _listed([p for p in PATHS if runs(p, op)], "or")
    if NCCL_FUNCTION[op] is None:
        return (
            f"{path} does not apply to {op}: it is point-to-point, and NCCL_ALGO only chooses "
            f"the algorithm of collectives; use {choices}"
        )
    algorithm, functions = _ALGORITHMS[path]
    # NCCL's names in netmon's spelling: AllReduce -> all_reduce.
    ops = [re.sub(r"(?<!^)(?=[A-Z])", "_", f).lower() for f in functions]
    return (
        f"{path} cannot run {op} (NCCL's {algorithm} algorithm implements {_listed(ops)} only); "
        f"use {choices}"
    )


def _unknown(path: str) -> str:
    return f"unknown path {path!r}; use one of {', '.join(PATHS)}"


def _listed(names: Sequence[str], last: str = "and") -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def variant_env(path: str, op: OpName) -> dict[str, str]:
    """The NCCL environment of `path` for a probe of `op` (ValueError where it cannot run)."""
    problem = cannot_run(path, op)
    if problem is not None:
        raise ValueError(problem)
    if path in _FIXED:
        return dict(_FIXED[path])
    algorithm, _ = _ALGORITHMS[path]
    # Only the probe's own collective: the worker's barrier (an all_reduce) and its gather of
    # timings (an all_gather) keep every algorithm NCCL may choose for them.
    return {"NCCL_ALGO": f"{NCCL_FUNCTION[op]}:{algorithm}"}


def unsupported(
    path: str,
    op: OpName,
    fabric: Sequence[FabricReading] | None = None,
    *,
    devices: Sequence[str] | None = None,
    nccl: str | None = None,
) -> str | None:
    """Why the variant cannot run on this node, as one line, or None when it may run.

    `fabric` is NVML's fabric reading of the node (netmon.gpu.nvml_links.read_fabric), an empty one
    where NVML gave none; None means it was not asked (CPU ranks, where NCCL's variables mean
    nothing). `devices` narrows it to the probe's GPUs. `nccl` is the NCCL version ranks reported
    ("2.27.5"), when known: the daemon never loads NCCL, so it is what an earlier probe's ranks
    said (ProbeEnvironment.nccl); unknown, the stricter rule of older releases applies. A reason
    is counted as the skip SKIP_REASON.
    """
    problem = cannot_run(path, op)
    if problem is not None:
        return problem
    if path not in _ALGORITHMS:
        return None
    version = version_tuple(nccl) if nccl else None
    if version is not None and version[:2] < PER_COLLECTIVE_ALGO_SINCE:
        return (
            f"{path} needs NCCL 2.24 or later to force one collective's algorithm; "
            f"the ranks run NCCL {nccl}"
        )
    if path == "nvls" and fabric is not None:
        supported, reason = nvls_supported(fabric, devices, version)
        if not supported:
            return f"nvls needs NVSwitch multicast: {reason}"
    return None


def intent(name: str, all_nvlink: bool) -> Intent:
    """What the transport log must show: P2P where NVLink joins the GPUs, host memory for pcie."""
    if name == "pcie":
        return "pcie"
    return "nvlink" if all_nvlink else "any"


def nvlink_pcie_ratio(busbw_by_path: Mapping[str, float]) -> float | None:
    """busbw on the default (NVLink) path over the PCIe path, when both were measured."""
    nvlink, pcie = busbw_by_path.get("default"), busbw_by_path.get("pcie")
    if not nvlink or not pcie:
        return None
    return nvlink / pcie


def check_names(names: Sequence[str]) -> tuple[str, ...]:
    for name in names:
        if name not in PATHS:
            raise ValueError(_unknown(name))
    if len(set(names)) != len(names):
        raise ValueError("each path may appear once")
    return tuple(names)


def check_op(paths: Sequence[str], op: OpName) -> None:
    """ValueError naming the first of `paths` that cannot measure `op`."""
    for path in paths:
        problem = cannot_run(path, op)
        if problem is not None:
            raise ValueError(problem)
