"""What the API server's answers say to a sweep on Kubernetes. Pure: JSON in, values out.

Which nodes a pair may take (Ready, schedulable, no taint its pods do not tolerate, and no pod
holding a GPU; without GPUs, no pod at all but a DaemonSet's or the node's own), where each
node's daemon listens, and the parts of pods, JobSets and Kueue Workloads that say how a pair
is doing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from netmon.sweep.kube.manifests import ANNOTATION_DEADLINE, LABEL_PAIR, LABEL_SWEEP
from netmon.sweep.kube.settings import Toleration
from netmon.sweep.locate import classes

# Owners of pods that run on every node whatever a user schedules: they never make it busy.
SYSTEM_OWNERS = frozenset({"DaemonSet", "Node"})  # Node: a static (mirror) pod
_TAINTS_THAT_BLOCK = frozenset({"NoSchedule", "NoExecute"})
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU feature discovery's, e.g. NVIDIA-H100-80GB-HBM3
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # the Job controller's annotation


def label_selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    found = (obj.get("status") or {}).get("conditions") or []
    return {str(c.get("type")): c for c in found if isinstance(c, Mapping)}


def _true(condition: Mapping[str, Any] | None) -> bool:
    return condition is not None and condition.get("status") == "True"


@dataclass(frozen=True)
class NodeView:
    name: str
    ready: bool
    unschedulable: bool
    taints: tuple[Mapping[str, Any], ...]
    gpus: int  # allocatable
    address: str | None  # InternalIP
    kind: str = ""  # its node class (netmon.sweep.locate.classes): GPU product and count
    group: str | None = None  # the value of its first topology label: the nodes under one leaf


def node_view(
    node: Mapping[str, Any], gpu_resource: str, topology_labels: Sequence[str] = ()
) -> NodeView:
    status = node.get("status") or {}
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    try:
        gpus = int(str((status.get("allocatable") or {}).get(gpu_resource, 0)))
    except ValueError:
        gpus = 0
    spec = node.get("spec") or {}
    return NodeView(
        name=str(_meta(node).get("name")),
        ready=_true(_conditions(node).get("Ready")),
        unschedulable=bool(spec.get("unschedulable")),
        taints=tuple(spec.get("taints") or ()),
        gpus=gpus,
        address=addresses.get("InternalIP"),
        kind=classes.node_class(gpus, _products(node)),
        group=_group(node, topology_labels),
    )


def _group(node: Mapping[str, Any], keys: Sequence[str]) -> str | None:
    labels = _meta(node).get("labels") or {}
    return next((f"{key}={labels[key]}" for key in keys if labels.get(key)), None)


def topology_text(views: Sequence[NodeView]) -> str | None:
    """The nodes' groups in topology.conf's block syntax (netmon.sweep.locate.fabric_file),
    where every node has one; None otherwise (a partial fabric would claim too much)."""
    if not views or any(v.group is None for v in views):
        return None
    members: dict[str, list[str]] = {}
    for view in views:
        members.setdefault(str(view.group), []).append(view.name)
    names = {group: f"g{index}" for index, group in enumerate(sorted(members))}
    return "".join(
        f"BlockName={names[group]} Nodes={','.join(nodes)}\n" for group, nodes in members.items()
    )


def _products(node: Mapping[str, Any]) -> list[str]:
    """The GPU model GPU feature discovery labels the node with (nvidia.com/gpu.product)."""
    product = (_meta(node).get("labels") or {}).get(GPU_PRODUCT_LABEL)
    return [str(product)] if product else []


def tolerated(taint: Mapping[str, Any], tolerations: Sequence[Toleration]) -> bool:
    """Whether one of `tolerations` tolerates `taint`, as the kube-scheduler decides."""
    for toleration in tolerations:
        if toleration.effect is not None and toleration.effect != taint.get("effect"):
            continue
        if toleration.key is None:  # an empty key with Exists tolerates everything
            if toleration.operator == "Exists":
                return True
            continue
        if toleration.key != taint.get("key"):
            continue
        if toleration.operator == "Exists" or (toleration.value or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def schedulable(node: NodeView, tolerations: Sequence[Toleration]) -> bool:
    blocking = [t for t in node.taints if t.get("effect") in _TAINTS_THAT_BLOCK]
    return (
        node.ready
        and not node.unschedulable
        and all(tolerated(taint, tolerations) for taint in blocking)
    )


def _active(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def holds_gpus(pod: Mapping[str, Any], gpu_resource: str) -> bool:
    spec = pod.get("spec") or {}
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        for kind in ("limits", "requests"):
            if str((resources.get(kind) or {}).get(gpu_resource, "0")) not in ("0", ""):
                return True
    return False


def _owner_kinds(pod: Mapping[str, Any]) -> set[str]:
    return {str(o.get("kind")) for o in _meta(pod).get("ownerReferences") or []}


@dataclass(frozen=True)
class PodRef:
    """The pod the sweep itself runs in (the CronJob's): its uid, else its namespace and name."""

    namespace: str
    name: str
    uid: str = ""

    def matches(self, pod: Mapping[str, Any]) -> bool:
        meta = _meta(pod)
        if self.uid and meta.get("uid"):
            return bool(meta.get("uid") == self.uid)
        return bool(meta.get("name") == self.name and meta.get("namespace") == self.namespace)


def occupied(
    pods: Iterable[Mapping[str, Any]],
    gpu_resource: str,
    gpus: bool,
    sweep: str,
    own: PodRef | None = None,
) -> set[str]:
    """Nodes where a pod that is not this sweep's holds a GPU (`gpus`), or, without GPUs, runs
    at all (a DaemonSet's and static pods aside): a pair there would share the node. The
    sweep's own pod (`own`) makes no node busy: it only plans and asks the API server."""
    found: set[str] = set()
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or not _active(pod):
            continue
        if (_meta(pod).get("labels") or {}).get(LABEL_SWEEP) == sweep:
            continue  # this sweep's own pairs, the last round's still ending
        if own is not None and own.matches(pod):
            continue
        takes = holds_gpus(pod, gpu_resource) if gpus else not _owner_kinds(pod) & SYSTEM_OWNERS
        if takes:
            found.add(str(node))
    return found


def daemon_addresses(
    pods: Iterable[Mapping[str, Any]], labels: Mapping[str, str]
) -> dict[str, str]:
    """{node: its running daemon pod's address}: the pod's IP, the node's own with hostNetwork."""
    found: dict[str, str] = {}
    for pod in pods:
        meta, status = _meta(pod), pod.get("status") or {}
        node, address = (pod.get("spec") or {}).get("nodeName"), status.get("podIP")
        mine = (meta.get("labels") or {}).items() >= labels.items()
        if mine and node and address and status.get("phase") == "Running":
            found[str(node)] = str(address)
    return found


@dataclass(frozen=True)
class PodView:
    name: str
    pair: int | None  # the pair's index in its round (LABEL_PAIR)
    index: int | None  # its index in the pair's Indexed Job: the ranks' rank
    node: str | None  # where it was scheduled
    phase: str
    disruption: str | None  # DisruptionTarget's reason: preempted, evicted, deleted
    unschedulable: str | None  # the scheduler's message while it finds no node
    waiting: str | None  # why its container cannot start (ErrImagePull: ...)

    @property
    def ended(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def _waiting(pod: Mapping[str, Any]) -> str | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason and reason != "ContainerCreating":
            return f"{reason}: {waiting.get('message') or ''}".strip(": ")
    return None


def _number(text: object) -> int | None:
    return int(text) if isinstance(text, str) and text.isdigit() else None


def pod_view(pod: Mapping[str, Any]) -> PodView:
    meta, conditions = _meta(pod), _conditions(pod)
    pair = (meta.get("labels") or {}).get(LABEL_PAIR)
    index = (meta.get("annotations") or {}).get(COMPLETION_INDEX)
    disrupted = conditions.get("DisruptionTarget")
    disruption = str((disrupted or {}).get("reason") or "disrupted") if _true(disrupted) else None
    scheduled = conditions.get("PodScheduled")
    unschedulable = None
    # Unschedulable, not SchedulingGated: a gated pod is not looking for a node yet.
    if (
        scheduled
        and scheduled.get("status") == "False"
        and scheduled.get("reason") == "Unschedulable"
    ):
        unschedulable = str(scheduled.get("message") or scheduled.get("reason") or "unschedulable")
    return PodView(
        name=str(meta.get("name")),
        pair=_number(pair),
        index=_number(index),
        node=(pod.get("spec") or {}).get("nodeName") or None,
        phase=str((pod.get("status") or {}).get("phase") or "Pending"),
        disruption=disruption,
        unschedulable=unschedulable,
        waiting=_waiting(pod),
    )


@dataclass(frozen=True)
class JobSetView:
    name: str
    uid: str
    sweep: str | None
    suspended: bool
    finished: str | None  # Completed or Failed
    message: str
    deadline: float | None  # ANNOTATION_DEADLINE


def jobset_view(jobset: Mapping[str, Any]) -> JobSetView:
    meta, conditions = _meta(jobset), _conditions(jobset)
    finished = next((t for t in ("Completed", "Failed") if _true(conditions.get(t))), None)
    try:
        deadline: float | None = float((meta.get("annotations") or {})[ANNOTATION_DEADLINE])
    except (KeyError, ValueError, TypeError):
        deadline = None
    return JobSetView(
        name=str(meta.get("name")),
        uid=str(meta.get("uid") or ""),
        sweep=(meta.get("labels") or {}).get(LABEL_SWEEP),
        suspended=bool((jobset.get("spec") or {}).get("suspend")),
        finished=finished,
        message=str((conditions.get(finished or "") or {}).get("message") or ""),
        deadline=deadline,
    )


@dataclass(frozen=True)
class Admission:
    """Kueue's word on one JobSet's Workload."""

    admitted: bool  # ever admitted (quota reserved) or evicted after it
    evicted: str | None  # the Evicted condition's reason: Preempted, PodsReadyTimeout...
    message: str  # why it waits, or why it was evicted


def admission(workload: Mapping[str, Any]) -> Admission:
    conditions = _conditions(workload)
    evicted = conditions.get("Evicted")
    if _true(evicted):
        assert evicted is not None
        return Admission(
            True, str(evicted.get("reason") or "Evicted"), str(evicted.get("message") or "")
        )
    reserved = conditions.get("QuotaReserved")
    admitted = _true(conditions.get("Admitted")) or _true(reserved)
    return Admission(admitted, None, str((reserved or {}).get("message") or ""))


def workload_owner(workload: Mapping[str, Any]) -> str | None:
    """The uid of the JobSet a Workload stands for (Kueue's kueue.x-k8s.io/job-uid label)."""
    return (_meta(workload).get("labels") or {}).get("kueue.x-k8s.io/job-uid")
