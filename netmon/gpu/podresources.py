"""The kubelet's answers: its pod-resources protobuf decoded by hand, its pod list's phases, and
which GPUs live pods hold.

Pure: no I/O and no protobuf runtime, so a kubelet with fields we have never seen still parses.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from netmon.gpu.dra import DRA_DRIVER, DraDevice, dra_minor, nvidia_gpu

# The messages, from k8s.io/kubelet/pkg/apis/podresources/v1/api.proto (kubernetes/kubernetes,
# staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto): only the fields read here.
#   ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
#   PodResources { string name = 1; string namespace = 2;
#                  repeated ContainerResources containers = 3; }
#   ContainerResources { string name = 1; repeated ContainerDevices devices = 2;
#                        (cpu_ids = 3, memory = 4: skipped)
#                        repeated DynamicResource dynamic_resources = 5; }
#   ContainerDevices { string resource_name = 1; repeated string device_ids = 2;
#                      (topology = 3: skipped) }
#   DynamicResource { (class_name = 1: skipped) string claim_name = 2;
#                     string claim_namespace = 3; repeated ClaimResource claim_resources = 4; }
#   ClaimResource { repeated CDIDevice cdi_devices = 1; string driver_name = 2;
#                   string pool_name = 3; string device_name = 4; }  (2-4 since Kubernetes 1.31)
#   CDIDevice { string name = 1; }
_VARINT, _FIXED64, _LEN, _GROUP_START, _GROUP_END, _FIXED32 = range(6)
# protobuf's own parsers stop at 100 levels; only unknown groups can nest here.
_MAX_DEPTH = 100
_MASK64 = (1 << 64) - 1

# Device plugin resources whose IDs must be GPUs even when they are not NVIDIA UUIDs (another
# plugin's "nvidia0"). Other nvidia.com/ resources (NICs of the network operator, by PCI address)
# count only through IDs that are GPU or MIG UUIDs.
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")
_VENDOR = "nvidia.com/"


class DecodeError(ValueError):
    """The bytes are not what the kubelet sends: a ListPodResourcesResponse, or a PodList."""


@dataclass(frozen=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...]
    dra: tuple[DraDevice, ...] = ()


@dataclass(frozen=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...]


def _varint(data: bytes, pos: int, message: str) -> tuple[int, int]:
    start, result = pos, 0
    for shift in range(0, 70, 7):  # at most 10 bytes carry a 64-bit value
        if pos >= len(data):
            raise DecodeError(f"{message}: varint at byte {start} runs past the end")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result & _MASK64, pos
    raise DecodeError(f"{message}: varint at byte {start} is longer than 10 bytes")


def _tag(data: bytes, pos: int, message: str) -> tuple[int, int, int]:
    tag, after = _varint(data, pos, message)
    number, wire = tag >> 3, tag & 7
    if number == 0 or number >= 1 << 29:
        raise DecodeError(f"{message}: field number {number} at byte {pos} is not valid")
    return number, wire, after


def _skip(data: bytes, pos: int, number: int, wire: int, message: str, depth: int) -> int:
    """The position after a field's value, for every wire type (groups included)."""
    if wire == _VARINT:
        return _varint(data, pos, message)[1]
    if wire in (_FIXED64, _FIXED32):
        end = pos + (8 if wire == _FIXED64 else 4)
        if end > len(data):
            raise DecodeError(f"{message}: fixed-width field {number} runs past the end")
        return end
    if wire == _LEN:
        return _length_delimited(data, pos, number, message)[1]
    if wire == _GROUP_START:
        if depth >= _MAX_DEPTH:
            raise DecodeError(f"{message}: groups nested deeper than {_MAX_DEPTH}")
        while True:
            if pos >= len(data):
                raise DecodeError(f"{message}: group {number} is not closed")
            inner, inner_wire, pos = _tag(data, pos, message)
            if inner_wire == _GROUP_END:
                if inner != number:
                    raise DecodeError(f"{message}: group {number} closed as {inner}")
                return pos
            pos = _skip(data, pos, inner, inner_wire, message, depth + 1)
    if wire == _GROUP_END:
        raise DecodeError(f"{message}: end of group {number} that was never opened")
    raise DecodeError(f"{message}: field {number} has wire type {wire}, which does not exist")


def _length_delimited(data: bytes, pos: int, number: int, message: str) -> tuple[bytes, int]:
    length, pos = _varint(data, pos, message)
    end = pos + length
    if end > len(data):
        raise DecodeError(
            f"{message}: field {number} claims {length} bytes, {len(data) - pos} are left"
        )
    return data[pos:end], end


def _fields(data: bytes, message: str) -> Iterator[tuple[int, bytes]]:
    """(field number, bytes) of every length-delimited field; all others are checked, skipped.

    Every field read here is a string or a message. A known number with another wire type is
    skipped as unknown, which is what protobuf's own parsers do.
    """
    pos = 0
    while pos < len(data):
        number, wire, pos = _tag(data, pos, message)
        if wire == _LEN:
            value, pos = _length_delimited(data, pos, number, message)
            yield number, value
        else:
            pos = _skip(data, pos, number, wire, message, 0)


def _text(value: bytes, message: str, name: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"{message}.{name}: not UTF-8 (byte {exc.start})") from None


def _devices(data: bytes) -> ContainerDevices:
    message = "ContainerDevices"
    resource, ids = "", []
    for number, value in _fields(data, message):
        if number == 1:
            resource = _text(value, message, "resource_name")
        elif number == 2:
            ids.append(_text(value, message, "device_ids"))
    return ContainerDevices(resource, tuple(ids))


def _container(data: bytes) -> ContainerResources:
    message = "ContainerResources"
    name, devices, dra = "", [], []
    for number, value in _fields(data, message):
        if number == 1:
            name = _text(value, message, "name")
        elif number == 2:
            devices.append(_devices(value))
        elif number == 5:
            dra.extend(_dynamic(value))
    return ContainerResources(name, tuple(devices), tuple(dra))


def _dynamic(data: bytes) -> list[DraDevice]:
    message = "DynamicResource"
    claim, namespace, resources = "", "", []
    for number, value in _fields(data, message):
        if number == 2:
            claim = _text(value, message, "claim_name")
        elif number == 3:
            namespace = _text(value, message, "claim_namespace")
        elif number == 4:
            resources.append(value)
    return [_claim_resource(value, f"{namespace}/{claim}") for value in resources]


def _claim_resource(data: bytes, claim: str) -> DraDevice:
    message = "ClaimResource"
    driver, device, cdi = "", "", []
    for number, value in _fields(data, message):
        if number == 1:
            for inner, name in _fields(value, "CDIDevice"):
                if inner == 1:
                    cdi.append(_text(name, "CDIDevice", "name"))
        elif number == 2:
            driver = _text(value, message, "driver_name")
        elif number == 4:
            device = _text(value, message, "device_name")
    return DraDevice(claim, driver, device, tuple(cdi))


def _pod(data: bytes) -> PodResources:
    message = "PodResources"
    name, namespace, containers = "", "", []
    for number, value in _fields(data, message):
        if number == 1:
            name = _text(value, message, "name")
        elif number == 2:
            namespace = _text(value, message, "namespace")
        elif number == 3:
            containers.append(_container(value))
    return PodResources(name, namespace, tuple(containers))


def decode_list_response(data: bytes) -> tuple[PodResources, ...]:
    """The pods of a ListPodResourcesResponse; DecodeError names what is wrong with the bytes."""
    return tuple(
        _pod(value)
        for number, value in _fields(bytes(data), "ListPodResourcesResponse")
        if number == 1
    )


@dataclass(frozen=True)
class Allocation:
    """A container the kubelet gave a device to."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str  # as the kubelet reports it, replica suffix and all
    # What is known of the pod's phase ("phase Running", "phase unknown, ..."); "" when no
    # phase was looked up.
    phase: str = ""

    def __str__(self) -> str:
        held = f"pod {self.namespace}/{self.pod} container {self.container} ({self.resource})"
        return f"{held}, {self.phase}" if self.phase else held


@dataclass(frozen=True)
class GpuAllocations:
    """Which GPUs pods hold, keyed so that an NVML reading can be matched against them."""

    # Lower-case "gpu-..." UUID -> holder. A GPU shared by time-slicing replicas keeps one holder.
    gpus: dict[str, Allocation] = field(default_factory=dict)
    # MIG devices by "MIG-<uuid>": the kubelet does not say on which GPU they are.
    mig: tuple[Allocation, ...] = ()
    # IDs of a GPU resource that are no NVIDIA UUID at all (another device plugin's naming), and
    # devices of NVIDIA's DRA driver whose name does not say which GPU.
    unmapped: tuple[Allocation, ...] = ()
    # GPUs NVIDIA's DRA driver gave a pod, by minor number ("gpu-<minor>", its MIG devices'
    # "gpu-<minor>-mig-...": docs/FACTS.md, "Kubelet pod-resources").
    minors: dict[int, Allocation] = field(default_factory=dict)
    # "namespace/name (phase)" of the pods left out because they have finished.
    finished: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        """Whether any pod holds a GPU (finished pods hold none)."""
        return bool(self.gpus or self.mig or self.unmapped or self.minors)


def device_uuid(device_id: str) -> str:
    """The device's UUID without the time-slicing/MPS replica suffix ("GPU-...::3" -> "GPU-...").

    NVIDIA's device plugin advertises replica N of a shared GPU as "<uuid>::<N>"
    (NewAnnotatedID in internal/rm/devices.go of NVIDIA/k8s-device-plugin).
    """
    return device_id.split("::", 1)[0]


def gpu_allocations(
    pods: Iterable[PodResources],
    own_pod: tuple[str, str] | None = None,
    phases: PodPhases | None = None,
) -> GpuAllocations:
    """The GPUs held by pods other than `own_pod` (namespace, name), from any nvidia.com/ resource.

    With `phases`, a pod the kubelet lists only as Succeeded or Failed holds nothing, and every
    other holder says what is known of its phase. Without, every listed pod holds its devices.

    UUID forms, as NVIDIA/k8s-device-plugin's api/config/v1/replicas.go accepts them:
    "GPU-<uuid>", "MIG-<uuid>", and the older "MIG-GPU-<uuid>/<gi>/<ci>", which names its GPU.
    """
    gpus: dict[str, Allocation] = {}
    mig: list[Allocation] = []
    unmapped: list[Allocation] = []
    finished: list[str] = []
    minors: dict[int, Allocation] = {}
    for pod in pods:
        if own_pod is not None and (pod.namespace, pod.name) == own_pod:
            continue
        phase = ""
        if phases is not None:
            done, phase = phases.judge(pod.namespace, pod.name)
            if done:
                # Before any holder is kept: a time-sliced GPU's next holder may be running.
                if _holds_any(pod):
                    finished.append(f"{pod.namespace}/{pod.name} ({phase})")
                continue
        for container in pod.containers:
            for devices in container.devices:
                resource = devices.resource_name
                if _VENDOR not in resource:
                    continue
                for device_id in devices.device_ids:
                    holder = Allocation(
                        pod.namespace, pod.name, container.name, resource, device_id, phase
                    )
                    uuid = device_uuid(device_id).strip()
                    upper = uuid.upper()
                    if upper.startswith("MIG-GPU-"):
                        parent = uuid[len("MIG-") :].split("/", 1)[0]
                        gpus.setdefault(parent.lower(), holder)
                    elif upper.startswith("GPU-"):
                        gpus.setdefault(uuid.lower(), holder)
                    elif upper.startswith("MIG-"):
                        mig.append(holder)
                    elif resource.startswith(GPU_RESOURCE_PREFIXES):
                        unmapped.append(holder)
            for minor, holder in _dra_holders(pod, container, phase):
                if minor is None:
                    unmapped.append(holder)
                else:
                    minors.setdefault(minor, holder)
    return GpuAllocations(
        gpus=gpus, mig=tuple(mig), unmapped=tuple(unmapped), finished=tuple(finished), minors=minors
    )


def _dra_holders(
    pod: PodResources, container: ContainerResources, phase: str
) -> Iterator[tuple[int | None, Allocation]]:
    """The GPUs NVIDIA's DRA driver gave the container, by minor number (None: not said)."""
    for device in container.dra:
        if nvidia_gpu(device):
            name = device.device or (device.cdi[0] if device.cdi else "?")
            holder = Allocation(
                pod.namespace, pod.name, container.name, f"DRA {DRA_DRIVER} {name}", name, phase
            )
            yield dra_minor(device), holder


def _holds_any(pod: PodResources) -> bool:
    plugin = any(
        _VENDOR in devices.resource_name and devices.device_ids
        for container in pod.containers
        for devices in container.devices
    )
    return plugin or any(nvidia_gpu(d) for c in pod.containers for d in c.dra)


# The phases after which a pod's containers have all stopped for good and the kubelet gives
# their devices to other pods (k8s.io/api/core/v1 PodPhase). "Unknown" and "Pending" are not.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class PodPhase:
    """One pod of the kubelet's pod list."""

    namespace: str
    name: str
    phase: str  # status.phase as listed; "" when the pod has none yet


def _object(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise DecodeError(f"PodList: {where} is {type(value).__name__}, not an object")
    return value


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise DecodeError(f"PodList: {where} is {type(value).__name__}, not a string")
    return value


def decode_pod_list(data: bytes) -> tuple[PodPhase, ...]:
    """The pods of a v1 PodList in JSON, as the kubelet's GET /pods answers; DecodeError names
    what does not fit. Only metadata.namespace, metadata.name and status.phase are read."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError
        raise DecodeError(f"PodList: not JSON: {' '.join(str(exc).split())[:200]}") from None
    top = _object(document, "the answer")
    kind = top.get("kind", "PodList")
    if kind != "PodList":
        raise DecodeError(f"PodList: the answer is a {kind!r}, not a PodList")
    items = top.get("items")
    if items is None:  # how Go writes a list it never filled
        items = []
    if not isinstance(items, list):
        raise DecodeError(f"PodList: items is {type(items).__name__}, not a list")
    pods = []
    for index, item in enumerate(items):
        where = f"items[{index}]"
        pod = _object(item, where)
        metadata = _object(pod.get("metadata"), f"{where}.metadata")
        status = _object(pod.get("status") or {}, f"{where}.status")
        pods.append(
            PodPhase(
                _string(metadata.get("namespace"), f"{where}.metadata.namespace"),
                _string(metadata.get("name"), f"{where}.metadata.name"),
                _string(status.get("phase", ""), f"{where}.status.phase"),
            )
        )
    return tuple(pods)


@dataclass(frozen=True)
class PodPhases:
    """The phases the kubelet lists per pod (namespace, name), or why none could be read."""

    # More than one phase when a pod's name was reused: a new pod of a StatefulSet, say, listed
    # next to its finished predecessor. The pod-resources answer names pods without their UID.
    listed: Mapping[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    unknown: str | None = None

    @classmethod
    def of(cls, pods: Iterable[PodPhase]) -> PodPhases:
        listed: dict[tuple[str, str], tuple[str, ...]] = {}
        for pod in pods:
            key = (pod.namespace, pod.name)
            listed[key] = (*listed.get(key, ()), pod.phase)
        return cls(listed)

    @classmethod
    def unread(cls, why: str) -> PodPhases:
        return cls(unknown=why)

    def judge(self, namespace: str, name: str) -> tuple[bool, str]:
        """(finished, what is known of the phase). A pod is finished only when every pod listed
        under its name is Succeeded or Failed; anything not known keeps it holding its GPU."""
        if self.unknown is not None:
            return False, f"phase unknown, so taken as running: {self.unknown}"
        phases = self.listed.get((namespace, name))
        if not phases:
            return False, "phase unknown, so taken as running: not in the kubelet's pod list"
        if all(phase in TERMINAL_PHASES for phase in phases):
            return True, "/".join(dict.fromkeys(phases))
        live = dict.fromkeys(p or "not set yet" for p in phases if p not in TERMINAL_PHASES)
        return False, f"phase {'/'.join(live)}"
