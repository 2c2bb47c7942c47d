"""The bandwidth and latency row: busbw and latency per probe and size, and their verdicts."""

from __future__ import annotations

from .builders import (
    BLUE,
    FLEET,
    GREEN,
    PROBE,
    RATIO_STEPS,
    RED,
    SCOPE,
    SERIES,
    YELLOW,
    Layout,
    colored_cells,
    dashed,
    dotted,
    field,
    hide_columns,
    reasons_bars,
    state_mapping,
    state_timeline,
    table,
    target,
    thresholds,
    timeseries,
)


def bandwidth_row(layout: Layout) -> None:
    """Bandwidth and latency: the figures, their baselines, the verdicts and why."""
    layout.row("Bandwidth and latency")
    layout.add(
        timeseries(
            "Bus bandwidth by size",
            "busbw (nccl-tests definition) of every probe and size; dashed: the learned "
            "baseline; dotted: the long-term reference, which never drifts down (only "
            "netmon rebaseline or new hardware lowers it); red dashed: the probe's configured "
            "min_busbw.",
            [
                target(f"netmon_busbw_bytes_per_second{{{PROBE}}}", SERIES),
                target(
                    f"netmon_busbw_baseline_bytes_per_second{{{PROBE}}}",
                    "baseline " + SERIES,
                    ref="B",
                ),
                target(
                    f"netmon_busbw_threshold_bytes_per_second{{{PROBE}}}",
                    "min " + SERIES,
                    ref="C",
                ),
                target(
                    f"netmon_busbw_reference_bytes_per_second{{{PROBE}}}",
                    "reference " + SERIES,
                    ref="D",
                ),
            ],
            "Bps",
            overrides=[dashed("B", "text"), dashed("C", RED), dotted("D", "purple")],
        ),
        w=12,
        h=9,
    )
    layout.add(
        timeseries(
            "Latency by size",
            "Median time per op (slowest rank per sample); small sizes show latency.",
            [target(f"netmon_latency_seconds{{{PROBE}}}", SERIES)],
            "s",
        ),
        w=12,
        h=9,
    )
    layout.add(
        timeseries(
            "Ratio to baseline",
            "Latest busbw / learned baseline. The dashed line is the default degradation "
            "ratio (baseline.ratio 0.8); a single dip under it is noise until netmon_degraded "
            "says otherwise.",
            [target(f"netmon_busbw_baseline_ratio{{{PROBE}}}", SERIES)],
            "percentunit",
            steps=thresholds((None, RED), (0.8, GREEN)),
        ),
        w=12,
        h=8,
    )
    layout.add(
        state_timeline(
            "Degraded verdicts",
            "netmon_degraded per series: red while the series is degraded, for one of the "
            "reasons of the panel 'Degraded series by reason'; green again once it recovers. "
            "Only judged series can turn red (table 'Verdicts, series by series').",
            [target(f"netmon_degraded{{{PROBE}}}", SERIES)],
            state_mapping(("healthy", GREEN), ("degraded", RED)),
            thresholds((None, GREEN), (1, RED)),
        ),
        w=12,
        h=8,
    )
    layout.add(
        table(
            "Verdicts, series by series",
            "judged: the series can turn degraded; shown only: a latency-bound size (under "
            "baseline.latency_bound_below, 1 MiB by default) that is learned and drawn but "
            "never paged on. low bound: a result under it is low (min of R x baseline and "
            "baseline - k x spread); low results: of the last N judged, M degrade; flapping: "
            "low or noisy results of the last 20 judged (4 among as many healthy degrade); "
            "reference: young (learning over its first day, provisional) or mature (fixed).",
            [
                target(f"netmon_judged{{{PROBE}}}", instant=True, table=True),
                target(
                    f"netmon_busbw_baseline_ratio{{{PROBE}}}", ref="B", instant=True, table=True
                ),
                target(
                    f"netmon_busbw_low_bound_bytes_per_second{{{PROBE}}}",
                    ref="C",
                    instant=True,
                    table=True,
                ),
                target(f"netmon_low_results{{{PROBE}}}", ref="D", instant=True, table=True),
                target(f"netmon_flapping_results{{{PROBE}}}", ref="E", instant=True, table=True),
                target(f"netmon_reference_mature{{{PROBE}}}", ref="F", instant=True, table=True),
            ],
            [
                {"id": "merge", "options": {}},
                hide_columns(
                    rename={
                        "Value #A": "judged",
                        "Value #B": "ratio",
                        "Value #C": "low bound",
                        "Value #D": "low results",
                        "Value #E": "flapping",
                        "Value #F": "reference",
                    }
                ),
            ],
            overrides=[
                field(
                    "byName",
                    "judged",
                    colored_cells(
                        thresholds((None, BLUE), (1, GREEN)),
                        "none",
                        state_mapping(("shown only", BLUE), ("judged", GREEN)),
                    ),
                ),
                field("byName", "ratio", colored_cells(RATIO_STEPS, "percentunit")),
                field("byName", "low bound", [{"id": "unit", "value": "Bps"}]),
                field(
                    "byName",
                    "reference",
                    colored_cells(
                        thresholds((None, BLUE), (1, GREEN)),
                        "none",
                        state_mapping(("young", BLUE), ("mature", GREEN)),
                    ),
                ),
            ],
            sort_by="ratio",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Degraded series by reason",
            "How many series are degraded, by the reason netmon_degraded_reason gives: "
            "flapping (low or noisy results among healthy ones), low (M of the last N judged "
            "results low), drift (the recent level under its line), decline (the long level "
            "under the reference's line). docs/SIGNAL.md has the rules.",
            [
                target(
                    f"sum by (reason) (netmon_degraded_reason{{{PROBE}}})",
                    "{{reason}}",
                )
            ],
            "none",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Node level against its fleet",
            "Each series' long level (solid; the median of its last baseline.long_window "
            "conclusive results) and its reference (dotted) over the median of the same series "
            "on the nodes of its GPU model (recording rules fleet:*:median, netmon_node_info). "
            "Dashed: 85 %, at or under which NetmonBelowFleet fires where 5 or more nodes measure "
            "the series (75 % where 3 or 4 do). A node alone is its own fleet (100 %).",
            [
                target(
                    f"instance_series:netmon_busbw_level_bytes_per_second:gpu_model{{{PROBE}}}"
                    f" / on({FLEET}) group_left() "
                    f'fleet:netmon_busbw_level_bytes_per_second:median{{{SCOPE}, probe=~"$probe"}}',
                    "level " + SERIES,
                ),
                target(
                    f"instance_series:netmon_busbw_reference_bytes_per_second:gpu_model{{{PROBE}}}"
                    f" / on({FLEET}) group_left() "
                    "fleet:netmon_busbw_reference_bytes_per_second:median"
                    f'{{{SCOPE}, probe=~"$probe"}}',
                    "reference " + SERIES,
                    ref="B",
                ),
            ],
            "percentunit",
            overrides=[dotted("B", "purple")],
            steps=thresholds((None, RED), (0.85, GREEN)),
        ),
        w=12,
        h=8,
    )
    layout.add(
        reasons_bars(
            "Inconclusive results by reason",
            "Results neither judged nor learned: settling (the first after a start), "
            "disturbed (other processes held the CPU ranks' cores: netmon_foreign_cpu_ratio), "
            "noisy (cv far over the series' usual). Many for long: netmon cannot judge here.",
            "netmon_inconclusive_results_total",
            only_positive=False,
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Disturbed share, last hour",
            "Share of each probe's results (of judged series) in the last hour that were "
            "inconclusive because other work held the CPU ranks' cores (recording rule "
            "netmon:disturbed_share:ratio1h). At 100 % nothing was judged: the verdicts are "
            "frozen. Dashed: half.",
            [
                target(
                    f"netmon:disturbed_share:ratio1h{{{PROBE}}}",
                    "{{instance}} {{probe}}",
                )
            ],
            "percentunit",
            steps=thresholds((None, GREEN), (0.5, YELLOW)),
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Time since last judged",
            "Seconds since each judged series' last conclusive result (judged, or learned "
            "while its baseline forms); since the daemon's start until its first. A healthy "
            "series stays under its probe's interval. Dashed: one hour, over which "
            "NetmonNotJudged fires while results keep coming.",
            [
                target(
                    f"time() - netmon_last_judged_timestamp_seconds{{{PROBE}}}",
                    SERIES,
                )
            ],
            "s",
            steps=thresholds((None, GREEN), (3600, RED)),
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Latency variation",
            "Coefficient of variation of the per-op times: a noisy link or a busy host.",
            [target(f"netmon_latency_variation_ratio{{{PROBE}}}", SERIES)],
            "percentunit",
        ),
        w=12,
        h=7,
    )
    layout.add(
        timeseries(
            "Algorithm bandwidth by size",
            "algbw = size / time per op, before the collective's bus factor.",
            [target(f"netmon_algbw_bytes_per_second{{{PROBE}}}", SERIES)],
            "Bps",
        ),
        w=12,
        h=7,
    )
