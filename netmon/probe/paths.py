"""Path variants: the same probe under NCCL environments that force one path or algorithm.

NCCL never routes GPU-to-GPU traffic over PCIe when the GPUs share NVLink, so the honest PCIe
path is P2P disabled with SHM on: GPU -> PCIe -> host memory -> PCIe -> GPU
(docs/FACTS.md, "PCIe path").
NCCL reads these variables once per process, so every variant runs in rank processes of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

Intent = Literal["nvlink", "pcie", "any"]

VARIANTS: Mapping[str, Mapping[str, str]] = {
    "default": {},
    "pcie": {
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "0",
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_ALGO": "Ring",
    },
    "ring": {"NCCL_ALGO": "Ring"},
    "tree": {"NCCL_ALGO": "Tree"},
    "nvls": {"NCCL_ALGO": "NVLS", "NCCL_NVLS_ENABLE": "1"},
}


def variant_env(name: str) -> dict[str, str]:
    if name not in VARIANTS:
        raise ValueError(f"unknown path {name!r}; use one of {', '.join(VARIANTS)}")
    return dict(VARIANTS[name])


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
        variant_env(name)
    if len(set(names)) != len(names):
        raise ValueError("each path may appear once")
    return tuple(names)
