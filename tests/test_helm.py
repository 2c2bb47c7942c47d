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
from netmon.sweep.kube.scheduler import PERMISSIONS
from tests import crd_schema
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
# Sweeps on, with every optional object of theirs.
SWEEP: dict[str, Any] = {
    "sweep": {
        "enabled": True,
        "kueue": {"createLocalQueue": True, "createPriorityClass": True},
        "podPriorityClass": {"name": "netmon-sweep-pods", "create": True},
    }
}


def rdma_values() -> dict[str, Any]:
    """The values that make the chart what deploy/kubernetes-rdma makes of the base."""
    config = yaml.safe_load(load_yaml(KUBERNETES_RDMA / "configmap.yaml")["data"]["netmon.yaml"])
    # The chart sets listen (the node's address, as NETMON_LISTEN does there); the web-config is
    # the Secret netmon-web's, with TLS.
    del config["listen"]
    return {
        "rdma": {"enabled": True},
        "config": config,
        "nodeSelector": {"netmon/group": "rack-a"},
        "webConfig": {"secretName": "netmon-web", "tls": True},
    }


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values or {}, name="netmon", namespace="netmon")
    return [
        document
        for path, text in rendered.items()
        if not path.endswith("NOTES.txt")  # text for the operator, not an object
        for document in yaml.safe_load_all(text)
        if document
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
    "values",
    [{}, EVERYTHING, rdma_values(), SWEEP],
    ids=["defaults", "everything", "rdma", "sweep"],
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
    "values",
    [{}, EVERYTHING, rdma_values(), SWEEP],
    ids=["defaults", "everything", "rdma", "sweep"],
)
def test_every_rendered_object_validates_against_the_api_schemas(
    values: dict[str, Any], tmp_path: Path
) -> None:
    validate = tool("kubernetes-validate", "pip install -e '.[dev]' (kubernetes-validate)")
    # As in tests/test_deploy.py: built-in API groups (no dot, or *.k8s.io) against the
    # schemas; the Prometheus Operator's and Kueue's CRDs have none there (Kueue's objects are
    # checked against its CRDs below).
    files = []
    for index, document in enumerate(render(values)):
        group = document["apiVersion"].split("/")[0]
        if "." not in group or group.endswith(".k8s.io"):
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
    # Differences on purpose: the PriorityClass that dcgm-exporter and the GPU Operator use
    # (the kustomize pods have none), and a memory limit computed from the probes (kustomize's
    # is a fixed 24Gi); the requests are the same.
    assert chart_pod["priorityClassName"] == "system-node-critical"
    assert "priorityClassName" not in pod
    assert ours["resources"]["requests"] == theirs["resources"]["requests"]
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
    # The limit: 8 ranks x (300Mi + 2 x 1024Mi); the request: memory.request, what the daemon
    # holds between probes, so that the limit is not taken from every GPU node for good.
    assert memory(one_gig) == ("1Gi", "18784Mi")
    assert memory({}) == ("1Gi", "18784Mi"), "the default config's largest size is 1G"
    # A size in bytes: a number, which Helm holds as a float.
    in_bytes = {"config": {"probes": [{"name": "a", "sizes": [8, 1073741824]}]}}
    assert memory(in_bytes) == ("1Gi", "18784Mi")
    sweep = {
        "config": {"probes": [{"name": "a", "sizes": {"min": 8, "max": "256MiB"}}]},
        "memory": {"ranks": 4, "perRankMi": 200},
    }
    assert memory(sweep) == ("1Gi", f"{4 * (200 + 512)}Mi")
    listed = {"config": {"probes": [{"name": "a", "sizes": "8,2G"}]}, "memory": {"ranks": 2}}
    assert memory(listed) == ("1Gi", f"{2 * (300 + 4096)}Mi")
    small = {"memory": {"largestSize": "512M", "ranks": 1, "request": "512Mi"}}
    assert memory(small) == ("512Mi", "1324Mi")
    fixed = {"resources": {"requests": {"memory": "4Gi", "cpu": "1"}, "limits": {"memory": "8Gi"}}}
    resources = container(render(fixed))["resources"]
    assert resources == {"requests": {"memory": "4Gi", "cpu": "1"}, "limits": {"memory": "8Gi"}}
    # null is empty: the chart's memory stays, the CPU request goes.
    for empty in ({"resources": None}, {"resources": {"requests": None, "limits": None}}):
        assert container(render(empty))["resources"] == {
            "requests": {"memory": "1Gi"},
            "limits": {"memory": "18784Mi"},
        }


def test_the_memory_request_is_at_most_the_limit() -> None:
    def memory(values: dict[str, Any]) -> tuple[str, str]:
        resources = container(render(values))["resources"]
        return resources["requests"]["memory"], resources["limits"]["memory"]

    # Two ranks and probes up to 64M: 2 x (300Mi + 128Mi), below the default 1Gi request, which
    # becomes the limit rather than failing the render on small nodes.
    small = {"config": {"probes": [{"name": "a", "sizes": [8, "64M"]}]}, "memory": {"ranks": 2}}
    assert memory(small) == ("856Mi", "856Mi")
    assert memory({**small, "memory": {"ranks": 2, "request": "2Gi"}}) == ("856Mi", "856Mi")
    assert memory({**small, "memory": {"ranks": 2, "request": "512Mi"}}) == ("512Mi", "856Mi")
    # An explicit limit below memory.request: the request follows it too.
    capped = {"resources": {"limits": {"memory": "768Mi"}}}
    assert memory(capped) == ("768Mi", "768Mi")
    # Kubernetes refuses a request above the limit: an explicit resources.requests.memory is
    # the operator's, so the chart says so rather than lower it.
    for explicit in (
        {**small, "resources": {"requests": {"memory": "1Gi"}}},
        {"resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "768Mi"}}},
    ):
        with pytest.raises(
            helm.HelmRenderError,
            match=r"resources\.requests\.memory \(1Gi\) is above the memory limit \((856|768)Mi",
        ):
            render(explicit)
    explicit_fits = {**small, "resources": {"requests": {"memory": "856Mi"}}}
    assert memory(explicit_fits) == ("856Mi", "856Mi")


def test_the_image_tag_defaults_to_the_app_version() -> None:
    app_version = load_yaml(CHART / "Chart.yaml")["appVersion"]
    pod = one(render(), "DaemonSet")["spec"]["template"]["spec"]
    images = {c["image"] for c in pod["containers"] + pod["initContainers"]}
    assert images == {f"netmon:{app_version}"}
    pod = one(render({"image": {"repository": "r.example/netmon", "tag": "9"}}), "DaemonSet")
    assert pod["spec"]["template"]["spec"]["containers"][0]["image"] == "r.example/netmon:9"


def _sweep_config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    document = yaml.safe_load(one(objects, "ConfigMap", "netmon-sweep")["data"]["netmon.yaml"])
    assert isinstance(document, dict)
    return document


def test_the_sweep_cronjob_runs_one_sweep_at_a_time_on_kubernetes() -> None:
    objects = render(SWEEP)
    cron = one(objects, "CronJob", "netmon-sweep")["spec"]
    assert cron["concurrencyPolicy"] == "Forbid" and cron["startingDeadlineSeconds"] == 600
    assert cron["schedule"] == "17 * * * *"
    pod = cron["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][:4] == ["sweep", "--scheduler", "kubernetes", "--json"]
    assert pod["serviceAccountName"] == "netmon-sweep" and pod["restartPolicy"] == "Never"
    document = _sweep_config(objects)
    config = parse_config(document, "the sweep's ConfigMap").sweep
    assert config is not None and config.scheduler == "kubernetes"
    kube = config.kubernetes
    daemon_pod = one(objects, "DaemonSet")["spec"]["template"]
    assert kube.namespace == "netmon" and kube.image == container["image"]
    assert kube.image == daemon_pod["spec"]["containers"][0]["image"]
    assert kube.config_map == one(objects, "ConfigMap")["metadata"]["name"]
    # Reports go to the daemons' pods, never to the sweep's own.
    assert kube.daemon_labels.items() <= daemon_pod["metadata"]["labels"].items()
    sweep_labels = cron["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert not kube.daemon_labels.items() <= sweep_labels.items()
    # Signed by default: the sweep holds the private key, each daemon the public key only
    # (tests/test_helm_sweep_signing.py has the rest).
    assert config.signing_key_file is not None and config.secret_file is None
    assert netmon_yaml(objects)["sweep"] == {
        "verify_key_file": "/var/run/secrets/netmon-sweep/ed25519.pub"
    }
    settings = {"sweep": {**SWEEP["sweep"], "settings": {"pair_timeout": "2m", "rails": 4}}}
    overridden = parse_config(_sweep_config(render(settings))).sweep
    assert overridden is not None and overridden.pair_timeout == 120 and overridden.rails == 4
    # The sweep's own pod, which must make no node busy, known by the downward API.
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"][1:]}
    assert env == {
        "NETMON_SWEEP_POD_NAME": "metadata.name",
        "NETMON_SWEEP_POD_NAMESPACE": "metadata.namespace",
        "NETMON_SWEEP_POD_UID": "metadata.uid",
    }
    assert kube.image_pull_secrets == () and kube.rdma_resource is None and not kube.ipc_lock


def test_the_pairs_pods_get_the_charts_pull_secrets_and_rdma_settings() -> None:
    values = copy.deepcopy(SWEEP)
    values["imagePullSecrets"] = [{"name": "regcred"}, {"name": "mirror"}]
    values["sweep"] |= {"rdmaResource": "rdma/ib", "ipcLock": True, "hostNetwork": True}
    objects = render(values)
    config = parse_config(_sweep_config(objects)).sweep
    assert config is not None
    kube = config.kubernetes
    assert kube.image_pull_secrets == ("regcred", "mirror")
    assert kube.rdma_resource == "rdma/ib" and kube.ipc_lock and kube.host_network
    cron = one(objects, "CronJob", "netmon-sweep")["spec"]["jobTemplate"]["spec"]["template"]
    assert cron["spec"]["imagePullSecrets"] == values["imagePullSecrets"]
    report = helm.lint(CHART, values, strict=True, namespace="netmon")
    assert report["errors"] == [], report
    for key, bad in (("rdmaResource", "no slash"), ("ipcLock", "yes")):
        with pytest.raises(helm.HelmValuesError, match=f"/sweep/{key}"):
            render({"sweep": {**SWEEP["sweep"], key: bad}})


@pytest.mark.parametrize(
    ("deadline", "active", "renders"),
    [(None, 1800, False), (None, 1801, True), ("40m", 2400, False), ("39m", 2400, True)],
)
def test_the_jobs_deadline_must_leave_the_sweep_its_own(
    deadline: str | None, active: int, renders: bool
) -> None:
    """The Job's activeDeadlineSeconds kills the sweep: it must come after the sweep's own
    deadline (sweep.settings.deadline, netmon's default 30 min), which ends its rounds."""
    sweep: dict[str, Any] = {**SWEEP["sweep"], "activeDeadlineSeconds": active}
    if deadline is not None:
        sweep["settings"] = {"deadline": deadline}
    if renders:
        cron = one(render({"sweep": sweep}), "CronJob", "netmon-sweep")
        assert cron["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] == active
        return
    with pytest.raises(
        helm.HelmRenderError, match=r"sweep\.activeDeadlineSeconds \(\d+\) must be more than"
    ):
        render({"sweep": sweep})


def test_the_sweep_may_do_what_its_scheduler_asks_and_no_more() -> None:
    """The Role and ClusterRole grant exactly what the sweep asks for (PERMISSIONS, which
    tests/test_sweep_kube.py holds to the calls a sweep makes, against an API server that
    refuses any other): a verb more is a reviewer's question, a verb less a 403 in a sweep."""
    objects = render(SWEEP)

    def rules(kind: str, scope: str) -> set[tuple[str, str, str, str]]:
        return {
            (group, resource, verb, scope)
            for rule in one(objects, kind, "netmon-sweep")["rules"]
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }

    granted = rules("Role", "namespace") | rules("ClusterRole", "cluster")
    assert granted == PERMISSIONS
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        (subject,) = one(objects, kind, "netmon-sweep")["subjects"]
        assert subject == {"kind": "ServiceAccount", "name": "netmon-sweep", "namespace": "netmon"}


@pytest.mark.parametrize("version", ["kueue.x-k8s.io/v1beta1", "kueue.x-k8s.io/v1beta2"])
def test_the_kueue_objects_validate_against_kueue_crds(version: str) -> None:
    values = copy.deepcopy(SWEEP)
    values["sweep"]["kueue"]["apiVersion"] = version
    kueue = [o for o in render(values) if o["apiVersion"].startswith("kueue.x-k8s.io/")]
    assert sorted(o["kind"] for o in kueue) == ["LocalQueue", "WorkloadPriorityClass"]
    for document in kueue:
        assert document["apiVersion"] == version and crd_schema.errors(document) == []
    (priority,) = [o for o in kueue if o["kind"] == "WorkloadPriorityClass"]
    assert priority["value"] == -1000000 and isinstance(priority["value"], int)
    bad = {**priority, "value": "lowest"}
    assert crd_schema.errors(bad)
    (queue,) = [o for o in kueue if o["kind"] == "LocalQueue"]
    assert crd_schema.errors({**queue, "spec": {**queue["spec"], "clusterQueues": "x"}})
