"""A Kubernetes API server for tests of netmon.sweep.kube.scheduler: real HTTP on loopback,
answering the few calls a sweep makes as the API server does (v1 lists, Status errors, label and
field selectors, pod logs as text), with the part of the JobSet, Job and Kueue controllers, the
kube-scheduler and the ranks played by a scenario the test chooses.

As strict as the real one where a sweep could go wrong: a bearer token is required; every call
is authorized as RBAC would, against what the chart grants (netmon.sweep.kube.scheduler.PERMISSIONS,
which tests/test_helm.py holds equal to the chart's Role and ClusterRole), 403 otherwise; a
JobSet is validated against the JobSet CRD's schema when created, closed to unknown fields only
with `fieldValidation=Strict` as the real one (422 otherwise, 409 when it exists); lists honour
their selectors and come in pages of at most `page_size` with `continue` tokens when asked for
a `limit`; a log honours `tailLines` and `limitBytes` as the kubelet does; a Kueue API version
the cluster does not serve is a 404; a path in `garbage` is answered once with a proxy's HTML
error page under status 200. The pods
it makes carry what the Job controller gives them (the template's labels, the completion-index
annotation) and land on the pair's nodes in reverse order, index 0 on the last node: nothing
may depend on which node is index 0.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from netmon.sweep.kube.scheduler import PERMISSIONS
from tests import crd_schema

TOKEN = "sweep-test-token"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets"
INDEX = "batch.kubernetes.io/job-completion-index"


def matches(obj: Mapping[str, Any], selector: str, fields: bool = False) -> bool:
    """A label selector (k=v, k!=v, k, k in (a,b)) or a field selector (path=v, path!=v)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    terms = [t.strip() for t in _split_terms(selector) if t.strip()]
    for term in terms:
        if " in (" in term:
            key, _, values = term.partition(" in (")
            if labels.get(key.strip()) not in values.rstrip(")").split(","):
                return False
            continue
        negate = "!=" in term
        key, _, value = term.partition("!=" if negate else "=")
        if not _:  # a bare key: the label exists
            if key not in labels:
                return False
            continue
        found = _field(obj, key) if fields else labels.get(key)
        if (found == value) == negate:
            return False
    return True


def _split_terms(selector: str) -> Iterator[str]:
    depth, start = 0, 0
    for index, char in enumerate(selector):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            yield selector[start:index]
            start = index + 1
    yield selector[start:]


def _field(obj: Mapping[str, Any], path: str) -> Any:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


@dataclass
class FakeCluster:
    namespace: str = "netmon"
    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)  # everything but the sweep's
    jobsets: dict[str, dict[str, Any]] = field(default_factory=dict)
    sweep_pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)  # by JobSet name
    kueue_versions: tuple[str, ...] = ("v1beta2", "v1beta1")
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    granted: frozenset[tuple[str, str, str, str]] = PERMISSIONS
    used: set[tuple[str, str, str, str]] = field(default_factory=set)  # what RBAC allowed
    page_size: int = 2  # a real server may return fewer items than `limit` asks for
    garbage: list[str] = field(default_factory=list)  # paths answered once with non-JSON
    created: list[dict[str, Any]] = field(default_factory=list)
    deletions: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    # What happens to a JobSet once created: the controllers' and the ranks' part.
    scenario: Callable[[FakeCluster, dict[str, Any]], None] = lambda cluster, jobset: None
    lock: threading.Lock = field(default_factory=threading.Lock)

    # The controllers' moves, for scenarios.
    def admit(self, name: str) -> None:
        self.jobsets[name]["spec"]["suspend"] = False
        self._workload(name, [_condition("QuotaReserved", "True", "QuotaReserved", "")])

    def wait_for_quota(self, name: str, message: str) -> None:
        self._workload(name, [_condition("QuotaReserved", "False", "Pending", message)])

    def evict(self, name: str, reason: str, message: str) -> None:
        """Kueue evicts the Workload: the JobSet is suspended, its running pods deleted."""
        self.jobsets[name]["spec"]["suspend"] = True
        self._workload(name, [_condition("Evicted", "True", reason, message)])
        for pod_name, pod in list(self.sweep_pods.items()):
            ended = pod["status"]["phase"] in ("Succeeded", "Failed")
            if pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] == name and not ended:
                del self.sweep_pods[pod_name]

    def _workload(self, name: str, conditions: list[dict[str, Any]]) -> None:
        uid = self.jobsets[name]["metadata"]["uid"]
        self.workloads[name] = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {
                "name": f"jobset-{name}-{uid[:5]}",
                "namespace": self.namespace,
                "labels": {"kueue.x-k8s.io/job-uid": uid},
            },
            "status": {"conditions": conditions},
        }

    def pair_pods(self, name: str) -> Iterator[tuple[int, dict[str, Any], list[str]]]:
        """(pair index, its replicated job, the nodes its node affinity allows)."""
        for job in self.jobsets[name]["spec"]["replicatedJobs"]:
            labels = job["template"]["spec"]["template"]["metadata"]["labels"]
            pod = job["template"]["spec"]["template"]["spec"]
            terms = pod["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]
            nodes = terms["nodeSelectorTerms"][0]["matchFields"][0]["values"]
            yield int(labels["netmon/sweep-pair"]), job, list(nodes)

    def add_pod(
        self,
        jobset: str,
        job: Mapping[str, Any],
        index: int,
        node: str | None,
        phase: str,
        log: str = "",
        conditions: list[dict[str, Any]] | None = None,
    ) -> str:
        labels = dict(job["template"]["spec"]["template"]["metadata"]["labels"])
        labels["jobset.sigs.k8s.io/jobset-name"] = jobset
        name = f"{jobset}-{job['name']}-0-{index}-{uuid.uuid4().hex[:5]}"
        self.sweep_pods[name] = {
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": {INDEX: str(index)},
            },
            "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase, "conditions": conditions or []},
        }
        self.logs[name] = log
        return name

    # The HTTP side.
    def answer(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        with self.lock:
            self.requests.append((method, path, query))
            asked = rbac_attributes(method, path, query)
            if asked not in self.granted and (*asked[:3], "cluster") not in self.granted:
                return 403, _status(403, forbidden(asked, self.namespace))
            self.used.add(asked)
            if path in self.garbage:
                self.garbage.remove(path)
                return 200, b"<html><body><h1>502 Bad Gateway</h1></body></html>"
            return self._answer(method, path, query, body)

    def _answer(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        jobsets = JOBSETS.format(ns=self.namespace)
        if method == "GET" and path == "/api/v1/nodes":
            return 200, self._list(self.nodes, query)
        if method == "GET" and path == "/api/v1/pods":
            return 200, self._list([*self.pods, *self.sweep_pods.values()], query)
        pods = f"/api/v1/namespaces/{self.namespace}/pods"
        if method == "GET" and path == pods:
            return 200, self._list(list(self.sweep_pods.values()), query)
        if method == "GET" and path.startswith(pods + "/") and path.endswith("/log"):
            name = path[len(pods) + 1 : -len("/log")]
            if query.get("container") != "rank" or name not in self.sweep_pods:
                return 404, _status(404, f'pods "{name}" not found')
            return 200, _log(self.logs[name], query)
        if path == jobsets and method == "GET":
            return 200, self._list(list(self.jobsets.values()), query)
        if path == jobsets and method == "POST":
            return self._create(body, strict=query.get("fieldValidation") == "Strict")
        if path.startswith(jobsets + "/") and method == "DELETE":
            name = path[len(jobsets) + 1 :]
            self.deletions.append((name, body))
            if self.jobsets.pop(name, None) is None:
                return 404, _status(404, f'jobsets.jobset.x-k8s.io "{name}" not found')
            for pod_name in [p for p in self.sweep_pods if p.startswith(name + "-")]:
                del self.sweep_pods[pod_name]
            return 200, _status(200, "")
        for version in self.kueue_versions:
            if path == f"/apis/kueue.x-k8s.io/{version}/namespaces/{self.namespace}/workloads":
                return 200, self._list(list(self.workloads.values()), query)
        return 404, _status(404, "the server could not find the requested resource")

    def _list(self, items: list[dict[str, Any]], query: Mapping[str, str]) -> dict[str, Any]:
        kept = [
            item
            for item in items
            if matches(item, query.get("labelSelector", ""))
            and matches(item, query.get("fieldSelector", ""), fields=True)
        ]
        meta: dict[str, Any] = {"resourceVersion": "1"}
        if "limit" in query:
            start = int(query.get("continue") or 0)
            end = start + min(int(query["limit"]), self.page_size)
            kept, rest = kept[start:end], kept[end:]
            if rest:
                meta |= {"continue": str(end), "remainingItemCount": len(rest)}
        return {"kind": "List", "apiVersion": "v1", "metadata": meta, "items": kept}

    def _create(self, body: Any, strict: bool) -> tuple[int, Any]:
        # Without Strict the API server would prune an unknown field with a warning only.
        problems = crd_schema.errors(body, strict=strict)
        if problems:
            return 422, _status(422, f"JobSet is invalid: {problems[0]}")
        name = body["metadata"]["name"]
        if name in self.jobsets:
            return 409, _status(409, f'jobsets.jobset.x-k8s.io "{name}" already exists')
        stored = json.loads(json.dumps(body))
        stored["metadata"]["uid"] = str(uuid.uuid4())
        self.jobsets[name] = stored
        self.created.append(body)
        self.scenario(self, stored)
        return 201, stored


def rbac_attributes(method: str, path: str, query: Mapping[str, str]) -> tuple[str, str, str, str]:
    """(API group, resource, verb, scope) of a request, as the API server's authorizer sees
    it: /api/v1/... is the core group "", a name makes a list a get, a subresource is
    resource/sub."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    scope = "cluster"
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        scope, rest = "namespace", rest[2:]
    resource = "/".join(rest[::2]) if len(rest) > 2 else rest[0]
    named = len(rest) > 1
    verb = {
        "GET": "get" if named else ("watch" if query.get("watch") else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }[method]
    return group, resource, verb, scope


def forbidden(asked: tuple[str, str, str, str], namespace: str) -> str:
    group, resource, verb, scope = asked
    where = f'in the namespace "{namespace}"' if scope == "namespace" else "at the cluster scope"
    user = f"system:serviceaccount:{namespace}:netmon-sweep"
    return (
        f'{resource} is forbidden: User "{user}" cannot {verb} resource "{resource}" in API '
        f'group "{group}" {where}'
    )


def _log(text: str, query: Mapping[str, str]) -> str:
    """The kubelet's answer: the last tailLines lines, of those the first limitBytes bytes."""
    if "tailLines" in query:
        text = "".join(text.splitlines(keepends=True)[-int(query["tailLines"]) :])
    if "limitBytes" in query:
        text = text.encode()[: int(query["limitBytes"])].decode(errors="ignore")
    return text


def _condition(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def _status(code: int, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "code": code,
    }


class _Handler(BaseHTTPRequestHandler):
    cluster: FakeCluster

    def _serve(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._send(401, _status(401, "Unauthorized"))
            return
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self._send(*self.cluster.answer(self.command, url.path, query, body))

    do_GET = do_POST = do_DELETE = _serve

    def _send(self, code: int, answer: Any) -> None:
        if isinstance(answer, bytes):  # as it came, whatever it is
            data = answer
        else:
            data = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
        self.send_response(code)
        kind = "text/plain" if isinstance(answer, str) else "application/json"
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serving(cluster: FakeCluster) -> Iterator[str]:
    """The cluster's API server on loopback; yields its URL."""
    handler = type("Handler", (_Handler,), {"cluster": cluster})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
