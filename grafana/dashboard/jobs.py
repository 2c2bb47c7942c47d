"""The jobs' own traffic row: the jobs' collectives, read from NCCL Inspector files."""

from __future__ import annotations

from .builders import (
    GREEN,
    NODE,
    RED,
    YELLOW,
    Layout,
    colored_cells,
    dotted,
    increase_bars,
    target,
    thresholds,
    timeseries,
    value_table,
)

JOBS = f'{NODE}, probe="jobs"'
SHAPE = "{{instance}} {{op}} {{size_bytes}} B {{path}} x{{ranks}}"
SLOW_SHARE_STEPS = thresholds((None, GREEN), (0.5, YELLOW), (0.8, RED))


def jobs_row(layout: Layout) -> None:
    """The jobs' own collectives (NCCL Inspector, docs/INSPECTOR.md), on nodes with `inspector:`."""
    layout.row("Jobs' own traffic", collapsed=True)
    layout.add(
        timeseries(
            "Jobs: busbw by shape",
            "The jobs' collectives on each node, summed per shape (op, size bucket, ranks; path "
            "node: within the node, judged like a probe; nodes: across nodes, for the fleet), "
            "with each judged shape's reference dotted.",
            [
                target(f"netmon_busbw_bytes_per_second{{{JOBS}}}", SHAPE),
                target(f"netmon_busbw_reference_bytes_per_second{{{JOBS}}}", SHAPE, ref="B"),
            ],
            "Bps",
            overrides=[dotted("B", "purple")],
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Jobs against the idle probes",
            "A node shape's busbw over the reference of the idle probe of the same op, size and "
            "ranks on that node: the yardstick. A job's collectives share the GPUs with its "
            "compute, so under 1 is usual; a fall that lasts is what to look at.",
            [
                target(
                    f"netmon_jobs_probe_ratio{{{NODE}}}",
                    "{{instance}} {{op}} {{size_bytes}} B x{{ranks}}",
                )
            ],
            "percentunit",
        ),
        w=12,
        h=8,
    )
    layout.add(
        value_table(
            "Jobs across nodes: nodes against the fleet",
            "Share of the last 6 hours each node's jobs ran their collectives across nodes under "
            "0.8 of the fleet's median for the same shape (nodes of its GPU model, at least 4). A "
            "slow node is low in every job it runs; its partners only while they share one.",
            f"sort_desc(instance:netmon_busbw_bytes_per_second:jobs_below_fleet_ratio6h{{{NODE}}})",
            "slow share (6 h)",
            colored_cells(SLOW_SHARE_STEPS, "percentunit"),
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "Jobs: collectives read and time covered",
            "Collectives read per second from the jobs' dumps (one per communicator and rank per "
            "dump: a sample), and the share of their time in the exported shapes.",
            [
                target(
                    "sum by (instance, path) "
                    f"(rate(netmon_jobs_collectives_total{{{NODE}}}[$__rate_interval]))",
                    "{{instance}} {{path}}",
                ),
                target(
                    f"netmon_jobs_time_covered_ratio{{{NODE}}}", "{{instance}} covered", ref="B"
                ),
            ],
            "none",
        ),
        w=8,
        h=8,
    )
    layout.add(
        increase_bars(
            "Jobs: files and lines not taken",
            "What the daemon refused of the Inspector files, by reason (a symlink, a file over "
            "the read limit, a line cut or not UTF-8, ...): the daemon's log names each file.",
            [
                target(
                    "sum by (instance, reason) "
                    f"(increase(netmon_jobs_rejected_total{{{NODE}}}[$__rate_interval])) > 0",
                    "{{instance}} {{reason}}",
                )
            ],
        ),
        w=8,
        h=8,
    )
