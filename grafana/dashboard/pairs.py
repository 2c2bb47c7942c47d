"""The GPU pairs row: each pair's busbw against its path class, suspects, topology."""

from __future__ import annotations

from .builders import (
    GPU,
    GREEN,
    PAIR,
    PROBE,
    RATIO_STEPS,
    RED,
    SUSPECT_STEPS,
    Layout,
    colored_cells,
    field,
    hide_columns,
    increase_bars,
    state_mapping,
    state_timeline,
    table,
    target,
    thresholds,
    timeseries,
    value_table,
)


def pairs_row(layout: Layout) -> None:
    """GPU pairs: the pair matrix per node, the worst pairs, suspect GPUs, measurement age."""
    layout.row("GPU pairs")
    matrix = table(
        "GPU-pair matrix: busbw / path-class median",
        "Each cell is one GPU pair's busbw over the median of pairs of the same path class "
        "(NV18 with NV18, PIX with PIX); red cells are suspect. One matrix per node.",
        [
            target(
                f"max by (gpu, peer_gpu) (netmon_link_busbw_ratio{{{PAIR}}})",
                instant=True,
                table=True,
            )
        ],
        [
            {
                "id": "groupingToMatrix",
                "options": {"columnField": "peer_gpu", "rowField": "gpu", "valueField": "Value"},
            }
        ],
        # The numeric columns are the peers' ratios; the first column names the row's GPU.
        overrides=[field("byType", "number", colored_cells(RATIO_STEPS, "percentunit"))],
    )
    matrix.update({"repeat": "instance", "repeatDirection": "h", "maxPerRow": 2})
    layout.add(matrix, w=12, h=9)
    layout.add(
        table(
            "GPU pairs, worst first",
            "Pairs by their ratio to the path-class median (coloured: under 70 % red, under "
            "90 % yellow); suspect: ok, or suspect when netmon names the pair.",
            [
                target(f"netmon_link_busbw_ratio{{{PAIR}}}", instant=True, table=True),
                target(f"netmon_link_suspect{{{PAIR}}}", ref="B", instant=True, table=True),
            ],
            [
                {"id": "merge", "options": {}},
                hide_columns(rename={"Value #A": "ratio", "Value #B": "suspect"}),
            ],
            # Each value column its own colours: the ratio's thresholds on the 0/1 suspect
            # column painted a healthy pair (0) red and a suspect one (1) green.
            overrides=[
                field("byName", "ratio", colored_cells(RATIO_STEPS, "percentunit")),
                field(
                    "byName",
                    "suspect",
                    colored_cells(
                        SUSPECT_STEPS, "none", state_mapping(("ok", GREEN), ("suspect", RED))
                    ),
                ),
            ],
            sort_by="ratio",
        ),
        w=12,
        h=9,
    )
    layout.add(
        timeseries(
            "GPU-pair busbw",
            "busbw of each pair probe over time.",
            [
                target(
                    f"netmon_link_busbw_bytes_per_second{{{PAIR}}}",
                    "{{instance}} GPU{{gpu}}-GPU{{peer_gpu}} {{path}} {{size_bytes}} B",
                )
            ],
            "Bps",
        ),
        w=12,
        h=8,
    )
    layout.add(
        state_timeline(
            "Suspect GPUs",
            "A GPU all of whose pairs are low: the GPU or its links, not one pair.",
            [target(f"netmon_gpu_suspect{{{PAIR}}}", "{{instance}} GPU{{gpu}}")],
            state_mapping(("ok", GREEN), ("suspect", RED)),
            thresholds((None, GREEN), (1, RED)),
        ),
        w=12,
        h=8,
    )
    layout.add(
        table(
            "Topology",
            "The path class of every GPU pair (nvidia-smi topo -m: NV#, PIX, PXB, PHB, NODE, "
            "SYS), as netmon read it from NVML.",
            [target(f"netmon_topology_link_info{{{GPU}}}", instant=True, table=True)],
            [hide_columns("Value")],
        ),
        w=8,
        h=8,
    )
    layout.add(
        value_table(
            "GPU pairs: age of the last measurement",
            "How long ago each pair was last measured, oldest first. A pairs probe measures "
            "the pairs whose two GPUs are idle, so on a busy node some pairs wait for a gap "
            "between jobs; their numbers above are that old.",
            f"sort_desc(time() - netmon_link_measurement_timestamp_seconds{{{PAIR}}})",
            "age",
            [{"id": "unit", "value": "s"}],
        ),
        w=8,
        h=8,
    )
    layout.add(
        increase_bars(
            "GPU pairs not measured, by reason",
            "Pairs a sweep skipped: a GPU of the pair busy with a job (gpu_busy_*), given to a "
            "pod (gpu_allocated), paused, or held by another netmon probe (devices_busy).",
            [
                target(
                    "sum by (instance, probe, reason) "
                    f"(increase(netmon_pair_skips_total{{{PROBE}}}[$__rate_interval]))",
                    "{{instance}} {{probe}} {{reason}}",
                )
            ],
        ),
        w=8,
        h=8,
    )
