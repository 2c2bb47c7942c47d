"""The kubelet of a simulated node: the node file's `pods` answered as the kubelet answers them,
its pod-resources gRPC response (protobuf bytes) and its pod list (JSON), to netmon's own kubelet
guard. Everything from the decoding on is the code that runs on a Kubernetes node."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from netmon.gpu import idle, idle_policy
from netmon.gpu.kubelet import KubeletGuard
from netmon.sim.node import SimPod, SimulatedNode

# Where the simulated kubelet "listens": never opened, only named in the policy the guard reads.
SOCKET = Path("/simulated/kubelet/pod-resources/kubelet.sock")
PODS_URL = "https://simulated-node:10250/pods"
RESOURCE = "nvidia.com/gpu"
CLAIM_UID = "9f3c2b1e-5a4d-4c3b-8e2f-1a2b3c4d5e6f"  # a ResourceClaim's UID, as CDI names carry it


def simulated_guard(
    source: idle.IdleSource,
    policy: Callable[[], idle_policy.IdlePolicy],
    node: SimulatedNode,
    own: tuple[str, str] | None,
) -> KubeletGuard:
    """netmon's kubelet guard over `source`, asking the node file's kubelet. A node file with no
    pods leaves the configured policy as it is (no kubelet, or the operator's)."""

    def simulated_policy() -> idle_policy.IdlePolicy:
        configured = policy()
        if not node.current().pods:
            return configured
        pods = idle_policy.KubeletPods(url=PODS_URL, token_file=None)
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
        if pod.via == "dra":
            container = _field(1, pod.container.encode()) + _field(5, _dynamic(node, pod))
        else:
            devices = _field(1, RESOURCE.encode()) + _field(2, pod.gpu.encode())
            container = _field(1, pod.container.encode()) + _field(2, devices)
        pods += _field(
            1, _field(1, name.encode()) + _field(2, namespace.encode()) + _field(3, container)
        )
    return pods


def _dynamic(node: SimulatedNode, pod: SimPod) -> bytes:
    """The DynamicResource NVIDIA's DRA driver's claim gives: the GPU as "gpu-<minor>", prepared
    as the CDI device "k8s.gpu.nvidia.com/claim=<claim UID>-gpu-<minor>" (its cdi.go)."""
    gpus = node.current().gpus
    index = next(i for i, g in enumerate(gpus) if g.uuid == pod.gpu)
    minor = gpus[index].minor if gpus[index].minor is not None else index
    device = f"gpu-{minor}"
    cdi = _field(1, _field(1, f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-{device}".encode()))
    resource = cdi
    if pod.dra_fields:
        resource += _field(2, b"gpu.nvidia.com") + _field(3, b"node-0") + _field(4, device.encode())
    namespace, name = pod.pod.split("/", 1)
    claim = _field(2, f"{name}-gpu".encode()) + _field(3, namespace.encode())
    return claim + _field(4, resource)


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
