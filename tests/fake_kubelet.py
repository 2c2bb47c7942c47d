"""A kubelet for tests: its pod-resources API (an independent protobuf encoder and a real gRPC
server) and its HTTPS pod list (GET /pods, a real TLS server with a bearer token).

The message classes are built at test time by google.protobuf from descriptors written here after
kubernetes' staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto, so what the tests
encode owes nothing to netmon.gpu.podresources' decoder. The server is grpcio's, on a unix socket.
The pod list is JSON written here in the shape of a v1 PodList, as the kubelet's /pods gives it.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_ONE, _MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_STR, _MSG, _I64, _U64 = _F.TYPE_STRING, _F.TYPE_MESSAGE, _F.TYPE_INT64, _F.TYPE_UINT64

# (name, number, type, label, message type) per message, as in the kubelet's api.proto (v1).
V1: dict[str, list[tuple[str, int, int, int, str]]] = {
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, _MSG, _MANY, "PodResources")],
    "PodResources": [
        ("name", 1, _STR, _ONE, ""),
        ("namespace", 2, _STR, _ONE, ""),
        ("containers", 3, _MSG, _MANY, "ContainerResources"),
    ],
    "ContainerResources": [
        ("name", 1, _STR, _ONE, ""),
        ("devices", 2, _MSG, _MANY, "ContainerDevices"),
        ("cpu_ids", 3, _I64, _MANY, ""),
        ("memory", 4, _MSG, _MANY, "ContainerMemory"),
        ("dynamic_resources", 5, _MSG, _MANY, "DynamicResource"),
    ],
    "ContainerMemory": [
        ("memory_type", 1, _STR, _ONE, ""),
        ("size", 2, _U64, _ONE, ""),
        ("topology", 3, _MSG, _ONE, "TopologyInfo"),
    ],
    "ContainerDevices": [
        ("resource_name", 1, _STR, _ONE, ""),
        ("device_ids", 2, _STR, _MANY, ""),
        ("topology", 3, _MSG, _ONE, "TopologyInfo"),
    ],
    "TopologyInfo": [("nodes", 1, _MSG, _MANY, "NUMANode")],
    "NUMANode": [("ID", 1, _I64, _ONE, "")],
    "DynamicResource": [
        ("claim_name", 2, _STR, _ONE, ""),
        ("claim_namespace", 3, _STR, _ONE, ""),
        ("claim_resources", 4, _MSG, _MANY, "ClaimResource"),
    ],
    "ClaimResource": [
        ("cdi_devices", 1, _MSG, _MANY, "CDIDevice"),
        ("driver_name", 2, _STR, _ONE, ""),
        ("pool_name", 3, _STR, _ONE, ""),
        ("device_name", 4, _STR, _ONE, ""),
    ],
    "CDIDevice": [("name", 1, _STR, _ONE, "")],
}

# A kubelet from the future: every message of the response grows fields of every wire type
# (varint, fixed64, length-delimited, group, fixed32). proto2, because only it still has groups.
_FUTURE_EXTRAS: list[tuple[str, int, int, int, str]] = [
    ("later_varint", 1001, _F.TYPE_SINT64, _ONE, ""),
    ("later_fixed64", 1002, _F.TYPE_FIXED64, _ONE, ""),
    ("later_text", 1003, _STR, _MANY, ""),
    ("later_fixed32", 1005, _F.TYPE_FLOAT, _ONE, ""),
    ("later_packed", 1006, _I64, _MANY, ""),
    ("later_message", 1007, _MSG, _ONE, "TopologyInfo"),
]


def _file(name: str, package: str, syntax: str, future: bool) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name=name, package=package, syntax=syntax)
    for message, fields in V1.items():
        described = proto.message_type.add(name=message)
        extras = _FUTURE_EXTRAS if future and message != "ListPodResourcesRequest" else []
        for field_name, number, kind, label, type_name in [*fields, *extras]:
            added = described.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                added.type_name = f".{package}.{type_name}"
            if future and label == _MANY and kind == _I64:
                added.options.packed = True  # proto3's default, spelt out for proto2
        if future and extras:
            group = described.nested_type.add(name="Later")
            group.field.add(name="inner", number=1, type=_U64, label=_ONE)
            described.field.add(
                name="later",
                number=1004,
                type=_F.TYPE_GROUP,
                label=_ONE,
                type_name=f".{package}.{message}.Later",
            )
    return proto


def _classes(proto: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(proto.SerializeToString())
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{proto.package}.{name}"))
        for name in V1
    }


# google.protobuf's generated classes: attribute access the type checker cannot follow.
PB: dict[str, Any] = _classes(_file("podresources_v1.proto", "v1", "proto3", future=False))
FUTURE: dict[str, Any] = _classes(_file("podresources_future.proto", "future", "proto2", True))


def response(
    pods: list[tuple[str, str, list[tuple[str, list[tuple[str, list[str]]]]]]],
    classes: dict[str, Any] = PB,
) -> Any:
    """A ListPodResourcesResponse: [(namespace, pod, [(container, [(resource, ids)])])]."""
    message = classes["ListPodResourcesResponse"]()
    for namespace, name, containers in pods:
        pod = message.pod_resources.add(name=name, namespace=namespace)
        for container_name, devices in containers:
            container = pod.containers.add(name=container_name)
            for resource, ids in devices:
                container.devices.add(resource_name=resource, device_ids=ids)
    return message


LIST = "/v1.PodResourcesLister/List"


class FakeKubelet:
    """grpcio serving v1.PodResourcesLister/List on a unix socket, with the bytes it is given.

    `stall` makes List wait (for at most `stall_s`, so a test can never hang on it) before
    answering; `status` answers with that gRPC error instead.
    """

    def __init__(self, socket: Path, answer: bytes = b"") -> None:
        self.socket = socket
        self.answer = answer
        self.stall = False
        self.stall_s = 10.0
        self.status: grpc.StatusCode | None = None
        self.calls = 0
        self.released = threading.Event()
        self._lock = threading.Lock()
        self.pool = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-kubelet")
        self.server = grpc.server(self.pool)
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {"List": grpc.unary_unary_rpc_method_handler(self._list)},
        )
        self.server.add_generic_rpc_handlers((handler,))
        if not self.server.add_insecure_port(f"unix://{socket}"):
            raise OSError(f"cannot listen on {socket}")

    def _list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            self.calls += 1
        if request != b"":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "ListPodResourcesRequest is empty")
        if self.stall:
            self.released.wait(self.stall_s)
        if self.status is not None:
            context.abort(self.status, "told to fail")
        return self.answer

    def start(self) -> FakeKubelet:
        self.server.start()
        return self

    def stop(self) -> None:
        self.released.set()
        self.server.stop(grace=None).wait(10)
        # Bounded: a stalled call waits on `released`, set above.
        self.pool.shutdown(wait=True)


@contextmanager
def fake_kubelet(socket: Path, answer: bytes = b"") -> Iterator[FakeKubelet]:
    kubelet = FakeKubelet(socket, answer).start()
    try:
        yield kubelet
    finally:
        kubelet.stop()


def serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


# --- the kubelet's HTTPS API: GET /pods

TOKEN = "eyJhbGciOiJSUzI1NiIsImtpZCI6Im5ldG1vbi10ZXN0In0.eyJzdWIiOiJuZXRtb24ifQ.c2lnbmF0dXJl"
NODE_NAME = "gpu-a1"


def _pod(namespace: str, name: str, phase: str | None, gpus: list[str]) -> dict[str, Any]:
    """One item as the kubelet lists it: what netmon reads, amid what it does not."""
    status: dict[str, Any] = {
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "hostIP": "10.0.0.5",
        "podIP": "192.168.7.12",
        "qosClass": "BestEffort",
        "startTime": "2026-11-23T08:00:00Z",
    }
    if phase is not None:
        status["phase"] = phase
    if phase in ("Succeeded", "Failed"):
        status["containerStatuses"] = [
            {
                "name": "main",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 0 if phase == "Succeeded" else 1}},
            }
        ]
    limits = {"nvidia.com/gpu": str(len(gpus))} if gpus else {}
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{name}")),
            "resourceVersion": "48213",
            "creationTimestamp": "2026-11-23T08:00:00Z",
            "labels": {"app": name.rsplit("-", 1)[0]},
        },
        "spec": {
            "nodeName": NODE_NAME,
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                 "resources": {"limits": limits}},
            ],
        },
        "status": status,
    }  # fmt: skip


def pod_list(pods: Sequence[tuple[str, str, str | None]], gpus: int = 1) -> bytes:
    """A v1 PodList as the kubelet's GET /pods writes it: [(namespace, name, phase or None)]."""
    items = [_pod(namespace, name, phase, ["x"] * gpus) for namespace, name, phase in pods]
    document = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
    return json.dumps(document).encode()


def self_signed(folder: Path, name: str = "kubelet") -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, as a kubelet's own self-signed serving certificate is."""
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "2", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


class FakeKubeletPods:
    """The kubelet's GET /pods on 127.0.0.1: HTTPS with `cert` (plain HTTP without), the bearer
    `token` required over HTTPS, as a kubelet with webhook authentication does.

    `status` answers with that HTTP status instead; `stall` makes it wait (for at most
    `stall_s`) before answering. `authorizations` keeps each request's Authorization header.
    """

    def __init__(
        self, answer: bytes, cert: tuple[Path, Path] | None = None, token: str = TOKEN
    ) -> None:
        self.answer = answer
        self.token = token
        self.status: int | None = None
        self.stall = False
        self.stall_s = 10.0
        self.authorizations: list[str | None] = []
        self.released = threading.Event()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.scheme = "http"
        if cert is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*cert)
            # The handshake in the request's thread, not in the one that accepts.
            self.server.socket = context.wrap_socket(
                self.server.socket, server_side=True, do_handshake_on_connect=False
            )
            self.scheme = "https"
        self.url = f"{self.scheme}://127.0.0.1:{self.server.server_address[1]}/pods"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.authorizations)

    def _answer(self, path: str, authorization: str | None) -> tuple[int, bytes]:
        with self._lock:
            self.authorizations.append(authorization)
        if path != "/pods":
            return 404, b"404 page not found"
        if self.scheme == "https" and authorization != f"Bearer {self.token}":
            return 401, b"Unauthorized"
        if self.stall:
            self.released.wait(self.stall_s)
        if self.status is not None:
            forbidden = (
                "Forbidden (user=system:serviceaccount:netmon:netmon, verb=get, "
                "resource=nodes, subresource=pods)"
            )
            return self.status, forbidden.encode()
        return 200, self.answer

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = fake._answer(self.path, self.headers.get("Authorization"))
                self.send_response(status)
                kind = "application/json" if status == 200 else "text/plain; charset=utf-8"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def start(self) -> FakeKubeletPods:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)


@contextmanager
def fake_kubelet_pods(
    answer: bytes, cert: tuple[Path, Path] | None = None, token: str = TOKEN
) -> Iterator[FakeKubeletPods]:
    kubelet = FakeKubeletPods(answer, cert, token).start()
    try:
        yield kubelet
    finally:
        kubelet.stop()


def main(argv: list[str]) -> None:
    """`python -m tests.fake_kubelet SOCKET HEX [stall]`: serve until standard input closes.

    In a process of its own, so that a test can count the threads and fds of a client alone.
    """
    with fake_kubelet(Path(argv[0]), bytes.fromhex(argv[1])) as kubelet:
        kubelet.stall = "stall" in argv[2:]
        print("ready", flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main(sys.argv[1:])
