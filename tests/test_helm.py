"""The Helm chart (deploy/helm/netmon), rendered and linted offline by Helm's own Go SDK through
helm-python-sdk: no helm binary, no cluster. Its objects are checked as tests/test_deploy.py
checks the kustomize manifests, and against them."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from netmon.config import parse_config
from tests.test_deploy import (
    DEPLOY,
    KUBERNETES,
    KUBERNETES_RDMA,
    RULES,
    load_yaml,
    manifest,
    run,
    tool,
)

CHART = DEPLOY / "helm" / "netmon"
DASHBOARD = DEPLOY.parent / "grafana" / "dashboards" / "netmon.json"
EVERYTHING = {
    "serviceMonitor": {"enabled": True, "additionalLabels": {"release": "kps"}},
    "prometheusRule": {"enabled": True, "additionalLabels": {"release": "kps"}},
    "dashboard": {"enabled": True},
}


def rdma_values() -> dict[str, Any]:
    """The values that make the chart what deploy/kubernetes-rdma makes of the base."""
    config = load_yaml(KUBERNETES_RDMA / "configmap.yaml")["data"]["netmon.yaml"]
    return {
        "rdma": {"enabled": True},
        "config": yaml.safe_load(config),
        "nodeSelector": {"netmon/group": "rack-a"},
    }


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values or {}, name="netmon", namespace="netmon")
    return [
        document for text in rendered.values() for document in yaml.safe_load_all(text) if document
    ]


def one(objects: list[dict[str, Any]], kind: str, name: str = "netmon") -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any]
    (found,) = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return found


def netmon_yaml(objects: list[dict[str, Any]]) -> dict[str, Any]:
    document = yaml.safe_load(one(objects, "ConfigMap")["data"]["netmon.yaml"])
    assert isinstance(document, dict)
    return document


def kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = tool("kubectl", "kubectl (Kubernetes' client; kubectl kustomize needs no cluster)")
    return list(yaml.safe_load_all(run(kubectl, "kustomize", str(directory))))


@pytest.mark.parametrize(
    "values", [{}, EVERYTHING, rdma_values()], ids=["defaults", "everything", "rdma"]
)
def test_the_chart_lints_strictly(values: dict[str, Any]) -> None:
    report = helm.lint(CHART, values, strict=True, namespace="netmon")
    assert report["errors"] == [], report
    # Severity 2 is a warning, 3 an error; an info ("icon is recommended") is no finding.
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


def _kinds(values: dict[str, Any]) -> Iterator[str]:
    for document in render(values):
        yield document["kind"]


def test_the_defaults_leave_out_what_needs_the_prometheus_operator_or_grafana() -> None:
    assert sorted(_kinds({})) == ["ConfigMap", "DaemonSet", "Service"]
    kinds = sorted(_kinds(EVERYTHING))
    assert kinds == [
        "ConfigMap",
        "ConfigMap",
        "DaemonSet",
        "PrometheusRule",
        "Service",
        "ServiceMonitor",
    ]


@pytest.mark.parametrize(
    "values", [{}, EVERYTHING, rdma_values()], ids=["defaults", "everything", "rdma"]
)
def test_every_rendered_object_validates_against_the_api_schemas(
    values: dict[str, Any], tmp_path: Path
) -> None:
    validate = tool("kubernetes-validate", "pip install -e '.[dev]' (kubernetes-validate)")
    # As in tests/test_deploy.py: built-in API groups (no dot) against the schemas; the
    # Prometheus Operator's CRDs have none there.
    files = []
    for index, document in enumerate(render(values)):
        if "." not in document["apiVersion"].split("/")[0]:
            files.append(tmp_path / f"{index}-{document['kind'].lower()}.yaml")
            files[-1].write_text(yaml.safe_dump(document))
    output = run(validate, "--strict", *map(str, files))
    for path in files:
        assert f"{path.name} passed" in output, output


def test_the_rendered_rules_equal_the_rules_file() -> None:
    rule = one(render(EVERYTHING), "PrometheusRule")
    assert rule["spec"] == {"groups": load_yaml(RULES)["groups"]}
    assert rule["metadata"]["labels"]["release"] == "kps"
    # The chart's copy is deploy/render.py's, and up to date.
    run(sys.executable, str(DEPLOY / "render.py"), "--check")


def test_the_dashboard_configmap_carries_the_sidecar_label_and_the_dashboard() -> None:
    dashboard = one(render(EVERYTHING), "ConfigMap", "netmon-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["netmon.json"]) == json.loads(DASHBOARD.read_text())
    custom = {"dashboard": {"enabled": True, "label": "my_dashboards", "labelValue": "yes"}}
    labels = one(render(custom), "ConfigMap", "netmon-dashboard")["metadata"]["labels"]
    assert labels["my_dashboards"] == "yes" and "grafana_dashboard" not in labels


def test_the_servicemonitor_carries_the_release_label_and_keeps_job_netmon() -> None:
    objects = render(EVERYTHING)
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    # NetmonTargetDown expects job="netmon", whatever the release is called.
    service = one(objects, "Service")
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "netmon"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    kustomized = manifest("ServiceMonitor")["spec"]["endpoints"]
    assert monitor["spec"]["endpoints"] == kustomized


def test_the_default_configuration_is_the_kustomize_one_with_the_kubelet_guard() -> None:
    objects = render()
    document = netmon_yaml(objects)
    kubelet_socket = document.pop("idle")["kubelet_socket"]
    assert document == yaml.safe_load(manifest("ConfigMap")["data"]["netmon.yaml"])
    config = parse_config(netmon_yaml(objects), "chart ConfigMap")
    assert str(config.idle.kubelet_socket) == kubelet_socket
    assert kubelet_socket.startswith("/var/lib/kubelet/pod-resources/")
    mounts = {m["mountPath"]: m for m in container(objects)["volumeMounts"]}
    assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"] is True
    # The socket is root's (docs/DEPLOY.md): with the guard on, the container is root.
    assert container(objects)["securityContext"]["runAsUser"] == 0
    off = render({"kubeletGuard": {"enabled": False}})
    assert "idle" not in netmon_yaml(off)
    assert "runAsUser" not in container(off)["securityContext"]


# What must not drift between the kustomize DaemonSet and the chart's.
AGREED = ("args", "ports", "livenessProbe", "readinessProbe", "volumeMounts", "env")
POD_AGREED = (
    "volumes",
    "securityContext",
    "tolerations",
    "nodeSelector",
    "hostPID",
    "hostNetwork",
    "dnsPolicy",
    "runtimeClassName",
    "automountServiceAccountToken",
)


def _without_root(security: dict[str, Any]) -> dict[str, Any]:
    security = copy.deepcopy(security)
    security.pop("runAsUser", None)
    security.pop("runAsNonRoot", None)
    return security


@pytest.mark.parametrize("variant", ["base", "rdma"])
def test_the_chart_daemonset_agrees_with_the_kustomize_one(variant: str) -> None:
    if variant == "base":
        (kustomized,) = [d for d in kustomize(KUBERNETES) if d["kind"] == "DaemonSet"]
        charted = one(render(), "DaemonSet")
    else:
        (kustomized,) = [d for d in kustomize(KUBERNETES_RDMA) if d["kind"] == "DaemonSet"]
        charted = one(render(rdma_values()), "DaemonSet")
    pod, chart_pod = kustomized["spec"]["template"]["spec"], charted["spec"]["template"]["spec"]
    (ours,), (theirs,) = chart_pod["containers"], pod["containers"]
    for field in AGREED:
        key = "name" if field in ("ports", "env", "volumeMounts") else None
        if key:
            assert sorted(ours[field], key=lambda x: x[key]) == sorted(
                theirs[field], key=lambda x: x[key]
            ), field
        else:
            assert ours[field] == theirs[field], field
    env = [e["name"] for e in ours["env"]]
    if "NETMON_GROUP__SELF" in env:
        assert env.index("NODE_NAME") < env.index("NETMON_GROUP__SELF")
    if variant == "base":
        # The one difference on purpose: root for the kubelet's socket, which the kustomize
        # DaemonSet leaves commented out.
        assert _without_root(ours["securityContext"]) == theirs["securityContext"]
        assert ours["securityContext"]["runAsUser"] == 0
    else:
        assert ours["securityContext"] == theirs["securityContext"]
    for field in POD_AGREED:
        mine, kept = chart_pod.get(field), pod.get(field)
        if field == "volumes":
            mine, kept = (
                sorted(mine, key=lambda v: v["name"]),
                sorted(kept, key=lambda v: v["name"]),
            )
            for volume in mine:
                if "configMap" in volume:
                    volume["configMap"]["name"] = "netmon"
        assert mine == kept, field
    (init,), (their_init,) = chart_pod["initContainers"], pod["initContainers"]
    # The container is root in both (the kubelet's socket, IPC_LOCK): root without
    # CAP_DAC_OVERRIDE writes only where it owns.
    assert init["command"] == ["chown", "0:0", "/var/lib/netmon"]
    assert init["securityContext"] == their_init["securityContext"]
    assert "nvidia.com/gpu" not in json.dumps(ours["resources"])


def test_the_memory_follows_the_largest_probe_size_and_the_ranks() -> None:
    def memory(values: dict[str, Any]) -> tuple[str, str]:
        resources = container(render(values))["resources"]
        return resources["requests"]["memory"], resources["limits"]["memory"]

    one_gig = {
        "config": {"probes": [{"name": "a", "sizes": [8, "64K", "1G"]}]},
        "memory": {"ranks": 8},
    }
    # 8 ranks x (300Mi + 2 x 1024Mi)
    assert memory(one_gig) == ("18784Mi", "18784Mi")
    assert memory({}) == ("18784Mi", "18784Mi"), "the default config's largest size is 1G"
    sweep = {
        "config": {"probes": [{"name": "a", "sizes": {"min": 8, "max": "256MiB"}}]},
        "memory": {"ranks": 4, "perRankMi": 200},
    }
    assert memory(sweep) == (f"{4 * (200 + 512)}Mi",) * 2
    listed = {"config": {"probes": [{"name": "a", "sizes": "8,2G"}]}, "memory": {"ranks": 2}}
    assert memory(listed) == (f"{2 * (300 + 4096)}Mi",) * 2
    assert memory({"memory": {"largestSize": "512M", "ranks": 1}}) == ("1324Mi", "1324Mi")
    fixed = {"resources": {"requests": {"memory": "4Gi", "cpu": "1"}, "limits": {"memory": "8Gi"}}}
    resources = container(render(fixed))["resources"]
    assert resources == {"requests": {"memory": "4Gi", "cpu": "1"}, "limits": {"memory": "8Gi"}}


def test_the_image_tag_defaults_to_the_app_version() -> None:
    app_version = load_yaml(CHART / "Chart.yaml")["appVersion"]
    pod = one(render(), "DaemonSet")["spec"]["template"]["spec"]
    images = {c["image"] for c in pod["containers"] + pod["initContainers"]}
    assert images == {f"netmon:{app_version}"}
    pod = one(render({"image": {"repository": "r.example/netmon", "tag": "9"}}), "DaemonSet")
    assert pod["spec"]["template"]["spec"]["containers"][0]["image"] == "r.example/netmon:9"
