"""The transport faults of a run: the ways NCCL's log contradicts the path its probe intended.

Within a node here, between nodes by netmon.probe.crossnode; each fault is one of a bounded set
of reasons that can be counted. Pure apart from `judge_logs`, which reads the ranks' log files.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from netmon.probe.crossnode import NET_REASONS, judge_network
from netmon.probe.nccl_debug import Intent, TransportReport, parse

# Every string `judge` can return, so an exporter can publish a zero for each before any occurs.
REASONS: tuple[str, ...] = (
    "p2p_disabled_on_nvlink",
    "p2p_disabled_by_env",
    "shm_where_nvlink_expected",
    "net_where_nvlink_expected",
    "p2p_where_pcie_expected",
    "nvls_where_pcie_expected",
    "net_where_pcie_expected",
    # Between nodes, against a node group's `transport` (netmon.probe.crossnode).
    *NET_REASONS,
)


def _p2p_disabled_by_env(report: TransportReport) -> bool:
    disable = report.env_value("NCCL_P2P_DISABLE")
    level = report.env_value("NCCL_P2P_LEVEL")
    disabled = disable is not None and disable.strip() not in ("", "0")
    # LOC (or its legacy number 0) lets P2P reach no other GPU: the same as disabling it.
    return disabled or (level is not None and level.strip().upper() in ("LOC", "0"))


def judge(report: TransportReport, intent: Intent) -> list[str]:
    """The ways the log contradicts the intended path; each string is one of REASONS.

    "nvlink": GPUs on one node should talk peer-to-peer (P2P, NVLS). "pcie": the host-memory path,
    P2P disabled and SHM on, so no P2P or NVLS inside the node. "any": only hardware faults.
    Absent connection lines prove nothing either way: check `report.observed` separately.
    """
    reasons: list[str] = []
    # NCCL's own verdict that an NVLink pair lost peer access: a fault whatever was intended.
    if report.p2p_disabled_on_nvlink:
        reasons.append("p2p_disabled_on_nvlink")
    intra = report.intra_node_transports
    if intent == "nvlink":
        if _p2p_disabled_by_env(report):
            reasons.append("p2p_disabled_by_env")
        if "shm" in intra:
            reasons.append("shm_where_nvlink_expected")
        if intra & {"net_ib", "net_socket", "net_other"}:
            reasons.append("net_where_nvlink_expected")
    elif intent == "pcie":
        if "p2p" in intra:
            reasons.append("p2p_where_pcie_expected")
        if "nvls" in report.transports:
            reasons.append("nvls_where_pcie_expected")
        if intra & {"net_ib", "net_socket", "net_other"}:
            reasons.append("net_where_pcie_expected")
    reasons.extend(judge_network(report, intent))
    return reasons


def judge_logs(logs: Iterable[Path], intent: Intent) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The transports NCCL wrote in these log files (NCCL_DEBUG_FILE, one per rank), and the ways
    they contradict the intent; nothing either way when the files are empty or missing."""
    text = "\n".join(path.read_text(errors="replace") for path in logs if path.exists())
    if not text:
        return (), ()
    report = parse(text)
    return tuple(sorted(report.transports)), tuple(judge(report, intent))
