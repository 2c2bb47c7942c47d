"""The cluster sweeps row: each node's share of the last sweep, as its daemon exports it."""

from __future__ import annotations

from .builders import (
    GREEN,
    NODE,
    RATIO_STEPS,
    RED,
    YELLOW,
    Layout,
    colored_cells,
    field,
    hide_columns,
    increase_bars,
    table,
    target,
    thresholds,
    value_table,
)

AGE_STEPS = thresholds((None, GREEN), (3 * 86400, YELLOW))  # NetmonSweepStale's 3 days


def sweeps_row(layout: Layout) -> None:
    """Cluster sweeps (netmon sweep): each node's share of the last sweep, from its daemon."""
    layout.row("Cluster sweeps", collapsed=True)
    ratio = f"netmon_sweep_busbw_ratio{{{NODE}}}"
    layout.add(
        table(
            "Sweeps: worst cables",
            "The 20 lowest rails of the last sweep of each node: busbw with each peer over the "
            "pair's expected level (coloured: under 70 % red, under 90 % yellow). Each pair is "
            "listed by both its nodes.",
            [
                target(f"bottomk(20, {ratio})", instant=True, table=True),
                target(
                    f"netmon_sweep_busbw_bytes_per_second{{{NODE}}} and bottomk(20, {ratio})",
                    ref="B",
                    instant=True,
                    table=True,
                ),
            ],
            [
                {"id": "merge", "options": {}},
                hide_columns(rename={"Value #A": "ratio", "Value #B": "busbw"}),
            ],
            overrides=[
                field("byName", "ratio", colored_cells(RATIO_STEPS, "percentunit")),
                field("byName", "busbw", [{"id": "unit", "value": "Bps"}]),
            ],
            sort_by="ratio",
        ),
        w=12,
        h=9,
    )
    layout.add(
        value_table(
            "Sweeps: suspects",
            "Nodes the last sweep named, with the sweeps in a row that named them (alert "
            "NetmonSweepSuspect at 2). An empty peer: the node itself; a peer: the path "
            "between the two.",
            f"sort_desc(netmon_sweep_suspect_sweeps{{{NODE}}}"
            " * on(cluster, job, instance) group_right()"
            f" (netmon_sweep_suspect{{{NODE}}} == 1))",
            "sweeps in a row",
            colored_cells(thresholds((None, YELLOW), (2, RED)), "none"),
        ),
        w=12,
        h=9,
    )
    layout.add(
        value_table(
            "Sweeps: age of the last sweep",
            "How long ago the last sweep delivered to each node finished, oldest first "
            "(yellow past 3 days: alert NetmonSweepStale). A node busy with jobs at every "
            "sweep is not swept.",
            f"sort_desc(time() - netmon_sweep_last_timestamp_seconds{{{NODE}}})",
            "age",
            colored_cells(AGE_STEPS, "s"),
        ),
        w=8,
        h=8,
    )
    layout.add(
        value_table(
            "Sweeps: named in the last 12",
            "Nodes that any of their last 12 sweeps named, with the onsets: the sweeps that "
            "named the node after one that had not. 1 is a fault that stayed (or one naming); "
            "3 or more, one that comes and goes (alert NetmonSweepSuspectFlapping).",
            f"sort_desc(netmon_sweep_suspect_onsets{{{NODE}}} > 0)",
            "onsets",
            colored_cells(thresholds((None, YELLOW), (3, RED)), "none"),
        ),
        w=8,
        h=8,
    )
    layout.add(
        increase_bars(
            "Sweep reports by outcome",
            "Reports POSTed to each daemon's /sweep: accepted, malformed, or refused (another "
            "secret, another node's, stale or replayed; the daemon's log says which).",
            [
                target(
                    "sum by (instance, outcome) "
                    f"(increase(netmon_sweep_reports_total{{{NODE}}}[$__rate_interval]))",
                    "{{instance}} {{outcome}}",
                )
            ],
        ),
        w=8,
        h=8,
    )
