"""The dashboard's structure: the checked-in JSON is what grafana/build_dashboard.py writes, every
query is scoped by the cluster and job variables, and table cells are coloured only where an
override names the field (the values themselves run in tests/test_dashboard_queries.py)."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import promql_parser

from tests.test_dashboard_queries import (
    DASHBOARD,
    ROOT,
    SUBSTITUTIONS,
    all_panels,
    load_dashboard,
)

Json = dict[str, Any]
# Stand-ins for the two scoping variables, so that a parsed selector shows where they went.
SCOPE = {"$cluster": "CLUSTER_VARIABLE", "$job": "JOB_VARIABLE"}
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


def builder() -> ModuleType:
    path = ROOT / "grafana" / "build_dashboard.py"
    spec = importlib.util.spec_from_file_location("build_dashboard", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checked_in_json_is_what_the_generator_writes() -> None:
    module = builder()
    assert DASHBOARD.read_text() == module.render(), "run python grafana/build_dashboard.py"
    assert module.render() == module.render(), "the output must not vary between runs"


# Scope: cluster and job on every selector


def selectors(expr: str) -> Iterator[promql_parser.VectorSelector]:
    text = expr
    for name, value in {**SUBSTITUTIONS, **SCOPE}.items():
        text = text.replace(name, value)
    match = _LABEL_VALUES.match(text)
    if match:  # a variable query: label_values(selector, label)
        text = f"count by ({match['label']}) ({match['selector']})"
    found: list[promql_parser.VectorSelector] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(promql_parser.parse(text), pre_visit=visit)
    yield from found


def scoped_by(selector: promql_parser.VectorSelector) -> set[str]:
    """The scoping variables a selector filters by, each as `label=~"$label"`."""
    return {
        f"${m.name}"
        for m in selector.matchers.matchers
        if m.op == promql_parser.MatchOp.Re and SCOPE.get(f"${m.name}") == m.value
    }


def panel_queries(dashboard: Json) -> Iterator[tuple[str, str]]:
    for panel in all_panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield f"{panel['title']} {target['refId']}", target["expr"]
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation:
            yield f"annotation {annotation['name']}", annotation["expr"]


def test_every_panel_and_annotation_query_is_scoped_by_cluster_and_job() -> None:
    queries = list(panel_queries(load_dashboard()))
    assert len(queries) > 40
    for name, expr in queries:
        found = list(selectors(expr))
        assert found, f"{name}: no selector in {expr}"
        for selector in found:
            assert scoped_by(selector) == set(SCOPE), f"{name}: {selector} in {expr}"


def test_each_variable_query_is_scoped_by_the_variables_before_it() -> None:
    variables = load_dashboard()["templating"]["list"]
    names = [v["name"] for v in variables]
    assert names == ["datasource", "cluster", "job", "instance", "gpu", "probe"]
    for index, variable in enumerate(variables):
        if variable["type"] != "query":
            continue
        before = {f"${name}" for name in names[:index]} & set(SCOPE)
        for selector in selectors(variable["definition"]):
            assert scoped_by(selector) == before, f"{variable['name']}: {selector}"


def test_cluster_may_be_absent_and_every_variable_offers_all() -> None:
    variables = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    # A scrape without a cluster label: All must match the empty value too.
    assert variables["cluster"]["allValue"] == ".*"
    assert re.fullmatch(variables["cluster"]["allValue"], "")
    for name in ("cluster", "job", "instance", "gpu", "probe"):
        assert variables[name]["includeAll"] and variables[name]["multi"], name
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert variables["job"]["allValue"] == ".+"


# Colours: only where an override names the field


def panel(title: str) -> Json:
    (found,) = [p for p in all_panels(load_dashboard()["panels"]) if p["title"] == title]
    return found


def resolved(panel: Json, name: str, kind: str) -> Json:
    """A field's configuration as Grafana builds it: the defaults, then every override whose
    matcher picks the field (by its display name or its type), in order."""
    config: Json = dict(panel["fieldConfig"]["defaults"])
    config["custom"] = dict(config.get("custom", {}))
    for override in panel["fieldConfig"]["overrides"]:
        matcher = override["matcher"]
        picked = {"byName": name, "byType": kind}.get(matcher["id"])
        assert picked is not None, f"a matcher this test does not know: {matcher}"
        if matcher["options"] != picked:
            continue
        for prop in override["properties"]:
            if prop["id"].startswith("custom."):
                config["custom"][prop["id"].removeprefix("custom.")] = prop["value"]
            else:
                config[prop["id"]] = prop["value"]
    return config


def cell_colour(config: Json, value: float) -> str | None:
    """The background a table cell gets: None if the column is not coloured; else the value
    mapping's colour, or the colour of the highest threshold step at or under the value."""
    if config["custom"].get("cellOptions", {}).get("type") != "color-background":
        return None
    for mapping in config.get("mappings", []):
        if mapping["type"] == "value" and f"{value:g}" in mapping["options"]:
            return str(mapping["options"][f"{value:g}"]["color"])
    steps = config["thresholds"]["steps"]
    colour = steps[0]["color"]
    for step in steps[1:]:
        if value >= step["value"]:
            colour = step["color"]
    return str(colour)


def test_no_table_colours_a_column_by_default() -> None:
    tables = [p for p in all_panels(load_dashboard()["panels"]) if p["type"] == "table"]
    assert len(tables) >= 6
    for table in tables:
        defaults = table["fieldConfig"]["defaults"]
        assert "thresholds" not in defaults, table["title"]
        assert defaults["custom"]["cellOptions"] == {"type": "auto"}, table["title"]
        for override in table["fieldConfig"]["overrides"]:
            assert override["matcher"]["id"] in ("byName", "byType"), table["title"]


def test_worst_first_pairs_colour_the_ratio_by_thresholds_and_suspect_by_its_states() -> None:
    pairs = panel("GPU pairs, worst first")
    organize = next(t for t in pairs["transformations"] if t["id"] == "organize")
    assert organize["options"]["renameByName"] == {"Value #A": "ratio", "Value #B": "suspect"}
    assert pairs["options"]["sortBy"] == [{"displayName": "ratio", "desc": False}]
    overrides = pairs["fieldConfig"]["overrides"]
    assert [o["matcher"] for o in overrides] == [
        {"id": "byName", "options": "ratio"},
        {"id": "byName", "options": "suspect"},
    ]
    ratio = resolved(pairs, "ratio", "number")
    assert ratio["unit"] == "percentunit"
    assert [cell_colour(ratio, v) for v in (0.5, 0.8, 1.0)] == ["red", "yellow", "green"]
    suspect = resolved(pairs, "suspect", "number")
    assert suspect["unit"] == "none"
    assert "0.7" not in str(suspect["thresholds"]), "the ratio's thresholds"
    assert (cell_colour(suspect, 0), cell_colour(suspect, 1)) == ("green", "red")
    texts = {k: v["text"] for m in suspect["mappings"] for k, v in m["options"].items()}
    assert texts == {"0": "ok", "1": "suspect"}
    for label in ("instance", "probe", "gpu", "peer_gpu", "path"):
        assert cell_colour(resolved(pairs, label, "string"), 0) is None, label


def test_the_pair_matrix_colours_the_ratios_and_not_the_gpu_column() -> None:
    matrix = panel("GPU-pair matrix: busbw / path-class median")
    ratio = resolved(matrix, "3", "number")  # a peer column after groupingToMatrix
    assert ratio["unit"] == "percentunit"
    assert [cell_colour(ratio, v) for v in (0.5, 0.8, 1.0)] == ["red", "yellow", "green"]
    assert cell_colour(resolved(matrix, "gpu\\peer_gpu", "string"), 0) is None
