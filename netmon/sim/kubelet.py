"""The kubelet of a simulated node: the node file's `pods` answered as the kubelet answers them,
its pod-resources gRPC response (protobuf bytes) and its pod list (JSON), to netmon's own kubelet
guard. Everything from the decoding on is the code that runs on a Kubernetes node."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from netmon.gpu import idle
from netmon.gpu.kubelet import KubeletGuard
from netmon.sim.node import SimulatedNode

# Where the simulated kubelet "listens": never opened, only named in the policy the guard reads.
SOCKET = Path("/simulated/kubelet/pod-resources/kubelet.sock")
PODS_URL = "https://simulated-node:10250/pods"
RESOURCE = "nvidia.com/gpu"


def simulated_guard(
    source: idle.IdleSource,
    policy: Callable[[], idle.IdlePolicy],
    node: SimulatedNode,
    own: tuple[str, str] | None,
) -> KubeletGuard:
    """netmon's kubelet guard over `source`, asking the node file's kubelet. A node file with no
    pods leaves the configured policy as it is (no kubelet, or the operator's)."""

    def simulated_policy() -> idle.IdlePolicy:
        configured = policy()
        if not node.current().pods:
            return configured
        pods = idle.KubeletPods(url=PODS_URL, token_file=None)
        return configured.model_copy(update={"kubelet_socket": SOCKET, "kubelet_pods": pods})

    return KubeletGuard(
        source,
        simulated_policy,
        own,
        lister=lambda _socket, _timeout: pod_resources(node),
        pod_lister=lambda _pods, _timeout: pod_list(node),
    )


def pod_resources(node: SimulatedNode) -> bytes:
    """The kubelet's ListPodResourcesResponse (k8s.io/kubelet/pkg/apis/podresources/v1), encoded
    as protobuf: one container per pod entry, holding its GPU by UUID as NVIDIA's device plugin
    names it."""
    pods = b""
    for pod in node.current().pods:
        namespace, name = pod.pod.split("/", 1)
        devices = _field(1, RESOURCE.encode()) + _field(2, pod.gpu.encode())
        container = _field(1, pod.container.encode()) + _field(2, devices)
        pods += _field(
            1, _field(1, name.encode()) + _field(2, namespace.encode()) + _field(3, container)
        )
    return pods


def pod_list(node: SimulatedNode) -> bytes:
    """The kubelet's GET /pods: a v1 PodList with each pod's namespace, name and phase."""
    items = [
        {
            "metadata": {"namespace": pod.pod.split("/", 1)[0], "name": pod.pod.split("/", 1)[1]},
            "status": {"phase": pod.phase},
        }
        for pod in node.current().pods
    ]
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "items": items}).encode()


def _field(number: int, value: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)
