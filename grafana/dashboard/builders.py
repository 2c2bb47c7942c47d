"""Panel and query builders shared by every row of the netmon dashboard.

Selectors start from the dashboard variables (SCOPE, NODE, PROBE, GPU, PAIR); the panel builders
return Grafana's JSON for one panel; Layout places panels on the grid and numbers them.
"""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]

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


def panel(kind: str, title: str, description: str, targets: list[Json], **rest: Any) -> Json:
    """A panel of one kind: the keys every panel has, then its own (`rest`, in their order)."""
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        **rest,
    }


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
    return panel(
        "timeseries",
        title,
        description,
        targets,
        fieldConfig={
            "defaults": {
                "unit": unit,
                "color": {"mode": "palette-classic"},
                "custom": custom,
                "thresholds": steps or thresholds((None, GREEN)),
            },
            "overrides": overrides or [],
        },
        options={
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": list(calcs)},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    )


def state_timeline(
    title: str, description: str, targets: list[Json], mapping: list[Json], steps: Json
) -> Json:
    return panel(
        "state-timeline",
        title,
        description,
        targets,
        fieldConfig={
            "defaults": {
                "mappings": mapping,
                "color": {"mode": "thresholds"},
                "thresholds": steps,
                "custom": {"fillOpacity": 80, "lineWidth": 0},
            },
            "overrides": [],
        },
        options={
            "showValue": "never",
            "mergeValues": True,
            "rowHeight": 0.8,
            "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom"},
            "tooltip": {"mode": "single"},
        },
    )


def stat(
    title: str, description: str, targets: list[Json], steps: Json, unit: str = "none"
) -> Json:
    return panel(
        "stat",
        title,
        description,
        targets,
        fieldConfig={
            "defaults": {"unit": unit, "color": {"mode": "thresholds"}, "thresholds": steps},
            "overrides": [],
        },
        options={
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "auto",
            "justifyMode": "auto",
            "orientation": "auto",
        },
    )


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
    return panel(
        "table",
        title,
        description,
        targets,
        transformations=transformations,
        fieldConfig={"defaults": defaults, "overrides": overrides or []},
        options=options,
    )


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


def increase_bars(title: str, description: str, targets: list[Json]) -> Json:
    """A counter's increase per interval as bars, their sum over the range in the legend."""
    return timeseries(title, description, targets, "none", bars=True, calcs=("sum",))


def reasons_bars(title: str, description: str, counter: str, only_positive: bool = True) -> Json:
    """A counter by reason, as bars of its increase per interval."""
    expr = f"sum by (instance, probe, reason) (increase({counter}{{{PROBE}}}[$__rate_interval]))"
    if only_positive:
        expr += " > 0"
    return increase_bars(title, description, [target(expr, "{{instance}} {{probe}} {{reason}}")])
