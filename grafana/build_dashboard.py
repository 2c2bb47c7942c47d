"""Writes grafana/dashboards/netmon.json, the netmon dashboard, from the panel list below.

    python grafana/build_dashboard.py           # rewrite the JSON
    python grafana/build_dashboard.py --check   # exit 1 if the checked-in JSON is out of date

The dashboard takes its Prometheus data source from the `datasource` variable, never a fixed UID,
so it imports and provisions into any Grafana. Every query is evaluated against a real
Prometheus by tests/test_dashboard_queries.py; tests/test_dashboard.py checks the filters, the
cell colours and that the JSON is this script's output; docs/DASHBOARD.md walks through the panels.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

Json = dict[str, Any]

OUTPUT = Path(__file__).resolve().parent / "dashboards" / "netmon.json"
UID = "netmon-interconnects"
DS: Json = {"type": "prometheus", "uid": "${datasource}"}

# Label filters from the dashboard variables. Every selector starts with SCOPE: one Prometheus
# may hold several clusters (a `cluster` target label, absent on a single-cluster scrape, hence
# its All value `.*`) and several jobs scraping netmon (tests/test_dashboard.py checks it).
SCOPE = 'cluster=~"$cluster", job=~"$job"'
NODE = f'{SCOPE}, instance=~"$instance"'
PROBE = f'{NODE}, probe=~"$probe"'
GPU = f'{NODE}, gpu=~"$gpu"'
PAIR = f'{NODE}, probe=~"$probe", gpu=~"$gpu"'

GREEN, YELLOW, RED, BLUE = "green", "yellow", "red", "blue"


def target(
    expr: str, legend: str = "", ref: str = "A", instant: bool = False, table: bool = False
) -> Json:
    out: Json = {"datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend or "__auto"}
    if instant:
        out.update({"instant": True, "range": False})
    if table:
        out["format"] = "table"
    return out


def thresholds(*steps: tuple[float | None, str]) -> Json:
    return {"mode": "absolute", "steps": [{"value": v, "color": c} for v, c in steps]}


def dashed(ref: str, color: str) -> Json:
    """An override drawing one query's series as a dashed line in one colour (baselines, limits)."""
    return {
        "matcher": {"id": "byFrameRefID", "options": ref},
        "properties": [
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
            {"id": "color", "value": {"mode": "fixed", "fixedColor": color}},
        ],
    }


def dotted(ref: str, color: str) -> Json:
    """An override drawing one query's series as a dotted line in one colour (references)."""
    return {
        "matcher": {"id": "byFrameRefID", "options": ref},
        "properties": [
            {"id": "custom.lineStyle", "value": {"fill": "dot", "dash": [0, 10]}},
            {"id": "color", "value": {"mode": "fixed", "fixedColor": color}},
        ],
    }


def field(matcher: str, options: str, properties: list[Json]) -> Json:
    """A field override: properties for the fields a matcher picks (byName, byType...)."""
    return {"matcher": {"id": matcher, "options": options}, "properties": properties}


def colored_cells(steps: Json, unit: str, mapping: list[Json] | None = None) -> list[Json]:
    """Override properties that colour a table column's cells by thresholds (or mapping)."""
    properties: list[Json] = [
        {"id": "unit", "value": unit},
        {"id": "color", "value": {"mode": "thresholds"}},
        {"id": "thresholds", "value": steps},
        {"id": "custom.cellOptions", "value": {"type": "color-background", "mode": "basic"}},
    ]
    if mapping is not None:
        properties.append({"id": "mappings", "value": mapping})
    return properties


def state_mapping(zero: tuple[str, str], one: tuple[str, str]) -> list[Json]:
    return [
        {
            "type": "value",
            "options": {
                "0": {"text": zero[0], "color": zero[1], "index": 0},
                "1": {"text": one[0], "color": one[1], "index": 1},
            },
        }
    ]


class Layout:
    """Places panels left to right in rows of 24 grid units, and numbers them."""

    def __init__(self) -> None:
        self.panels: list[Json] = []
        self.x = 0
        self.y = 0
        self.row_height = 0
        self.next_id = 1
        self.collapsed_row: Json | None = None

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def row(self, title: str, collapsed: bool = False) -> None:
        self.y += self.row_height
        self.x = self.row_height = 0
        row: Json = {
            "type": "row",
            "id": self._id(),
            "title": title,
            "collapsed": collapsed,
            "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1},
            "panels": [],
        }
        self.panels.append(row)
        self.collapsed_row = row if collapsed else None
        self.y += 1

    def add(self, panel: Json, w: int, h: int) -> None:
        if self.x + w > 24:
            self.y += self.row_height
            self.x = self.row_height = 0
        panel["id"] = self._id()
        panel["gridPos"] = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.x += w
        self.row_height = max(self.row_height, h)
        # A collapsed row keeps its panels inside it; an open row is followed by them.
        (self.collapsed_row["panels"] if self.collapsed_row else self.panels).append(panel)


def timeseries(
    title: str,
    description: str,
    targets: list[Json],
    unit: str,
    overrides: list[Json] | None = None,
    steps: Json | None = None,
    bars: bool = False,
    calcs: tuple[str, ...] = ("lastNotNull", "min", "max"),
) -> Json:
    custom: Json = {
        # Measurements are held between probe runs: a step, not a slope.
        "drawStyle": "bars" if bars else "line",
        "lineInterpolation": "stepAfter",
        "lineWidth": 1,
        "fillOpacity": 60 if bars else 0,
        "showPoints": "never",
        "spanNulls": False,
        "axisSoftMin": 0,
    }
    if steps is not None:
        custom["thresholdsStyle"] = {"mode": "dashed"}
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "color": {"mode": "palette-classic"},
                "custom": custom,
                "thresholds": steps or thresholds((None, GREEN)),
            },
            "overrides": overrides or [],
        },
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": list(calcs)},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def state_timeline(
    title: str, description: str, targets: list[Json], mapping: list[Json], steps: Json
) -> Json:
    return {
        "type": "state-timeline",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {
            "defaults": {
                "mappings": mapping,
                "color": {"mode": "thresholds"},
                "thresholds": steps,
                "custom": {"fillOpacity": 80, "lineWidth": 0},
            },
            "overrides": [],
        },
        "options": {
            "showValue": "never",
            "mergeValues": True,
            "rowHeight": 0.8,
            "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom"},
            "tooltip": {"mode": "single"},
        },
    }


def stat(
    title: str, description: str, targets: list[Json], steps: Json, unit: str = "none"
) -> Json:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {
            "defaults": {"unit": unit, "color": {"mode": "thresholds"}, "thresholds": steps},
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "auto",
            "justifyMode": "auto",
            "orientation": "auto",
        },
    }


def table(
    title: str,
    description: str,
    targets: list[Json],
    transformations: list[Json],
    unit: str = "none",
    overrides: list[Json] | None = None,
    sort_by: str | None = None,
) -> Json:
    # No colour by default: defaults reach every column, labels included, and a ratio's
    # thresholds on a 0/1 column paint a healthy 0 red. A column is coloured only by an override
    # that names it (colored_cells).
    defaults: Json = {
        "unit": unit,
        "custom": {"align": "auto", "cellOptions": {"type": "auto"}},
        "mappings": [],
    }
    options: Json = {"showHeader": True, "cellHeight": "sm"}
    if sort_by:
        options["sortBy"] = [{"displayName": sort_by, "desc": False}]
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "transformations": transformations,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": options,
    }


def hide_columns(*extra: str, rename: dict[str, str] | None = None) -> Json:
    names = {name: True for name in ("Time", "__name__", "job", *extra)}
    options: Json = {"excludeByName": names}
    if rename:
        options["renameByName"] = rename
    return {"id": "organize", "options": options}


def value_table(title: str, description: str, expr: str, column: str, cells: list[Json]) -> Json:
    """An instant table of one value per series: the value's column named `column`, styled by
    `cells` (a unit, coloured cells)."""
    return table(
        title,
        description,
        [target(expr, instant=True, table=True)],
        [hide_columns(rename={"Value": column})],
        overrides=[field("byName", column, cells)],
    )


RATIO_STEPS = thresholds((None, RED), (0.7, YELLOW), (0.9, GREEN))
SUSPECT_STEPS = thresholds((None, GREEN), (1, RED))
SERIES = "{{instance}} {{probe}} {{op}} {{size_bytes}} B {{path}} x{{ranks}}"
# The labels of a fleet: one series on the nodes of one GPU model (deploy/prometheus).
FLEET = "cluster, namespace, job, probe, op, size_bytes, path, ranks, gpu_model"


def reasons_bars(title: str, description: str, counter: str, only_positive: bool = True) -> Json:
    """A counter by reason, as bars of its increase per interval."""
    expr = f"sum by (instance, probe, reason) (increase({counter}{{{PROBE}}}[$__rate_interval]))"
    return timeseries(
        title,
        description,
        [target(expr + (" > 0" if only_positive else ""), "{{instance}} {{probe}} {{reason}}")],
        "none",
        bars=True,
        calcs=("sum",),
    )


def panels() -> list[Json]:
    layout = Layout()

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
            "Dashed: 85 %, under which NetmonBelowFleet fires where 5 or more nodes measure the "
            "series. A node alone is its own fleet (100 %).",
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

    layout.row("NVLink and PCIe paths")
    layout.add(
        timeseries(
            "NVLink vs PCIe busbw",
            'The default path (NVLink where GPUs have it) against the "pcie" path variant '
            "(NCCL_P2P_DISABLE=1: GPU, PCIe, host memory, PCIe, GPU).",
            [
                target(
                    f'netmon_busbw_bytes_per_second{{{PROBE}, path="default"}}',
                    "default {{instance}} {{probe}} {{op}} {{size_bytes}} B",
                ),
                target(
                    f'netmon_busbw_bytes_per_second{{{PROBE}, path="pcie"}}',
                    "pcie {{instance}} {{probe}} {{op}} {{size_bytes}} B",
                    ref="B",
                ),
            ],
            "Bps",
            overrides=[dashed("B", "orange")],
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "NVLink / PCIe busbw ratio",
            "busbw of the default path over the pcie path; about 10x on 8-GPU NVLink boards. "
            "A ratio that falls toward 1 means NVLink traffic is going over PCIe.",
            [
                target(
                    f"netmon_nvlink_pcie_busbw_ratio{{{PROBE}}}",
                    "{{instance}} {{probe}} {{op}} {{size_bytes}} B x{{ranks}}",
                )
            ],
            "none",
        ),
        w=12,
        h=8,
    )
    layout.add(
        table(
            "Transport in use",
            "The transport NCCL reported (NCCL_DEBUG=INFO) for each probe and path.",
            [target(f"netmon_transport_info{{{PROBE}}}", instant=True, table=True)],
            [hide_columns("Value")],
        ),
        w=12,
        h=7,
    )
    layout.add(
        timeseries(
            "Transport mismatches",
            "Runs whose transport differed from the one their path intends, by reason.",
            [
                target(
                    "sum by (instance, probe, path, reason) "
                    f"(increase(netmon_transport_mismatch_total{{{PROBE}}}[$__rate_interval]))",
                    "{{instance}} {{probe}} {{path}} {{reason}}",
                )
            ],
            "none",
            bars=True,
            calcs=("sum",),
        ),
        w=12,
        h=7,
    )

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
        timeseries(
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
            "none",
            bars=True,
            calcs=("sum",),
        ),
        w=8,
        h=8,
    )

    layout.row("PCIe and NVLink health")
    layout.add(
        table(
            "PCIe link: width and generation against max",
            "Current against maximum link width and generation per GPU. An idle GPU lowers "
            "its generation to save power; a lower width is always physical.",
            [
                target(f"netmon_pcie_link_width{{{GPU}}}", ref="A", instant=True, table=True),
                target(f"netmon_pcie_link_width_max{{{GPU}}}", ref="B", instant=True, table=True),
                target(f"netmon_pcie_link_generation{{{GPU}}}", ref="C", instant=True, table=True),
                target(
                    f"netmon_pcie_link_generation_max{{{GPU}}}",
                    ref="D",
                    instant=True,
                    table=True,
                ),
            ],
            [
                {"id": "merge", "options": {}},
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True, "job": True},
                        "renameByName": {
                            "Value #A": "width",
                            "Value #B": "max width",
                            "Value #C": "generation",
                            "Value #D": "max generation",
                        },
                    },
                },
            ],
        ),
        w=12,
        h=8,
    )
    layout.add(
        state_timeline(
            "PCIe downtrained under load",
            "netmon_pcie_link_downtrained: 1 when a reading taken while traffic flows shows "
            "the link under its maximum.",
            [
                target(
                    f"netmon_pcie_link_downtrained{{{GPU}}}", "{{instance}} GPU{{gpu}} {{reason}}"
                )
            ],
            state_mapping(("full", GREEN), ("downtrained", RED)),
            thresholds((None, GREEN), (1, RED)),
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "PCIe replay errors",
            "PCIe replays per interval: a noisy link retransmitting.",
            [
                target(
                    f"sum by (instance, gpu) "
                    f"(increase(netmon_pcie_replay_errors_total{{{GPU}}}[$__rate_interval]))",
                    "{{instance}} GPU{{gpu}}",
                )
            ],
            "none",
            bars=True,
            calcs=("sum",),
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "NVLink errors",
            "NVLink error counters per interval, summed over each GPU's links, by kind "
            "(replay, recovery, CRC flit, CRC data). Healthy links stay at zero.",
            [
                target(
                    "sum by (instance, gpu, error) "
                    f"(increase(netmon_nvlink_gpu_errors_total{{{GPU}}}[$__rate_interval]))",
                    "{{instance}} GPU{{gpu}} {{error}}",
                )
            ],
            "none",
            bars=True,
            calcs=("sum",),
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "NVLinks up per GPU",
            "Active NVLinks per GPU, read every link_telemetry.interval whether or not jobs "
            "run; a drop is a link that went down.",
            [
                target(
                    f"netmon_nvlink_active_links{{{GPU}}}",
                    "{{instance}} GPU{{gpu}}",
                )
            ],
            "none",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "NVLink throughput",
            "Bytes over NVLink per second, by GPU and direction: probe and workload traffic.",
            [
                target(
                    "sum by (instance, gpu, direction) "
                    f"(rate(netmon_nvlink_throughput_bytes_total{{{GPU}}}[$__rate_interval]))",
                    "{{instance}} GPU{{gpu}} {{direction}}",
                )
            ],
            "Bps",
        ),
        w=12,
        h=7,
    )
    layout.add(
        timeseries(
            "Link health: age of the reading",
            "Seconds since netmon last read NVLink and PCIe health from NVML; dashed: 3 "
            "reading intervals, past which NetmonLinkHealthStale fires.",
            [
                target(
                    f"time() - netmon_link_health_read_timestamp_seconds{{{NODE}}}",
                    "{{instance}}",
                    ref="A",
                ),
                target(
                    f"3 * netmon_link_health_interval_seconds{{{NODE}}}",
                    "limit {{instance}}",
                    ref="B",
                ),
            ],
            "s",
            overrides=[dashed("B", "red")],
        ),
        w=12,
        h=7,
    )

    layout.row("Probe health")
    layout.add(
        timeseries(
            "Probe runs vs failures",
            "Runs started and runs failed per interval. Failures are counted when a run ends, "
            "runs when it starts.",
            [
                target(
                    "sum by (instance, probe) "
                    f"(increase(netmon_probe_runs_total{{{PROBE}}}[$__rate_interval]))",
                    "runs {{instance}} {{probe}}",
                ),
                target(
                    "sum by (instance, probe) "
                    f"(increase(netmon_probe_failures_total{{{PROBE}}}[$__rate_interval]))",
                    "failures {{instance}} {{probe}}",
                    ref="B",
                ),
            ],
            "none",
            overrides=[
                {
                    "matcher": {"id": "byFrameRefID", "options": "B"},
                    "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": RED}}],
                }
            ],
            calcs=("sum",),
        ),
        w=12,
        h=8,
    )
    layout.add(
        stat(
            "Failure ratio, last hour",
            "Failed runs / runs over one hour, not counting paused, preempted and shutdown "
            "(recording rule instance_probe:netmon_probe_failures:ratio1h).",
            [
                target(
                    f"instance_probe:netmon_probe_failures:ratio1h{{{PROBE}}}",
                    "{{instance}} {{probe}}",
                    instant=True,
                )
            ],
            thresholds((None, GREEN), (0.05, YELLOW), (0.25, RED)),
            unit="percentunit",
        ),
        w=12,
        h=8,
    )
    layout.add(
        reasons_bars(
            "Failures by reason",
            "Failed runs per interval by reason (docs/METRICS.md lists them).",
            "netmon_probe_failures_total",
        ),
        w=12,
        h=8,
    )
    layout.add(
        reasons_bars(
            "Skips by reason",
            "Runs that were due but not started: paused, GPUs busy, previous run still going.",
            "netmon_probe_skips_total",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Staleness: time since last success",
            "Seconds since each probe last succeeded; dashed: 3 intervals, where "
            "NetmonProbeStale starts counting.",
            [
                target(
                    f"time() - netmon_probe_last_success_timestamp_seconds{{{PROBE}}}",
                    "{{instance}} {{probe}}",
                ),
                target(
                    f"3 * netmon_probe_interval_seconds{{{PROBE}}}",
                    "3 intervals {{instance}} {{probe}}",
                    ref="B",
                ),
            ],
            "s",
            overrides=[dashed("B", "text")],
        ),
        w=12,
        h=8,
    )
    layout.add(
        state_timeline(
            "Paused",
            "netmon_paused: the pause file exists (Slurm prolog, or an operator). No probe "
            "runs then.",
            [target(f"netmon_paused{{{NODE}}}", "{{instance}}")],
            state_mapping(("probing", GREEN), ("paused", BLUE)),
            thresholds((None, GREEN), (1, BLUE)),
        ),
        w=12,
        h=8,
    )

    layout.row("Cost of probing")
    layout.add(
        timeseries(
            "Devices held by probes",
            "Average number of GPUs (or CPU ranks) busy with probes: the rate of "
            "netmon_probe_busy_seconds_total.",
            [
                target(
                    "sum by (instance, probe) "
                    f"(rate(netmon_probe_busy_seconds_total{{{PROBE}}}[$__rate_interval]))",
                    "{{instance}} {{probe}}",
                )
            ],
            "none",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "Probe duration",
            "Wall time of each probe's last run, process start to last reap.",
            [target(f"netmon_probe_duration_seconds{{{PROBE}}}", "{{instance}} {{probe}}")],
            "s",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "Peak device memory per rank",
            "Largest GPU memory a rank allocated in the last run (nccl probes).",
            [target(f"netmon_probe_peak_device_memory_bytes{{{PROBE}}}", "{{instance}} {{probe}}")],
            "bytes",
        ),
        w=8,
        h=8,
    )

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
        timeseries(
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
            "none",
            bars=True,
            calcs=("sum",),
        ),
        w=24,
        h=7,
    )
    sweep_panels(layout)
    jobs_panels(layout)
    return layout.panels


AGE_STEPS = thresholds((None, GREEN), (3 * 86400, YELLOW))  # NetmonSweepStale's 3 days


def sweep_panels(layout: Layout) -> None:
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
        timeseries(
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
            "none",
            bars=True,
            calcs=("sum",),
        ),
        w=8,
        h=8,
    )


JOBS = f'{NODE}, probe="jobs"'
SHAPE = "{{instance}} {{op}} {{size_bytes}} B {{path}} x{{ranks}}"
SLOW_SHARE_STEPS = thresholds((None, GREEN), (0.5, YELLOW), (0.8, RED))


def jobs_panels(layout: Layout) -> None:
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
        timeseries(
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
            "none",
            bars=True,
            calcs=("sum",),
        ),
        w=8,
        h=8,
    )


def query_variable(name: str, label: str, query: str, all_value: str = ".+") -> Json:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"netmon-{name}"},
        "definition": query,
        "refresh": 2,  # on time range change: nodes come and go
        "includeAll": True,
        "multi": True,
        "allValue": all_value,
        "current": {},
        "sort": 3,  # numerical, so GPU 10 follows GPU 9
        "regex": "",
        "hide": 0,
    }


def dashboard() -> Json:
    return {
        "title": "netmon: GPU interconnects",
        "uid": UID,
        "description": "GPU interconnect bandwidth, latency and link health from netmon "
        "(deploy/prometheus/netmon-rules.yaml for the recording rules and alerts).",
        "tags": ["netmon", "gpu", "nccl", "interconnect"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "1m",
        "time": {"from": "now-6h", "to": "now"},
        "links": [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                },
                {
                    "name": "netmon paused",
                    "datasource": DS,
                    "enable": True,
                    "iconColor": "blue",
                    "expr": f"netmon_paused{{{NODE}}} == 1",
                    "step": "60s",
                    "titleFormat": "paused",
                    "textFormat": "{{instance}}",
                    "tagKeys": "instance",
                },
            ]
        },
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "refresh": 1,
                    "regex": "",
                    "hide": 0,
                },
                # cluster is a target label a scrape may not set: All is `.*`, which also
                # matches series without it.
                query_variable(
                    "cluster", "Cluster", "label_values(netmon_build_info, cluster)", ".*"
                ),
                query_variable(
                    "job", "Job", 'label_values(netmon_build_info{cluster=~"$cluster"}, job)'
                ),
                query_variable(
                    "instance", "Node", f"label_values(netmon_build_info{{{SCOPE}}}, instance)"
                ),
                query_variable(
                    "gpu",
                    "GPU",
                    'label_values({__name__=~"netmon_pcie_link_width|netmon_link_busbw_ratio",'
                    f" {NODE}}}, gpu)",
                ),
                query_variable(
                    "probe",
                    "Probe",
                    f"label_values(netmon_probe_interval_seconds{{{NODE}}}, probe)",
                ),
            ]
        },
        "panels": panels(),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the JSON is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            print(
                f"{OUTPUT} is out of date: run python grafana/build_dashboard.py", file=sys.stderr
            )
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
