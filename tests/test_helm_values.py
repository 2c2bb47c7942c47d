"""Every value of the Helm chart (deploy/helm/netmon), set each way values.schema.json allows,
renders objects the API server and netmon take, lints strictly, and keeps one port; and what
the chart refuses, it refuses by name. Rendered offline by Helm's Go SDK, as tests/test_helm.py.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from kubernetes_validate.utils import schema_contents  # type: ignore[import-untyped]
from referencing import Registry, Resource

from netmon.config import default_probes, parse_config
from tests import crd_schema
from tests.test_deploy import load_yaml
from tests.test_helm import CHART, SWEEP, rdma_values

SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
DEFAULTS: dict[str, Any] = load_yaml(CHART / "values.yaml")
README = (CHART / "README.md").read_text()
RUNBOOK_BASE = "https://github.com/OWNER/netmon/blob/main/docs/RUNBOOK.md"

# libyaml when PyYAML has it: the walk parses the rendered chart (the dashboard's JSON, the
# rules) some 400 times, and the pure-Python parser would take most of the test's time.
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


Rendered = tuple[list[dict[str, Any]], str]


def render(values: dict[str, Any]) -> Rendered:
    """The chart's objects and its NOTES.txt."""
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name="netmon", namespace="netmon")
    notes = "".join(text for path, text in rendered.items() if path.endswith("NOTES.txt"))
    objects = [
        document
        for path, text in rendered.items()
        if not path.endswith("NOTES.txt")
        for document in yaml.load_all(text, Loader=LOADER)
        if document
    ]
    return objects, notes


def objects_of(values: dict[str, Any]) -> list[dict[str, Any]]:
    return render(values)[0]


def find(objects: list[dict[str, Any]], kind: str, name: str = "netmon") -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    spec: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return spec


def netmon_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any]
    (found,) = [c for c in pod_spec(objects)["containers"] if c["name"] == "netmon"]
    return found


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on `base` as Helm coalesces values: maps merge, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {path[-1]: value}
    for key in reversed(path[:-1]):
        out = {key: out}
    return out


# Checks that every rendering must pass.


def check_one_port(objects: list[dict[str, Any]], port: int) -> None:
    """netmon listens where the pod, the Service, the probes, the ServiceMonitor and the sweep
    expect it: the listen port of netmon.yaml as netmon reads it is the containerPort, the
    Service's port and target, the sweep's daemon_port; the probes and the ServiceMonitor use
    that port by name."""
    configs = {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o["data"]["netmon.yaml"]
        for o in objects
        if o["kind"] == "ConfigMap" and "netmon.yaml" in o["data"]
    }
    config = parse_config(yaml.safe_load(configs.pop("exporter")), "chart ConfigMap")
    assert config.listen_port == port, config.listen
    netmon = netmon_container(objects)
    ports = {p["name"]: p for p in netmon["ports"]}
    assert ports["metrics"]["containerPort"] == port
    named = {port, "metrics"}
    for probe in (netmon["livenessProbe"], netmon["readinessProbe"]):
        (action,) = [probe[k] for k in ("httpGet", "tcpSocket") if k in probe]
        assert action["port"] in named, probe
    (service,) = [o for o in objects if o["kind"] == "Service"]
    (service_port,) = service["spec"]["ports"]
    assert service_port["port"] == port and service_port["targetPort"] in named
    for monitor in (o for o in objects if o["kind"] == "ServiceMonitor"):
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] == service_port["name"]
    for text in configs.values():  # the sweep's
        sweep = parse_config(yaml.safe_load(text), "the sweep's ConfigMap").sweep
        assert sweep is not None and sweep.daemon_port == port


@functools.cache
def _api_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    """kubernetes-validate's strict schema for a kind, loaded once: its validate() reads the
    5 MB of definitions again on every call, which the walk below would pay 200 times."""
    version = kubernetes_validate.latest_version()
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    # rbac.authorization.k8s.io/v1 -> rbac-v1, apps/v1 -> apps-v1, v1 -> v1: the files' names.
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = schema_contents(f"{folder}/{kind.lower()}-{group_version}.json", version)
    definitions = schema_contents(f"{folder}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


@functools.cache
def _api_errors(text: str) -> str:
    """Why the API server (strict field validation) would refuse the object; empty if not."""
    document = json.loads(text)
    check = _api_validator(document["apiVersion"], document["kind"])
    return "; ".join(
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in check.iter_errors(document)
    )


def test_the_cached_api_validator_agrees_with_kubernetes_validate() -> None:
    (daemonset,) = [o for o in objects_of({}) if o["kind"] == "DaemonSet"]
    bad = copy.deepcopy(daemonset)
    bad["spec"]["template"]["spec"]["hostPIDs"] = True
    for document, refused in ((daemonset, False), (bad, True)):
        assert bool(_api_errors(json.dumps(document))) is refused
        if refused:
            with pytest.raises(kubernetes_validate.ValidationError):
                kubernetes_validate.validate(document, kubernetes_validate.latest_version(), True)
        else:
            kubernetes_validate.validate(document, kubernetes_validate.latest_version(), True)


def check_objects(objects: list[dict[str, Any]]) -> None:
    """Built-in kinds against the API schemas, Kueue's and the Prometheus Operator's against
    their CRDs (tests/fixtures/crds), and netmon.yaml as netmon reads it."""
    for document in objects:
        group = document["apiVersion"].split("/")[0]
        where = f"{document['kind']} {document['metadata']['name']}"
        if group in ("kueue.x-k8s.io", "monitoring.coreos.com"):
            assert crd_schema.errors(document) == [], where
        elif "." not in group or group.endswith(".k8s.io"):
            errors = _api_errors(json.dumps(document, sort_keys=True))
            assert errors == "", f"{where}: {errors}"


def lint(values: dict[str, Any]) -> None:
    report = helm.lint(CHART, values, strict=True, namespace="netmon")
    assert report["errors"] == [], report
    # Severity 2 is a warning, 3 an error; an info ("icon is recommended") is no finding.
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


# The walk over values.schema.json.


# What a value needs around it to matter: the objects it shapes rendered, what it depends on
# set (or a function of the value that makes it). The longest prefix of a value's path wins.
def _rdma_on(port: Any) -> dict[str, Any]:
    return merged(
        rdma_values(), {"config": {"group": {"members": [f"gpu-a1:{port}", f"gpu-a2:{port}"]}}}
    )


def _rdma_open(allow: Any) -> dict[str, Any]:
    """Allowed, without the web-config that rdma otherwise needs."""
    values = rdma_values()
    if allow:
        del values["webConfig"]
    return values


CONTEXT: dict[str, dict[str, Any] | Callable[[Any], dict[str, Any]]] = {
    "sweep": SWEEP,
    "rdma": rdma_values(),
    "rdma.port": _rdma_on,
    "rdma.allowUnauthenticated": _rdma_open,
    "sweep.secretName": merged(SWEEP, {"sweep": {"sharedSecret": True}}),
    "webConfig": {"webConfig": {"secretName": "netmon-web"}},
    "webConfig.secretName": {},
    "webConfig.requireClientCert": {"webConfig": {"secretName": "netmon-web", "tls": True}},
    "serviceMonitor": {"serviceMonitor": {"enabled": True}},
    "prometheusRule": {"prometheusRule": {"enabled": True}},
    "dashboard": {"dashboard": {"enabled": True}},
    "serviceAccount": {"serviceAccount": {"create": True}},
}


def context(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    for length in range(len(path), 0, -1):
        around = CONTEXT.get(".".join(path[:length]))
        if callable(around):
            return around(value)
        if around is not None:
            return around
    return {}


def leaves(
    schema: dict[str, Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """Each value the schema describes: a node with its own examples is one value (a free-form
    map or a list), a node with properties is walked into."""
    if "properties" in schema and "examples" not in schema:
        for key, sub in schema["properties"].items():
            yield from leaves(sub, (*path, key))
    else:
        yield path, schema


def settings(schema: dict[str, Any]) -> list[Any]:
    if "enum" in schema:
        return list(schema["enum"])
    if schema.get("type") == "boolean":
        return [True, False]
    return list(schema.get("examples", []))


def at(values: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(values, dict) or key not in values:
            return None
        values = values[key]
    return values


CASES = [
    pytest.param(path, value, id=f"{'.'.join(path)}={json.dumps(value)[:40]}")
    for path, schema in leaves(SCHEMA)
    for value in settings(schema)
]


def test_every_value_has_settings_to_try() -> None:
    """A value without an enum, a boolean type or examples would escape the walk below."""
    bare = [".".join(path) for path, schema in leaves(SCHEMA) if not settings(schema)]
    assert bare == []
    assert len(CASES) > 100


def case_values(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    if value is None and at(DEFAULTS, path) is None:
        return context(path, value)  # unset: a null for a key values.yaml lacks stays null
    return merged(context(path, value), nested(path, value))


@functools.cache
def _rendered(values_json: str) -> Rendered:
    return render(json.loads(values_json))


@pytest.mark.parametrize(("path", "value"), CASES)
def test_every_setting_renders_valid_objects_on_one_port(path: tuple[str, ...], value: Any) -> None:
    values = case_values(path, value)
    objects, notes = render(values)
    check_objects(objects)
    port = at(merged(DEFAULTS, values), ("service", "port"))
    check_one_port(objects, port)
    lint(values)
    # The value does something: a setting that renders the same as its default is one that
    # no template reads (a null or empty value over an empty default excepted).
    default = at(merged(DEFAULTS, context(path, at(DEFAULTS, path))), path)
    if value != default and not (value is None and not default):
        baseline = _rendered(json.dumps(case_values(path, default)))
        assert (objects, notes) != baseline, "no template reads it"


# One port.


@pytest.mark.parametrize("port", [1, 8080, 9400, 19464, 65535])
def test_service_port_is_the_one_port(port: int) -> None:
    values = merged(
        SWEEP,
        {
            "service": {"port": port},
            "serviceMonitor": {"enabled": True},
            "config": {"listen": f"10.0.0.5:{port}"},
        },
    )
    objects = objects_of(values)
    check_one_port(objects, port)
    config = yaml.safe_load(find(objects, "ConfigMap")["data"]["netmon.yaml"])
    assert config["listen"] == f"10.0.0.5:{port}", "the host of config.listen stays"
    default_host = yaml.safe_load(
        find(objects_of({"service": {"port": port}, "config": {"listen": None}}), "ConfigMap")[
            "data"
        ]["netmon.yaml"]
    )
    assert default_host["listen"] == f"0.0.0.0:{port}"


def test_service_port_with_rdma_tls_and_client_certificates_keeps_one_port() -> None:
    values = merged(
        rdma_values(),
        {
            "service": {"port": 9400},
            "config": {"listen": "0.0.0.0:9400"},
            "webConfig": {"secretName": "w", "tls": True, "requireClientCert": True},
        },
    )
    check_one_port(objects_of(values), 9400)
    check_one_port(objects_of(merged(values, {"webConfig": {"requireClientCert": False}})), 9400)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"config": {"listen": "0.0.0.0:9400"}},
            r"config\.listen \(0\.0\.0\.0:9400\) and service\.port \(19464\)",
        ),
        ({"config": {"listen": "19464"}}, r"config\.listen: \"19464\" is not HOST:PORT"),
        (
            merged(SWEEP, {"sweep": {"settings": {"daemon_port": 9400}}}),
            r"sweep\.settings\.daemon_port \(9400\) differs from service\.port \(19464\)",
        ),
        ({"extraArgs": ["--listen=0.0.0.0:1"]}, r"extraArgs: --listen .* set service\.port"),
        ({"extraArgs": ["--config", "/x"]}, r"extraArgs: --config is the chart's"),
        (
            {"extraEnv": [{"name": "NETMON_LISTEN", "value": "0.0.0.0:1"}]},
            r"extraEnv: NETMON_LISTEN .* set service\.port",
        ),
        (
            merged(rdma_values(), {"service": {"port": 29400}}),
            r"rdma\.port and service\.port are both 29400",
        ),
    ],
    ids=["listen", "not-host-port", "daemon-port", "arg", "config-arg", "env", "rdma-port"],
)
def test_another_port_elsewhere_fails_naming_both(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render(values)


@pytest.mark.parametrize(
    "listen",
    [
        "127.0.0.1:19464",  # netmon's own default (NetmonConfig.listen)
        "127.0.1.1:19464",
        "localhost:19464",
        "LocalHost:19464",
        "[::1]:19464",
        "::1:19464",
    ],
)
def test_a_loopback_listen_fails_naming_config_listen_and_the_fix(listen: str) -> None:
    """netmon takes the address (a bare-metal netmon.yaml has it), but in a pod the kubelet's
    probes and Prometheus connect to the pod's address: every pod would crash-loop."""
    assert parse_config({"listen": listen}).listen == listen
    fix = r"set config\.listen to 0\.0\.0\.0:19464, or remove it"
    with pytest.raises(
        helm.HelmRenderError,
        match=rf"config\.listen \({re.escape(listen)}\) is a loopback address.*{fix}",
    ):
        render({"config": {"listen": listen}})


@pytest.mark.parametrize(
    "listen", ["0.0.0.0:19464", "[::]:19464", "10.0.0.5:19464", "localhost-gpu:19464", "127x:19464"]
)
def test_a_listen_on_another_host_renders(listen: str) -> None:
    config = yaml.safe_load(
        find(objects_of({"config": {"listen": listen}}), "ConfigMap")["data"]["netmon.yaml"]
    )
    assert config["listen"] == listen


# What the chart refuses, by name.


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"serviceMonitor": {"enable": True}}, "enable"),
        ({"imagePullSecret": [{"name": "x"}]}, "imagePullSecret"),
        ({"sweep": {"kueue": {"createLocalQueues": True}}}, "createLocalQueues"),
        ({"webConfig": {"secret": "w"}}, "secret"),
        ({"image": {"tags": "1"}}, "tags"),
        ({"serviceMonitor": {"tlsConfig": {"insecureSkipVerfy": True}}}, "insecureSkipVerfy"),
        # netmon.yaml's own schema (deploy/render.py): the daemon would exit 2 in every pod.
        ({"config": {"probes": [{"name": "small", "sizes": [8], "intervl": "60s"}]}}, "intervl"),
        ({"config": {"idle": {"max_memory_usd": "1G"}}}, "max_memory_usd"),
    ],
)
def test_a_typo_fails_render_and_lint_naming_the_key(values: dict[str, Any], key: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=f"additional properties '{key}' not allowed"):
        render(values)
    report = helm.lint(CHART, values, strict=True, namespace="netmon")
    assert any(f"'{key}' not allowed" in error for error in report["errors"]), report


def test_pod_labels_take_no_label_of_the_charts() -> None:
    """A key in both would be a duplicate mapping key in the pod template (which Helm renders
    without a word), and the selector's would part the pods from the DaemonSet."""
    objects = objects_of({"podLabels": {"team": "gpu"}})
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "gpu"
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= labels.items()
    charts = set(labels) - {"team"}
    assert {"app.kubernetes.io/name", "app.kubernetes.io/instance"} <= charts
    assert "app.kubernetes.io/component" in charts, "the sweep finds the daemons by it"
    for key in sorted(charts):
        message = (
            rf"podLabels: {re.escape(key)} is one of the chart's own .*remove it from podLabels"
        )
        with pytest.raises(helm.HelmRenderError, match=message):
            render({"podLabels": {"team": "gpu", key: "x"}})


@pytest.mark.parametrize(
    ("group", "message"),
    [
        (None, r"rdma\.enabled needs config\.group.*config\.group with name, members"),
        ({"name": "rack-a", "members": ["a:29400"]}, r"config\.group\.secret_file is not set"),
        (
            {"name": "rack-a", "members": ["a:29400"], "secret_file": "/etc/secret"},
            r"config\.group\.secret_file \(/etc/secret\) is outside /var/run/secrets/netmon",
        ),
        (
            {
                "name": "r",
                "members": ["a:29400", "b:1"],
                "secret_file": "/var/run/secrets/netmon/s",
            },
            r"config\.group\.members: b:1 is not on rdma\.port \(29400\)",
        ),
    ],
    ids=["no-group", "no-secret", "secret-elsewhere", "member-port"],
)
def test_rdma_without_a_usable_group_fails_naming_config_group(
    group: dict[str, Any] | None, message: str
) -> None:
    """netmon would crash-loop on these (GroupConfig requires name, members and secret_file;
    NETMON_GROUP__SELF must be a member): the render says what to set instead."""
    values: dict[str, Any] = {"rdma": {"enabled": True}}
    if group is not None:
        values["config"] = {"group": group}
    with pytest.raises(helm.HelmRenderError, match=message):
        render(values)
    assert parse_config(
        yaml.safe_load(find(objects_of(rdma_values()), "ConfigMap")["data"]["netmon.yaml"])
    ).group


def test_a_web_config_flag_without_the_secret_fails() -> None:
    with pytest.raises(helm.HelmRenderError, match=r"set webConfig\.secretName"):
        render({"webConfig": {"tls": True}})
    with pytest.raises(helm.HelmRenderError, match=r"requireClientCert needs webConfig\.tls"):
        render({"webConfig": {"secretName": "w", "requireClientCert": True}})


# The values one by one.


def test_priority_class_is_system_node_critical_unless_emptied() -> None:
    assert pod_spec(objects_of({}))["priorityClassName"] == "system-node-critical"
    assert "priorityClassName" not in pod_spec(objects_of({"priorityClassName": ""}))


def test_the_web_config_secret_is_mounted_and_passed_and_the_probes_follow_tls() -> None:
    auth = {
        "username": {"name": "netmon-scrape", "key": "username"},
        "password": {"name": "netmon-scrape", "key": "password"},
    }
    tls = {"ca": {"secret": {"name": "netmon-ca", "key": "ca.crt"}}, "serverName": "netmon"}
    values = merged(
        SWEEP,
        {
            "kubeletGuard": {"runAsRoot": False},
            "webConfig": {"secretName": "netmon-web", "key": "web.yml", "tls": True},
            "serviceMonitor": {"enabled": True, "tlsConfig": tls, "basicAuth": auth},
        },
    )
    objects = objects_of(values)
    netmon, pod = netmon_container(objects), pod_spec(objects)
    index = netmon["args"].index("--web-config")
    web_file = netmon["args"][index + 1]
    (mount,) = [m for m in netmon["volumeMounts"] if web_file.startswith(m["mountPath"] + "/")]
    assert web_file == mount["mountPath"] + "/web.yml" and mount["readOnly"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "netmon-web"
    # uid 10001 reads the Secret's files through its group.
    assert pod["securityContext"]["fsGroup"] == 10001 and volume["secret"]["defaultMode"] == 0o440
    for probe in (netmon["livenessProbe"], netmon["readinessProbe"]):
        # /healthz answers without credentials (netmon.exposition.http), so basic auth is no
        # reason to give up the HTTP check; the kubelet does not verify the certificate.
        assert probe["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}
    (endpoint,) = find(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"] == tls
    assert endpoint["basicAuth"] == auth
    sweep = parse_config(
        yaml.safe_load(find(objects, "ConfigMap", "netmon-sweep")["data"]["netmon.yaml"])
    ).sweep
    assert sweep is not None and sweep.daemon_scheme == "https" and sweep.ca_file is None
    # The sweep checks the daemons' certificates against a CA the operator mounts.
    ca: dict[str, Any] = {
        "settings": {"ca_file": "/etc/netmon-ca/ca.crt"},
        "extraVolumes": [{"name": "daemon-ca", "secret": {"secretName": "netmon-ca"}}],
        "extraVolumeMounts": [{"name": "daemon-ca", "mountPath": "/etc/netmon-ca"}],
    }
    objects = objects_of(merged(values, {"sweep": ca}))
    sweep = parse_config(
        yaml.safe_load(find(objects, "ConfigMap", "netmon-sweep")["data"]["netmon.yaml"])
    ).sweep
    assert sweep is not None and str(sweep.ca_file) == "/etc/netmon-ca/ca.crt"
    job = find(objects, "CronJob", "netmon-sweep")["spec"]["jobTemplate"]["spec"]["template"]
    (sweeper,) = job["spec"]["containers"]
    assert sweeper["volumeMounts"][-1] == ca["extraVolumeMounts"][0]
    assert job["spec"]["volumes"][-1] == ca["extraVolumes"][0]
    # Client certificates: the kubelet has none, so the probes open a TCP connection only.
    strict_tls = merged(values, {"webConfig": {"requireClientCert": True}})
    netmon = netmon_container(objects_of(strict_tls))
    for probe in (netmon["livenessProbe"], netmon["readinessProbe"]):
        assert probe["tcpSocket"] == {"port": "metrics"} and "httpGet" not in probe
    plain = netmon_container(objects_of({}))
    assert "--web-config" not in plain["args"]
    assert "scheme" not in plain["livenessProbe"]["httpGet"]


def test_the_runbook_url_base_is_replaced() -> None:
    rules_file = (CHART / "files" / "netmon-rules.yaml").read_text()
    assert RUNBOOK_BASE in rules_file, "the template replaces this base; it must be there"
    assert DEFAULTS["prometheusRule"]["runbookUrl"] == RUNBOOK_BASE
    base = "https://wiki.example.com/netmon/RUNBOOK"
    rule = find(
        objects_of({"prometheusRule": {"enabled": True, "runbookUrl": base + "/"}}),
        "PrometheusRule",
    )
    urls = [
        r["annotations"]["runbook_url"]
        for group in rule["spec"]["groups"]
        for r in group["rules"]
        if "runbook_url" in r.get("annotations", {})
    ]
    assert urls and all(re.fullmatch(re.escape(base) + r"#[a-z0-9-]+", url) for url in urls), urls
    assert RUNBOOK_BASE not in json.dumps(rule)


def test_the_image_takes_a_registry_and_a_digest_everywhere() -> None:
    digest = "sha256:" + "ab" * 32
    values = merged(SWEEP, {"image": {"registry": "registry.example.com/gpu", "tag": "9"}})
    objects = objects_of(values)
    pod = pod_spec(objects)
    images = {c["image"] for c in pod["containers"] + pod["initContainers"]}
    assert images == {"registry.example.com/gpu/netmon:9"}
    cron = find(objects, "CronJob", "netmon-sweep")["spec"]["jobTemplate"]["spec"]["template"]
    assert cron["spec"]["containers"][0]["image"] == "registry.example.com/gpu/netmon:9"
    sweep = yaml.safe_load(find(objects, "ConfigMap", "netmon-sweep")["data"]["netmon.yaml"])
    assert sweep["sweep"]["kubernetes"]["image"] == "registry.example.com/gpu/netmon:9"
    pinned = objects_of(merged(values, {"image": {"digest": digest}}))
    assert netmon_container(pinned)["image"] == f"registry.example.com/gpu/netmon@{digest}"


def test_names_follow_the_overrides() -> None:
    objects = objects_of({"nameOverride": "gpu-netmon"})
    assert {o["metadata"]["name"] for o in objects} == {"netmon-gpu-netmon"}
    assert pod_spec(objects) and find(objects, "Service", "netmon-gpu-netmon")
    labels = find(objects, "DaemonSet", "netmon-gpu-netmon")["spec"]["selector"]["matchLabels"]
    assert labels["app.kubernetes.io/name"] == "gpu-netmon"
    objects = objects_of({"fullnameOverride": "monitor"})
    assert {o["metadata"]["name"] for o in objects} == {"monitor"}


def test_the_service_account_mounts_no_token() -> None:
    objects = objects_of({"serviceAccount": {"create": True, "annotations": {"a.io/b": "c"}}})
    account = find(objects, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    assert account["metadata"]["annotations"] == {"a.io/b": "c"}
    pod = pod_spec(objects)
    assert pod["serviceAccountName"] == "netmon" and pod["automountServiceAccountToken"] is False
    existing = pod_spec(objects_of({"serviceAccount": {"name": "reader"}}))
    assert existing["serviceAccountName"] == "reader"
    assert "serviceAccountName" not in pod_spec(objects_of({}))


def test_security_contexts_merge_but_root_stays_where_needed() -> None:
    values = {
        "podSecurityContext": {"supplementalGroups": [44], "runAsGroup": 2000},
        "securityContext": {"seLinuxOptions": {"type": "spc_t"}},
    }
    objects = objects_of(values)
    pod, netmon = pod_spec(objects), netmon_container(objects)
    assert pod["securityContext"]["supplementalGroups"] == [44]
    assert pod["securityContext"]["runAsGroup"] == 2000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert netmon["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    assert netmon["securityContext"]["runAsUser"] == 0, "the kubelet's socket is root's"
    assert netmon["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    with pytest.raises(
        helm.HelmRenderError, match=r"securityContext\.runAsUser is 1000.*kubeletGuard\.runAsRoot"
    ):
        render({"securityContext": {"runAsUser": 1000}})
    with pytest.raises(helm.HelmRenderError, match=r"runAsNonRoot is true.*rdma\.enabled"):
        render(merged(rdma_values(), {"securityContext": {"runAsNonRoot": True}}))
    # Without root, the operator's user owns the state directory.
    own = {"kubeletGuard": {"runAsRoot": False}, "securityContext": {"runAsUser": 1000}}
    objects = objects_of(own)
    assert netmon_container(objects)["securityContext"]["runAsUser"] == 1000
    (init,) = pod_spec(objects)["initContainers"]
    assert init["command"] == ["chown", "1000:10001", "/var/lib/netmon"]
    # RDMA keeps IPC_LOCK whatever capabilities the operator adds.
    caps = {"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["SYS_NICE"]}}}
    netmon = netmon_container(objects_of(merged(rdma_values(), caps)))
    assert netmon["securityContext"]["capabilities"]["add"] == ["SYS_NICE", "IPC_LOCK"]


def test_extra_args_env_and_volumes_come_after_the_charts() -> None:
    values = {
        "extraArgs": ["--log-level", "debug"],
        "extraEnv": [{"name": "NETMON_GROUP__INTERFACE", "value": "$(NODE_NAME)"}],
        "extraVolumes": [{"name": "extra", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "extra", "mountPath": "/extra"}],
    }
    objects = objects_of(values)
    netmon = netmon_container(objects)
    assert netmon["args"] == [
        "serve",
        "--config",
        "/etc/netmon/netmon.yaml",
        "--log-level",
        "debug",
    ]
    names = [e["name"] for e in netmon["env"]]
    assert names[-1] == "NETMON_GROUP__INTERFACE" and names.index("NODE_NAME") < len(names) - 1
    assert netmon["volumeMounts"][-1] == {"name": "extra", "mountPath": "/extra"}
    assert pod_spec(objects)["volumes"][-1] == {"name": "extra", "emptyDir": {}}


# What the operator reads.


# A ServiceMonitor's tlsConfig: the CA of netmon's certificate, Prometheus's client certificate.
CA = {"secret": {"name": "netmon-ca", "key": "ca.crt"}}
CLIENT = {
    "cert": {"secret": {"name": "prometheus-client", "key": "tls.crt"}},
    "keySecret": {"name": "prometheus-client", "key": "tls.key"},
}
NO_CA = "serviceMonitor.tlsConfig has no ca"
NO_CLIENT_CERT = "serviceMonitor.tlsConfig has no cert and keySecret"
WRONG_SCHEME = "every scrape fails. Leave serviceMonitor.scheme empty"


def test_the_notes_say_how_to_see_the_first_busbw_and_warn_on_risky_settings() -> None:
    _, notes = render({"service": {"port": 9400}})
    assert "kubectl -n netmon port-forward ds/netmon 9400:9400" in notes
    assert "curl -s http://localhost:9400/metrics | grep netmon_busbw_bytes_per_second" in notes
    assert "the large probe runs every 15m" in notes
    assert "WARNING: nothing scrapes netmon yet" in notes
    assert "WARNING: the image netmon:0.1.0 names no registry" in notes
    values = {
        "image": {"registry": "r.example"},
        "serviceMonitor": {"enabled": True, "tlsConfig": {"ca": CA, "serverName": "netmon"}},
        "webConfig": {"secretName": "w", "tls": True},
    }
    _, notes = render(values)
    assert "WARNING" not in notes
    assert "https://localhost:19464/metrics" in notes
    _, notes = render(
        {
            "kubeletGuard": {"enabled": False},
            "service": {"annotations": {"prometheus.io/scrape": "true"}},
        }
    )
    assert "WARNING: kubeletGuard.enabled is false" in notes
    assert "nothing scrapes" not in notes
    _, notes = render(merged(SWEEP, {"webConfig": {"secretName": "w", "tls": True}}))
    assert "sweep.settings.ca_file is not set" in notes


def _probe_lines(notes: str) -> list[str]:
    start = notes.index("The first busbw appears")
    lines = notes[start : notes.index("Read it from one node's pod:")].splitlines()[1:]
    return [line.strip() for line in lines]


def test_the_notes_name_netmons_default_probes_when_config_probes_is_unset() -> None:
    # The lines stand for netmon.config.default_probes on a GPU node: they follow it.
    small, large = default_probes(8)
    sizes = (8, 256, 8 << 10, 64 << 10, 64 << 20)
    assert (small.name, small.interval, small.sizes) == ("small", 60, sizes)
    assert (large.name, large.interval) == ("large", 900)
    assert large.sizes == (256 << 20, 512 << 20, 1 << 30)
    _, notes = render({"config": {"probes": None}, "memory": {"largestSize": "1G"}})
    assert _probe_lines(notes) == [
        "the small probe runs every 60s (sizes 8, 256, 8K, 64K, 64M)",
        "the large probe runs every 15m (sizes 256M, 512M, 1G)",
        "(netmon's default probes: config.probes is not set)",
    ]
    _, notes = render({"config": {"probes": []}, "memory": {"largestSize": "1G"}})
    assert parse_config({"probes": []}).probes == ()
    assert _probe_lines(notes) == [
        "none: config.probes is empty, so netmon runs no probes (remove it for netmon's default"
        " probes)"
    ]
    # netmon reads a number as seconds, and runs a probe without an interval every 60 s.
    (unset,) = parse_config({"probes": [{"name": "x", "sizes": [8]}]}).probes or ()
    assert unset.interval == 60
    probes = [{"name": "x", "sizes": "8,1G", "interval": 30}, {"name": "y", "sizes": [8]}]
    _, notes = render({"config": {"probes": probes}})
    assert _probe_lines(notes) == [
        "the x probe runs every 30s (sizes 8,1G)",
        "the y probe runs every 60s (sizes 8)",
    ]


@pytest.mark.parametrize(
    ("web", "monitor", "warnings"),
    [
        ({"tls": True}, {"enabled": True}, {NO_CA}),
        ({"tls": True}, {"enabled": True, "tlsConfig": {"serverName": "netmon"}}, {NO_CA}),
        ({"tls": True}, {"enabled": True, "tlsConfig": {"ca": CA}}, set()),
        ({"tls": True}, {"enabled": True, "tlsConfig": {"insecureSkipVerify": True}}, set()),
        # Whoever scrapes without the operator brings a scrape config of its own.
        ({"tls": True}, {"enabled": False}, set()),
        ({"tls": False}, {"enabled": True}, set()),
        (
            {"tls": True, "requireClientCert": True},
            {"enabled": True, "tlsConfig": {"ca": CA}},
            {NO_CLIENT_CERT},
        ),
        (
            {"tls": True, "requireClientCert": True},
            {"enabled": True, "tlsConfig": {"ca": CA, "cert": CLIENT["cert"]}},
            {NO_CLIENT_CERT},
        ),
        (
            {"tls": True, "requireClientCert": True},
            {"enabled": True},
            {NO_CA, NO_CLIENT_CERT},
        ),
        (
            {"tls": True, "requireClientCert": True},
            {"enabled": True, "tlsConfig": {"ca": CA, **CLIENT}},
            set(),
        ),
        ({"tls": True}, {"enabled": True, "scheme": "http"}, {NO_CA, WRONG_SCHEME}),
        ({"tls": True}, {"enabled": True, "scheme": "https", "tlsConfig": {"ca": CA}}, set()),
        ({"tls": False}, {"enabled": True, "scheme": "https"}, {WRONG_SCHEME}),
        ({"tls": False}, {"enabled": True, "scheme": "http"}, set()),
    ],
    ids=[
        "tls-no-tlsconfig",
        "tls-server-name-only",
        "tls-ca",
        "tls-skip-verify",
        "tls-no-servicemonitor",
        "plain",
        "client-cert-missing",
        "client-key-missing",
        "both-missing",
        "client-cert",
        "tls-scheme-http",
        "tls-scheme-https",
        "plain-scheme-https",
        "plain-scheme-http",
    ],
)
def test_the_notes_warn_when_the_servicemonitor_cannot_scrape_tls(
    web: dict[str, Any], monitor: dict[str, Any], warnings: set[str]
) -> None:
    """Prometheus checks netmon's certificate against its system CAs unless tlsConfig names
    one, and has no client certificate unless tlsConfig gives it one: the scrapes would fail."""
    secret = {"secretName": "w"} if web["tls"] else {}
    _, notes = render({"webConfig": {**secret, **web}, "serviceMonitor": monitor})
    assert {w for w in (NO_CA, NO_CLIENT_CERT, WRONG_SCHEME) if w in notes} == warnings
    for warning in warnings:
        (paragraph,) = [p for p in notes.split("\n\n") if warning in p]
        assert paragraph.startswith("WARNING: ")


def _value_paths(values: dict[str, Any], schema: dict[str, Any], path: str = "") -> Iterator[str]:
    for key, value in values.items():
        sub = schema["properties"][key]
        here = f"{path}{key}"
        if isinstance(value, dict) and "properties" in sub and "examples" not in sub:
            yield from _value_paths(value, sub, here + ".")
        else:
            yield here


def test_the_schema_and_the_readme_cover_every_value() -> None:
    """Every leaf of values.yaml is in the schema (else the render would refuse it) and in the
    README's table with its default; the README lists no value the chart does not have."""
    paths = set(_value_paths(DEFAULTS, SCHEMA))
    rows = dict(re.findall(r"^\| `([A-Za-z0-9_.]+)` \| (.*?) \|", README, flags=re.MULTILINE))
    assert paths - set(rows) == set(), "values missing from README.md"
    schema_paths = {".".join(path) for path, _ in leaves(SCHEMA)}
    assert set(rows) - schema_paths == set(), "README.md rows without a value"
    assert schema_paths - paths - set(rows) == set(), "schema values missing from README.md"
    for path in paths:
        default = at(DEFAULTS, tuple(path.split(".")))
        if isinstance(default, (str, int)) and not isinstance(default, bool) and default != "":
            assert str(default) in rows[path], f"{path}: default {default!r} not in README.md"
