"""The overview row: counts to read at a glance, and the versions that run."""

from __future__ import annotations

from .builders import (
    BLUE,
    GREEN,
    NODE,
    PROBE,
    RED,
    SCOPE,
    YELLOW,
    Layout,
    hide_columns,
    stat,
    table,
    target,
    thresholds,
)


def overview_row(layout: Layout) -> None:
    """Overview: degraded series, stale probes, paused nodes, firing alerts, versions."""
    layout.row("Overview")
    layout.add(
        stat(
            "Degraded series",
            "Series whose busbw is degraded against its learned baseline (netmon_degraded).",
            [target(f"sum(netmon_degraded{{{PROBE}}})", instant=True)],
            thresholds((None, GREEN), (1, RED)),
        ),
        w=4,
        h=4,
    )
    layout.add(
        stat(
            "Stale probes",
            "Probes with no success for more than 3 of their intervals.",
            [
                target(
                    f"count((time() - netmon_probe_last_success_timestamp_seconds{{{PROBE}}}) "
                    f"> 3 * netmon_probe_interval_seconds{{{PROBE}}}) or vector(0)",
                    instant=True,
                )
            ],
            thresholds((None, GREEN), (1, YELLOW)),
        ),
        w=4,
        h=4,
    )
    layout.add(
        stat(
            "Paused nodes",
            "Nodes whose pause file exists (a Slurm job, or an operator).",
            [target(f"sum(netmon_paused{{{NODE}}})", instant=True)],
            thresholds((None, GREEN), (1, BLUE)),
        ),
        w=4,
        h=4,
    )
    layout.add(
        stat(
            "Firing netmon alerts",
            "Alerts of deploy/prometheus/netmon-rules.yaml that fire now.",
            [
                target(
                    f'count(ALERTS{{{SCOPE}, alertstate="firing", alertname=~"Netmon.*"}})'
                    " or vector(0)",
                    instant=True,
                )
            ],
            thresholds((None, GREEN), (1, RED)),
        ),
        w=4,
        h=4,
    )
    layout.add(
        table(
            "netmon versions",
            "netmon, torch and NCCL versions per node (NCCL is empty until an nccl probe ran).",
            [target(f"netmon_build_info{{{NODE}}}", instant=True, table=True)],
            [hide_columns("Value")],
        ),
        w=8,
        h=4,
    )
