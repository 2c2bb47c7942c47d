"""The alerts follow the kube-prometheus conventions, their runbook links land on a section of
docs/RUNBOOK.md, promtool's tests pass, and the inhibition rules are the same in the three files
that ship them and mute what they say in a real Alertmanager (Debian's prometheus-alertmanager).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import wait_for
from tests.prometheus_harness import free_port, server_ready, stop_server
from tests.test_deploy import (
    COMPOSE,
    DEPLOY,
    ROOT,
    RULE_TESTS,
    RULES,
    alerts,
    load_yaml,
    promtool,
    run,
    tool,
)

RUNBOOK = ROOT / "docs" / "RUNBOOK.md"
RUNBOOK_BASE = "https://github.com/OWNER/netmon/blob/main/docs/RUNBOOK.md"
ALERTMANAGER = DEPLOY / "alertmanager"
INHIBIT_SNIPPET = ALERTMANAGER / "inhibit-rules.yml"
ALERTMANAGER_CONFIG = ALERTMANAGER / "alertmanagerconfig.yaml"
SEVERITIES = ("critical", "warning", "info")
# Target labels a scrape may add to every series; the rules keep them through aggregations.
TARGET_LABELS = {"cluster", "namespace"}


# Alerts and their runbooks


def test_every_alert_has_a_severity_summary_description_and_runbook_url() -> None:
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert annotations["summary"].strip() and annotations["description"].strip(), name
        assert annotations["runbook_url"] == f"{RUNBOOK_BASE}#{name.lower()}", name


def test_the_runbook_base_is_documented_where_it_is_changed() -> None:
    # The rules and the runbook tell how to point runbook_url elsewhere: both name this base.
    for path in (RULES, RUNBOOK):
        assert f"s|{RUNBOOK_BASE}|" in path.read_text(), path.name


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def runbook_sections() -> dict[str, str]:
    """Second-level sections of docs/RUNBOOK.md by their GitHub anchor: heading line to text."""
    sections: dict[str, str] = {}
    anchor = None
    for line in RUNBOOK.read_text().splitlines():
        if line.startswith("## "):
            anchor = github_anchor(line[3:])
            sections[anchor] = ""
        elif anchor is not None:
            sections[anchor] += line + "\n"
    return sections


def test_every_runbook_url_lands_on_a_section_with_steps() -> None:
    sections = runbook_sections()
    for name, rule in alerts().items():
        anchor = rule["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor in sections, f"{name}: no heading for #{anchor} in docs/RUNBOOK.md"
        assert re.search(r"^1\. ", sections[anchor], re.MULTILINE), f"{name}: no numbered steps"
    # And no section for an alert that no longer exists.
    alert_anchors = {name.lower() for name in alerts()}
    stale = {a for a in sections if a.startswith("netmon")} - alert_anchors
    assert stale == set(), f"runbook sections without an alert: {stale}"


def test_the_anchor_rule_is_githubs() -> None:
    assert github_anchor("NetmonBusbwDegraded") == "netmonbusbwdegraded"
    assert github_anchor("Inhibition: a cause silences its symptoms") == (
        "inhibition-a-cause-silences-its-symptoms"
    )


def test_promtool_rule_tests_pass_and_test_every_alert_firing_and_quiet() -> None:
    output = run(promtool(), "test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert "SUCCESS" in output
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in load_yaml(RULE_TESTS)["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert set(alerts()) - firing == set(), "alerts never tested firing"
    assert set(alerts()) - quiet == set(), "alerts never tested not firing"


# Inhibition: the same rules in three files


Matcher = tuple[str, str, str]  # (label, operator, value)
Rule = tuple[tuple[Matcher, ...], tuple[Matcher, ...], tuple[str, ...]]

_MATCHER = re.compile(r'^\s*(?P<name>\w+)\s*(?P<op>=~|!~|!=|=)\s*"(?P<value>[^"]*)"\s*$')


def parse_matcher(text: str) -> Matcher:
    match = _MATCHER.match(text)
    assert match, f"not a matcher this test reads: {text}"
    return (match["name"], match["op"], match["value"])


def plain_rules(inhibit_rules: list[dict[str, Any]]) -> list[Rule]:
    """Alertmanager's inhibit_rules (source_matchers, target_matchers, equal) as tuples."""
    out = []
    for rule in inhibit_rules:
        assert set(rule) == {"source_matchers", "target_matchers", "equal"}, rule
        source = tuple(parse_matcher(m) for m in rule["source_matchers"])
        target = tuple(parse_matcher(m) for m in rule["target_matchers"])
        out.append((source, target, tuple(rule["equal"])))
    return out


def crd_matcher(matcher: dict[str, Any]) -> str:
    return f'{matcher["name"]}{matcher.get("matchType", "=")}"{matcher["value"]}"'


def crd_route(route: dict[str, Any]) -> dict[str, Any]:
    """An AlertmanagerConfig route in Alertmanager's own terms, as the operator writes it."""
    keys = {
        "receiver": "receiver",
        "groupBy": "group_by",
        "groupWait": "group_wait",
        "groupInterval": "group_interval",
        "repeatInterval": "repeat_interval",
        "continue": "continue",
    }
    out = {keys[k]: v for k, v in route.items() if k in keys}
    if "matchers" in route:
        out["matchers"] = [crd_matcher(m) for m in route["matchers"]]
    if "routes" in route:
        out["routes"] = [crd_route(r) for r in route["routes"]]
    return out


def alertmanager_yml(config: dict[str, Any]) -> dict[str, Any]:
    """The alertmanager.yml an AlertmanagerConfig amounts to, leaving out the namespace matchers
    the operator adds (every netmon alert carries the namespace where the operator runs)."""
    spec = config["spec"]
    return {
        "route": crd_route(spec["route"]),
        "receivers": [{"name": r["name"]} for r in spec["receivers"]],
        "inhibit_rules": [
            {
                "source_matchers": [crd_matcher(m) for m in rule["sourceMatch"]],
                "target_matchers": [crd_matcher(m) for m in rule["targetMatch"]],
                "equal": rule["equal"],
            }
            for rule in spec["inhibitRules"]
        ],
    }


def test_compose_the_snippet_and_the_alertmanagerconfig_inhibit_alike() -> None:
    snippet = plain_rules(load_yaml(INHIBIT_SNIPPET)["inhibit_rules"])
    assert snippet, "no inhibition rules"
    assert plain_rules(load_yaml(COMPOSE / "alertmanager.yml")["inhibit_rules"]) == snippet
    converted = alertmanager_yml(load_yaml(ALERTMANAGER_CONFIG))
    assert plain_rules(converted["inhibit_rules"]) == snippet
    # The routes too: grouping per node, one notification per suspect peer.
    compose_route = load_yaml(COMPOSE / "alertmanager.yml")["route"]
    for route in (compose_route, converted["route"]):
        assert route["group_by"] == ["alertname", "cluster", "instance"]
        (peer,) = route["routes"]
        assert peer["matchers"] == ['alertname="NetmonNodePeerSuspect"']
        assert peer["group_by"] == ["alertname", "cluster", "peer"]


def test_amtool_accepts_every_alertmanager_file(tmp_path: Path) -> None:
    amtool = tool("amtool", "apt-get install prometheus-alertmanager (ships amtool)")
    minimal = {"route": {"receiver": "default"}, "receivers": [{"name": "default"}]}
    documents = {
        "compose.yml": load_yaml(COMPOSE / "alertmanager.yml"),
        "snippet.yml": {**minimal, **load_yaml(INHIBIT_SNIPPET)},
        "alertmanagerconfig.yml": alertmanager_yml(load_yaml(ALERTMANAGER_CONFIG)),
    }
    for name, document in documents.items():
        path = tmp_path / name
        path.write_text(yaml.safe_dump(document))
        output = run(amtool, "check-config", str(path))
        assert "SUCCESS" in output and "6 inhibit rules" in output, (name, output)


def test_the_alertmanagerconfig_uses_fields_its_crd_defines() -> None:
    # No schema for the operator's CRDs here: the fields of monitoring.coreos.com/v1alpha1
    # AlertmanagerConfig (pkg/apis/monitoring/v1alpha1/alertmanager_config_types.go) it may use.
    config = load_yaml(ALERTMANAGER_CONFIG)
    assert config["apiVersion"] == "monitoring.coreos.com/v1alpha1"
    assert config["kind"] == "AlertmanagerConfig"
    assert config["metadata"]["namespace"] == "netmon", "the namespace the alerts carry"
    spec = config["spec"]
    assert set(spec) <= {"route", "receivers", "inhibitRules", "muteTimeIntervals"}
    route_fields = {
        "receiver",
        "groupBy",
        "groupWait",
        "groupInterval",
        "repeatInterval",
        "matchers",
        "continue",
        "routes",
        "muteTimeIntervals",
        "activeTimeIntervals",
    }

    def matchers(found: list[dict[str, Any]]) -> None:
        for matcher in found:
            assert set(matcher) <= {"name", "value", "matchType", "regex"}, matcher
            assert matcher.get("matchType", "=") in ("=", "!=", "=~", "!~"), matcher

    def routes(route: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield route
        for child in route.get("routes", []):
            yield from routes(child)

    receivers = {r["name"] for r in spec["receivers"]}
    for route in routes(spec["route"]):
        assert set(route) <= route_fields, route
        assert route["receiver"] in receivers, route
        matchers(route.get("matchers", []))
    for rule in spec["inhibitRules"]:
        assert set(rule) <= {"sourceMatch", "targetMatch", "equal"}, rule
        matchers(rule["sourceMatch"] + rule["targetMatch"])


def alert_names(matchers: tuple[Matcher, ...]) -> set[str]:
    (name_matcher,) = [m for m in matchers if m[0] == "alertname"]
    _, op, value = name_matcher
    assert op in ("=", "=~"), name_matcher
    return set(value.split("|")) if op == "=~" else {value}


def alert_labels() -> dict[str, set[str]]:
    """Every label each alert carries, as netmon-rules.test.yaml expects them firing."""
    found: dict[str, set[str]] = {}
    for case in load_yaml(RULE_TESTS)["tests"]:
        for check in case.get("alert_rule_test", []):
            for expected in check.get("exp_alerts") or []:
                found.setdefault(check["alertname"], set()).update(expected["exp_labels"])
    return found


def test_inhibition_rules_name_real_alerts_and_labels_both_sides_carry() -> None:
    # A rule whose `equal` names a label one side lacks never mutes anything (or, absent on
    # both, mutes across every node); a misspelt alertname neither.
    labels = alert_labels()
    for source, target, equal in plain_rules(load_yaml(INHIBIT_SNIPPET)["inhibit_rules"]):
        assert "instance" in equal, "a cause on one node must not mute another node"
        for name in alert_names(source) | alert_names(target):
            assert name in alerts(), f"no alert {name}"
            missing = set(equal) - labels[name] - TARGET_LABELS
            assert not missing, f"{name} has no {missing} for equal: {list(equal)}"


# Inhibition in a real Alertmanager


def _alertmanager_binary() -> str:
    for name in ("prometheus-alertmanager", "alertmanager"):  # Debian's name, upstream's
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("alertmanager is not installed: apt-get install prometheus-alertmanager")


class Alertmanager:
    """A real Alertmanager on a free loopback port, with gossip off."""

    def __init__(self, tmp_path: Path, config: Path) -> None:
        self.port = free_port()
        self.log_path = tmp_path / "alertmanager.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    _alertmanager_binary(),
                    f"--config.file={config}",
                    f"--storage.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(self._ready, 30, "alertmanager to be ready", poll=0.2)

    def _ready(self) -> bool:
        return server_ready(self.proc, self.log_path, self.port, "alertmanager")

    def post(self, alerts: list[dict[str, str]]) -> None:
        now = datetime.now(timezone.utc)
        body = [
            {
                "labels": labels,
                "startsAt": now.isoformat(),
                "endsAt": (now + timedelta(hours=1)).isoformat(),
            }
            for labels in alerts
        ]
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/api/v2/alerts",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

    def alerts(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.port}/api/v2/alerts", timeout=10
        ) as response:
            found: list[dict[str, Any]] = json.load(response)
        return found

    def stop(self) -> None:
        stop_server(self.proc)


def _alert(name: str, cluster: str | None = "train-a", **labels: str) -> dict[str, str]:
    out = {"alertname": name, "job": "netmon", "severity": "warning", **labels}
    if cluster is not None:
        out["cluster"] = cluster
    return out


_SERIES = {"op": "all_reduce", "size_bytes": "268435456"}
_FLEET = {**_SERIES, "gpu_model": "NVIDIA H100 80GB HBM3", "measure": "reference"}

# Every alert posted, with the alert expected to mute it (None: notified).
SCENARIO: list[tuple[dict[str, str], str | None]] = [
    # A suspect GPU mutes its node's pair and bandwidth alerts, not another node's or cluster's.
    (_alert("NetmonGpuSuspect", instance="n1", probe="pairs", gpu="5"), None),
    (
        _alert("NetmonGpuPairSuspect", instance="n1", probe="pairs", gpu="0", peer_gpu="3"),
        "NetmonGpuSuspect",
    ),
    (
        _alert("NetmonBusbwDegraded", instance="n1", probe="large", path="default", **_SERIES),
        "NetmonGpuSuspect",
    ),
    (
        _alert(
            "NetmonBusbwBelowThreshold", instance="n1", probe="large", path="default", **_SERIES
        ),
        "NetmonGpuSuspect",
    ),
    (
        _alert("NetmonBusbwFlapping", instance="n1", probe="small", path="default", **_SERIES),
        "NetmonGpuSuspect",
    ),
    (
        _alert("NetmonBelowFleet", instance="n1", probe="large", path="default", **_FLEET),
        "NetmonGpuSuspect",
    ),
    (_alert("NetmonGpuPairSuspect", instance="n2", probe="pairs", gpu="0", peer_gpu="3"), None),
    (
        _alert(
            "NetmonGpuPairSuspect", "train-b", instance="n1", probe="pairs", gpu="0", peer_gpu="3"
        ),
        None,
    ),
    # Without a cluster label on either side (a single-cluster scrape) it mutes all the same.
    (_alert("NetmonGpuSuspect", None, instance="n8", probe="pairs", gpu="1"), None),
    (
        _alert("NetmonGpuPairSuspect", None, instance="n8", probe="pairs", gpu="2", peer_gpu="3"),
        "NetmonGpuSuspect",
    ),
    # A GPU short of NVLinks mutes its suspicion and its links' errors, not another GPU's.
    (_alert("NetmonNvlinkDown", instance="n3", gpu="1"), None),
    (_alert("NetmonGpuSuspect", instance="n3", probe="pairs", gpu="1"), "NetmonNvlinkDown"),
    (_alert("NetmonGpuSuspect", instance="n3", probe="pairs", gpu="2"), None),
    (_alert("NetmonNvlinkErrors", instance="n3", gpu="1", error="recovery"), "NetmonNvlinkDown"),
    (_alert("NetmonNvlinkErrors", instance="n3", gpu="2", error="replay"), None),
    # A failing probe mutes its own results and staleness.
    (_alert("NetmonProbeFailing", instance="n4", probe="large"), None),
    (
        _alert("NetmonBusbwDegraded", instance="n4", probe="large", path="default", **_SERIES),
        "NetmonProbeFailing",
    ),
    (_alert("NetmonProbeStale", instance="n4", probe="large"), "NetmonProbeFailing"),
    (_alert("NetmonBusbwDegraded", instance="n4", probe="small", path="default", **_SERIES), None),
    # A transport mismatch mutes that path's bandwidth alerts only.
    (
        _alert(
            "NetmonTransportMismatch",
            instance="n5",
            probe="large",
            path="default",
            reason="shm_where_nvlink_expected",
        ),
        None,
    ),
    (
        _alert("NetmonBusbwDegraded", instance="n5", probe="large", path="default", **_SERIES),
        "NetmonTransportMismatch",
    ),
    (
        _alert("NetmonBusbwFlapping", instance="n5", probe="large", path="default", **_SERIES),
        "NetmonTransportMismatch",
    ),
    (
        _alert("NetmonBelowFleet", instance="n5", probe="large", path="default", **_FLEET),
        "NetmonTransportMismatch",
    ),
    (_alert("NetmonBusbwDegraded", instance="n5", probe="large", path="pcie", **_SERIES), None),
    (_alert("NetmonBelowFleet", instance="n5", probe="large", path="pcie", **_FLEET), None),
    # A degraded series does not mute its own flapping alert (it comes and goes with it).
    (_alert("NetmonBusbwDegraded", instance="n10", probe="small", path="default", **_SERIES), None),
    (_alert("NetmonBusbwFlapping", instance="n10", probe="small", path="default", **_SERIES), None),
    # Link health is read on its own schedule: probes that do not run explain no old reading.
    (_alert("NetmonProbeStale", instance="n6", probe="large"), None),
    (_alert("NetmonLinkHealthStale", instance="n6"), None),
    # Two sweeps in a row naming a node mute its flapping alert, not another node's.
    (_alert("NetmonSweepSuspect", instance="n7"), None),
    (_alert("NetmonSweepSuspectFlapping", instance="n7"), "NetmonSweepSuspect"),
    (_alert("NetmonSweepSuspectFlapping", instance="n9"), None),
]


def test_a_real_alertmanager_mutes_symptoms_while_their_cause_fires(tmp_path: Path) -> None:
    config = yaml.safe_load((COMPOSE / "alertmanager.yml").read_text())
    # Every inhibition rule is exercised by the scenario.
    sources = {n for s, _, _ in plain_rules(config["inhibit_rules"]) for n in alert_names(s)}
    assert sources == {cause for _, cause in SCENARIO if cause}
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    alertmanager = Alertmanager(tmp_path, path)
    try:
        alertmanager.post([labels for labels, _ in SCENARIO])
        expected = {json.dumps(labels, sort_keys=True): cause for labels, cause in SCENARIO}

        def outcome() -> dict[str, str | None] | None:
            found = alertmanager.alerts()
            if len(found) != len(SCENARIO):
                return None
            names = {a["fingerprint"]: a["labels"]["alertname"] for a in found}
            got: dict[str, str | None] = {}
            for alert in found:
                by = alert["status"]["inhibitedBy"]
                assert len(by) <= 1, alert
                got[json.dumps(alert["labels"], sort_keys=True)] = names[by[0]] if by else None
            return got if got == expected else None

        try:
            wait_for(outcome, 30, "Alertmanager to inhibit as the rules say", poll=0.5)
        except AssertionError:
            # Name the differences, not just the timeout.
            now = {
                json.dumps(a["labels"], sort_keys=True): a["status"] for a in alertmanager.alerts()
            }
            wrong = {k: (expected.get(k), now.get(k)) for k in expected.keys() | now.keys()}
            raise AssertionError(json.dumps(wrong, indent=1)) from None
        states = {a["status"]["state"] for a in alertmanager.alerts() if a["status"]["inhibitedBy"]}
        assert states == {"suppressed"}
    finally:
        alertmanager.stop()
