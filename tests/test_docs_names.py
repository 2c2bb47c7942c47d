"""Every metric, recording rule and alert the docs name exists: metric names in the live
catalogue (netmon/exposition/catalogue.py), recording rules and alerts in
deploy/prometheus/netmon-rules.yaml. A renamed or removed family, or a typo in the docs, fails
here with the file and line."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from netmon.exposition.catalogue import CATALOGUE
from netmon.sweep.delivery import textfile

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "netmon-rules.yaml"

# A metric name, or a pattern of them (`netmon_probe_*`), not inside a longer word or a recording
# rule's name. Lower case only: NETMON_ is the settings' environment prefix.
METRIC = re.compile(r"(?<![\w:./-])netmon_[a-z0-9_*]+")
# A recording rule's name (level:metric:operations), where it names netmon's.
RECORDED = re.compile(r"(?<![\w:./-])[a-z][a-z0-9_]*(?::[a-z][a-z0-9_]*)+(?![\w.-])")
ALERT = re.compile(r"(?<![\w.])Netmon[A-Za-z]+")
# Tokens of the metric's shape that name something else, with where and why.
NOT_METRICS = {
    "netmon_gpu": "the distribution netmon-gpu as PyPI normalises its name (DEPLOY.md)",
}


@dataclass(frozen=True)
class Mention:
    path: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name}"


def documents() -> list[Path]:
    found = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    chart = ROOT / "deploy" / "helm" / "netmon" / "README.md"
    return [*found, chart] if chart.exists() else found


def exported_names() -> set[str]:
    """Every sample name netmon exports: a counter only with `_total`. The catalogue holds no
    histogram or summary (its Kind), so no `_bucket`, `_sum` or `_count` either. The sweep
    host's textfile adds its own gauges."""
    return {family.sample_name for family in CATALOGUE} | {f.name for f in textfile.FAMILIES}


def rules() -> list[dict[str, str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def netmon_classes() -> set[str]:
    """Classes of the package named like an alert (NetmonConfig): what the docs may name too."""
    pattern = re.compile(r"^class (Netmon\w+)\b", re.MULTILINE)
    return {
        name
        for path in (ROOT / "netmon").rglob("*.py")
        for name in pattern.findall(path.read_text())
    }


def mentions(text: str, pattern: re.Pattern[str], path: str = "text") -> Iterator[Mention]:
    for match in pattern.finditer(text):
        yield Mention(path, text.count("\n", 0, match.start()) + 1, match.group(0))


def unknown_metrics(text: str, exported: Collection[str], path: str = "text") -> list[Mention]:
    unknown = []
    for match in METRIC.finditer(text):
        name = match.group(0)
        before = text[text.rfind("\n", 0, match.start()) + 1 : match.start()]
        if name in NOT_METRICS:
            continue
        if "*" in name:  # a pattern names at least one family
            known = any(fnmatch.fnmatchcase(e, name) for e in exported)
        elif re.search(r"\bgrep\s+$", before):  # `grep netmon_busbw`: a prefix
            known = any(e.startswith(name) for e in exported)
        else:
            known = name in exported
        if not known:
            unknown.append(Mention(path, text.count("\n", 0, match.start()) + 1, name))
    return unknown


def test_the_checker_tells_a_known_name_from_an_unknown_one() -> None:
    exported = {"netmon_probe_runs_total", "netmon_probe_failures_total", "netmon_degraded"}
    text = (
        "`netmon_degraded` and `netmon_probe_runs_total`, all of `netmon_probe_*`;\n"
        "grep netmon_deg\n"
        "`netmon_probe_runs` (a counter without _total), `netmon_degradd`, `netmon_nope_*`,\n"
        "and `instance_probe:netmon_probe_runs:increase1h` is a recording rule's.\n"
    )
    unknown = [str(m) for m in unknown_metrics(text, exported)]
    assert unknown == [
        "text:3: netmon_probe_runs",
        "text:3: netmon_degradd",
        "text:3: netmon_nope_*",
    ]
    assert [m.name for m in mentions(text, RECORDED)] == [
        "instance_probe:netmon_probe_runs:increase1h"
    ]
    assert [m.name for m in mentions("NetmonBusbwDegraded, x.NetmonY, NETMON_X", ALERT)] == [
        "NetmonBusbwDegraded"
    ]


def test_every_metric_the_docs_name_is_exported() -> None:
    exported = exported_names()
    unknown: list[Mention] = []
    seen = 0
    for path in documents():
        text = path.read_text()
        seen += sum(1 for _ in mentions(text, METRIC))
        unknown += unknown_metrics(text, exported, str(path.relative_to(ROOT)))
    assert seen > 100, "the docs' metric names were not found: is the pattern still right?"
    assert [str(m) for m in unknown] == []


def test_every_recording_rule_the_docs_name_exists() -> None:
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    named = [
        m
        for path in documents()
        for m in mentions(path.read_text(), RECORDED, str(path.relative_to(ROOT)))
        if "netmon" in m.name
    ]
    assert named, "no recording rule named in the docs: is the pattern still right?"
    assert [str(m) for m in named if m.name not in recorded] == []


def test_every_alert_the_docs_name_exists() -> None:
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    classes = netmon_classes()
    named = [
        m
        for path in documents()
        for m in mentions(path.read_text(), ALERT, str(path.relative_to(ROOT)))
    ]
    assert {m.name for m in named} >= {"NetmonBusbwDegraded", "NetmonTargetDown"}
    assert [str(m) for m in named if m.name not in alerts | classes] == []


def test_the_exceptions_are_still_needed_and_name_no_metric() -> None:
    exported = exported_names()
    text = "\n".join(path.read_text() for path in documents())
    for name, why in NOT_METRICS.items():
        assert name not in exported, f"{name} is a metric now: drop it from NOT_METRICS ({why})"
        assert re.search(rf"(?<![\w:./-]){name}(?![a-z0-9_*])", text), f"{name}: no longer named"
