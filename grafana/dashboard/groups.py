"""The node groups row: busbw between the nodes of a group, suspect peers, membership."""

from __future__ import annotations

from .builders import (
    GREEN,
    NODE,
    PROBE,
    RED,
    Layout,
    hide_columns,
    increase_bars,
    state_mapping,
    state_timeline,
    table,
    target,
    thresholds,
    timeseries,
)


def groups_row(layout: Layout) -> None:
    """Node groups (collapsed): peer busbw, suspects, members, leaders, rejected messages."""
    layout.row("Node groups", collapsed=True)
    layout.add(
        timeseries(
            "Node-pair busbw",
            "busbw between this node and each group peer.",
            [
                target(
                    f"netmon_peer_busbw_bytes_per_second{{{PROBE}}}",
                    "{{instance}} to {{peer}} {{size_bytes}} B",
                )
            ],
            "Bps",
        ),
        w=12,
        h=8,
    )
    layout.add(
        state_timeline(
            "Suspect peers",
            "A peer that is slow with every member of the group.",
            [target(f"netmon_peer_suspect{{{PROBE}}}", "{{instance}} sees {{peer}}")],
            state_mapping(("ok", GREEN), ("suspect", RED)),
            thresholds((None, GREEN), (1, RED)),
        ),
        w=12,
        h=8,
    )
    layout.add(
        state_timeline(
            "Group members up",
            "Whether each member of a node group takes part in the group's rounds.",
            [target(f"netmon_group_member_up{{{NODE}}}", "{{group}} {{member}}")],
            state_mapping(("down", RED), ("up", GREEN)),
            thresholds((None, RED), (1, GREEN)),
        ),
        w=12,
        h=8,
    )
    layout.add(
        table(
            "Groups and leaders",
            "Members per group, and the member each node follows as leader.",
            [
                target(
                    f"max by (group) (netmon_group_members{{{NODE}}})", instant=True, table=True
                ),
                target(f"netmon_group_leader{{{NODE}}}", ref="B", instant=True, table=True),
            ],
            [hide_columns()],
        ),
        w=12,
        h=8,
    )
    layout.add(
        increase_bars(
            "Group messages rejected",
            "Group messages that failed authentication with the group's secret, by the member "
            "they claimed to come from: another secret, clocks over 30 s apart, or someone "
            "writing to a member port (alert NetmonGroupMessagesRejected).",
            [
                target(
                    "sum by (instance, group, member) (increase("
                    f"netmon_group_messages_rejected_total{{{NODE}}}[$__rate_interval]))",
                    "{{instance}} refused {{member}}",
                )
            ],
        ),
        w=24,
        h=7,
    )
