"""The metric catalogue against everything that names a metric: what the collectors export, the
reference in docs/METRICS.md, the Grafana dashboard and the Prometheus rules."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import Metric

from netmon.exposition.catalogue import BY_NAME, CATALOGUE, FAILURE_REASONS, SKIP_REASONS
from netmon.exposition.collector import COLLECTORS, Collector, make_registry
from netmon.exposition.snapshot import Snapshot
from netmon.sweep.delivery import textfile
from tests.test_exporter import FULL_SNAPSHOT

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "METRICS.md"
DASHBOARD = ROOT / "grafana" / "dashboards" / "netmon.json"
RULES = sorted((ROOT / "deploy" / "prometheus").glob("*.y*ml"))
# Sample names a family can have beyond its own (histograms and summaries, should one appear).
SUFFIXES = ("_total", "_created", "_bucket", "_count", "_sum")
# Prometheus' base units as netmon uses them (hertz: the GPUs' SM clock).
UNITS = ("seconds", "bytes", "bytes_per_second", "ratio", "hertz")


def broken(snapshot: Snapshot) -> Iterator[Metric]:
    raise RuntimeError("a collector that always fails")
    yield  # a generator, as the real collectors are


def families(
    snapshot: Snapshot, collectors: Mapping[str, Collector] = COLLECTORS
) -> dict[str, Metric]:
    return {f.name: f for f in make_registry(lambda: snapshot, collectors).collect()}


def exported() -> dict[str, Metric]:
    """Every family of the fullest snapshot, and of a scrape with a failing collector."""
    failing = families(FULL_SNAPSHOT, {**COLLECTORS, "series": broken})
    return {**failing, **families(FULL_SNAPSHOT)}


def test_every_exported_family_is_catalogued_with_its_type_labels_and_help() -> None:
    found = exported()
    assert set(found) == set(BY_NAME), (set(found) - set(BY_NAME), set(BY_NAME) - set(found))
    text = generate_latest(make_registry(lambda: FULL_SNAPSHOT)).decode()
    for name, family in found.items():
        entry = BY_NAME[name]
        assert family.type == entry.type, name
        assert family.documentation.startswith(entry.help), name
        assert f"# HELP {entry.sample_name} {entry.help}" in text, name
        for sample in family.samples:
            assert sample.name == entry.sample_name, sample
            assert tuple(sample.labels) == entry.labels, (name, sample.labels)


def test_each_collector_exports_exactly_the_families_catalogued_for_it() -> None:
    for name, collector in COLLECTORS.items():
        built = {family.name for family in collector(FULL_SNAPSHOT)}
        assert built == {f.name for f in CATALOGUE if f.collector == name}, name
    assert {f.collector for f in CATALOGUE} == {*COLLECTORS, "scrape"}


def test_names_follow_the_prometheus_conventions() -> None:
    assert len(BY_NAME) == len(CATALOGUE)  # one entry per name
    for family in CATALOGUE:
        assert re.fullmatch(r"netmon_[a-z0-9_]+", family.name), family.name
        assert not family.name.endswith("_total"), "counters are catalogued without _total"
        assert (family.kind == "info") == family.name.endswith("_info"), family.name
        assert family.unit in ("", *UNITS), family.unit
        if family.unit:
            assert family.name.endswith(f"_{family.unit}"), family.name
        else:
            assert not family.name.endswith(tuple(f"_{unit}" for unit in UNITS)), family.name
        assert "type" not in family.labels  # one family per type, never a type label
        assert family.help and not family.help.endswith("."), family.name  # "." is added
    for reasons in (FAILURE_REASONS, SKIP_REASONS):
        assert len(set(reasons)) == len(reasons)


def test_every_catalogued_family_is_documented() -> None:
    documented = set(re.findall(r"^\| `(netmon_[a-z_]+)` \|", DOCS.read_text(), re.MULTILINE))
    # The sweep host's textfile (netmon.sweep.delivery.textfile) is no daemon's: not catalogued.
    sweep_host = {family.name for family in textfile.FAMILIES}
    assert sweep_host <= documented
    documented -= sweep_host
    samples = {family.sample_name for family in CATALOGUE}
    assert samples - documented == set(), "catalogued but not in docs/METRICS.md"
    assert documented - samples == set(), "in docs/METRICS.md but not catalogued"


def names_in(text: str) -> set[str]:
    """Identifiers that name a netmon metric: `netmon_x` in a query, or the metric part of a
    recording rule's name (`level:netmon_x:operations`)."""
    found: set[str] = set()
    for token in re.findall(r"[A-Za-z0-9_:]*netmon_[a-z_]+[A-Za-z0-9_:]*", text):
        found.update(part for part in token.split(":") if part.startswith("netmon_"))
    return found


def family_of(name: str) -> str | None:
    if name in BY_NAME:
        return name
    for suffix in SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and base in BY_NAME:
            return base
    return None


@pytest.mark.parametrize("path", [DASHBOARD, *RULES], ids=lambda p: p.name)
def test_the_dashboard_and_the_rules_name_only_catalogued_families(path: Path) -> None:
    names = names_in(path.read_text())
    if path == DASHBOARD or "rules" in path.name:  # the scrape configuration names none
        assert names, f"no netmon_ metric in {path}"
    unknown = {name for name in names if family_of(name) is None}
    assert unknown == set(), f"{path.name} uses metrics that netmon does not export"
    for name in names:
        family = BY_NAME[str(family_of(name))]
        # A counter's samples are *_total: a query of the bare family name finds nothing.
        if family.kind == "counter" and name == family.name:
            assert re.search(rf":{name}:", path.read_text()), f"{name} without _total"


def test_the_names_found_are_the_ones_written() -> None:
    text = (
        'expr: rate(netmon_probe_runs_total{job="x"}[5m])\n'
        "record: instance_probe:netmon_probe_failures:ratio1h\n"
        "description: netmon_paused: the pause file exists"
    )
    assert names_in(text) == {"netmon_probe_runs_total", "netmon_probe_failures", "netmon_paused"}
    assert family_of("netmon_probe_runs_total") == "netmon_probe_runs"
    assert family_of("netmon_probe_run") is None
