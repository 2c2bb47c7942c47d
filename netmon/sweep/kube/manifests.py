"""A round's pairs as JobSets (jobset.x-k8s.io/v1alpha2) for Kueue to admit. Pure: plans and
settings in, the API server's JSON out.

Each pair (or trio) is a replicatedJob of one Indexed Job with a pod per node: the pods may run
only on the pair's nodes (node affinity on their names) and never two on one node (pod
anti-affinity on the hostname), so which index lands on which node is the scheduler's choice.
Nothing depends on it: rank k of every pod runs on GPU k (rails stay aligned whichever node is
index 0), every pod reports the node it ran on, and the ranks meet at index 0's DNS name under
the JobSet's headless service. Kueue admits a JobSet as one Workload with a podSet per
replicatedJob, at most 8 (18 from Kueue 0.19), so a round is as few JobSets as that allows.
docs/DEPLOY.md, "Cluster sweeps on Kubernetes", has the facts this rests on and their sources.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from netmon.sweep.locate.plan import PairPlan
from netmon.sweep.settings import SweepConfig

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
LABEL_SWEEP = "netmon/sweep"  # the sweep id, on the JobSets and their pods
LABEL_ROUND = "netmon/sweep-round"
LABEL_PAIR = "netmon/sweep-pair"  # the pair's index in its round
ANNOTATION_DEADLINE = "netmon/sweep-deadline"  # when the ranks stop, in epoch seconds
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
CONTAINER = "rank"
NODE_CONFIG_DIR = "/etc/netmon-node"
# JobSet refuses a JobSet whose pod names (<jobset>-<replicatedJob>-<job>-<pod>-<5 random>)
# would pass 63 characters: the prefix is cut so that the longest at 4,096 nodes (replicated
# job p2047 of JobSet part 2047 in round 10, a trio's pod 2) is 62.
PREFIX_MAX = 16
ACTIVE_GRACE_S = 30  # the Job's own deadline, after the ranks' (they end themselves first)
TTL_AFTER_FINISHED_S = 600  # a JobSet the sweep could not delete goes by itself
PER_RANK_MI = 300  # a rank's host memory besides its buffers (torch, a CUDA context)


@dataclass(frozen=True)
class RoundPart:
    """One JobSet: some of a round's pairs, each with its index in the round."""

    name: str
    sweep: str
    round: int
    pairs: tuple[tuple[int, PairPlan], ...]
    deadline: float  # epoch seconds: the ranks end themselves then
    backend: str  # nccl or gloo

    def replicated_job(self, index: int) -> str:
        return f"p{index}"

    def master(self, index: int) -> str:
        """Pod 0 of pair `index` under the JobSet's headless service (subdomain = the name)."""
        return f"{self.name}-{self.replicated_job(index)}-0-0.{self.name}"


def jobset_name(prefix: str, sweep: str, round_: int, part: int) -> str:
    """A DNS-1035 label: lower case, starting with a letter."""
    clean = re.sub(r"[^a-z0-9-]+", "-", prefix.lower())[:PREFIX_MAX].strip("-")
    if not clean or not clean[0].isalpha():
        clean = f"s{clean}"[:PREFIX_MAX].strip("-")
    return f"{clean}-{sweep}-r{round_}-{part}"


def split_round(pairs: Sequence[PairPlan], size: int) -> list[tuple[tuple[int, PairPlan], ...]]:
    """The round's pairs, numbered, in parts of at most `size`."""
    numbered = list(enumerate(pairs))
    return [tuple(numbered[i : i + size]) for i in range(0, len(numbered), size)]


def rank_memory_mi(size: int) -> int:
    """A rank's host memory: torch and a CUDA context, and twice the all_reduce's buffer."""
    return PER_RANK_MI + 2 * math.ceil(size / (1 << 20))


def build_jobset(
    part: RoundPart, settings: SweepConfig, namespace: str, now: float
) -> dict[str, Any]:
    k = settings.kubernetes
    labels = {LABEL_SWEEP: part.sweep, LABEL_ROUND: str(part.round)}
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": {
            "name": part.name,
            "namespace": namespace,
            "labels": {**labels, QUEUE_LABEL: k.queue, PRIORITY_LABEL: k.priority_class},
            "annotations": {ANNOTATION_DEADLINE: f"{part.deadline:.0f}"},
        },
        "spec": {
            # Kueue unsuspends it once admitted; suspended here too, so that a cluster whose
            # Kueue webhook is missing never runs a pair unadmitted.
            "suspend": True,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            # Pod hostnames under a headless service named `subdomain`, which publishes pods
            # before they are ready (JobSet's default): pod 0's name resolves once it has an IP.
            "network": {"enableDNSHostnames": True, "subdomain": part.name},
            # A restart would measure pairs again after the round: never.
            "failurePolicy": {"maxRestarts": 0},
            "successPolicy": {"operator": "All"},
            "replicatedJobs": [
                _replicated_job(part, index, plan, settings, now) for index, plan in part.pairs
            ],
        },
    }


def _replicated_job(
    part: RoundPart, index: int, plan: PairPlan, settings: SweepConfig, now: float
) -> dict[str, Any]:
    labels = {LABEL_SWEEP: part.sweep, LABEL_ROUND: str(part.round), LABEL_PAIR: str(index)}
    pods = len(plan.nodes)
    return {
        "name": part.replicated_job(index),
        "replicas": 1,
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "parallelism": pods,
                "completions": pods,
                "completionMode": "Indexed",
                "backoffLimit": 0,
                "activeDeadlineSeconds": max(1, math.ceil(part.deadline - now)) + ACTIVE_GRACE_S,
                # A pod preempted or evicted fails no Job: a failed Job would fail the JobSet,
                # and a failed JobSet deletes every other pair's Job with it.
                "podFailurePolicy": {
                    "rules": [
                        {
                            "action": "Ignore",
                            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                        }
                    ]
                },
                "template": {
                    "metadata": {"labels": {**labels, "app.kubernetes.io/name": "netmon-sweep"}},
                    "spec": _pod_spec(part, index, plan, settings, labels),
                },
            },
        },
    }


def _pod_spec(
    part: RoundPart, index: int, plan: PairPlan, settings: SweepConfig, labels: dict[str, str]
) -> dict[str, Any]:
    k = settings.kubernetes
    spec: dict[str, Any] = {
        "restartPolicy": "Never",  # the Job's pod failure policy needs it
        "terminationGracePeriodSeconds": 5,
        "automountServiceAccountToken": False,  # the ranks never call the API
        "enableServiceLinks": False,
        "affinity": _affinity(plan, labels),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(part, index, plan, settings)],
        "volumes": _volumes(settings),
    }
    optional = {
        "serviceAccountName": k.service_account,
        "priorityClassName": k.pod_priority_class,
        "runtimeClassName": k.runtime_class,
    }
    spec |= {key: value for key, value in optional.items() if value}
    if k.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in k.image_pull_secrets]
    if k.tolerations:
        spec["tolerations"] = [t.manifest() for t in k.tolerations]
    if k.host_network:
        spec |= {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
    return spec


def _affinity(plan: PairPlan, labels: dict[str, str]) -> dict[str, Any]:
    # metadata.name, not the kubernetes.io/hostname label: a node's name is what the planner
    # has, and the label may differ from it (some clouds).
    on_names = {"key": "metadata.name", "operator": "In", "values": list(plan.nodes)}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [on_names]}]
            }
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": dict(labels)},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        },
    }


def _container(
    part: RoundPart, index: int, plan: PairPlan, settings: SweepConfig
) -> dict[str, Any]:
    k = settings.kubernetes
    memory = f"{plan.rails * rank_memory_mi(settings.size)}Mi"
    limits: dict[str, Any] = {"memory": memory}
    if part.backend == "nccl":
        limits[k.gpu_resource] = str(plan.rails)  # extended resources: requests default to limits
        if k.rdma_resource:
            limits[k.rdma_resource] = "1"  # the device plugin's /dev/infiniband for the pod
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "dshm", "mountPath": "/dev/shm"},  # NCCL's and gloo's shared memory
    ]
    if k.config_map:
        mounts.append({"name": "node-config", "mountPath": NODE_CONFIG_DIR, "readOnly": True})
    return {
        "name": CONTAINER,
        "image": k.image,
        "imagePullPolicy": k.image_pull_policy,
        "command": ["python", "-m", "netmon.sweep.kube.pod_ranks"],
        "env": _env(part, index, plan, settings),
        "resources": {"requests": {"cpu": str(plan.rails), "memory": memory}, "limits": limits},
        "securityContext": _security(settings),
        "volumeMounts": mounts,
    }


def _security(settings: SweepConfig) -> dict[str, Any]:
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    if settings.kubernetes.ipc_lock:
        # Without ambient capabilities a non-root user loses IPC_LOCK at the ranks' exec.
        security["capabilities"]["add"] = ["IPC_LOCK"]
        security |= {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False}
    return security


def _env(part: RoundPart, index: int, plan: PairPlan, settings: SweepConfig) -> list[Any]:
    values = {
        "NETMON_SWEEP_NODES": ",".join(f"{n}={n}" for n in plan.nodes),
        "NETMON_SWEEP_MASTER": part.master(index),
        "NETMON_SWEEP_RAILS": str(plan.rails),
        "NETMON_SWEEP_PORT": str(settings.rendezvous_port),
        "NETMON_SWEEP_SIZE": str(settings.size),
        "NETMON_SWEEP_WARMUP": str(settings.warmup),
        "NETMON_SWEEP_ITERS": str(settings.iters * plan.repeats),
        "NETMON_SWEEP_DEADLINE": f"{part.deadline:.3f}",
        "NETMON_SWEEP_BACKEND": part.backend,
        # The root filesystem is read-only: caches go to the writable /tmp.
        "HOME": "/tmp",
        "XDG_CACHE_HOME": "/tmp/cache",
    }
    if settings.kubernetes.config_map:
        values["NETMON_SWEEP_NODE_CONFIG"] = f"{NODE_CONFIG_DIR}/netmon.yaml"
    if part.backend != "nccl":
        # The image asks the NVIDIA runtime for every GPU; gloo ranks must hold none.
        values["NVIDIA_VISIBLE_DEVICES"] = "void"
    node = {"name": "NETMON_SWEEP_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    return [node, *({"name": k, "value": v} for k, v in values.items())]


def _volumes(settings: SweepConfig) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
    ]
    if settings.kubernetes.config_map:
        volumes.append(
            {"name": "node-config", "configMap": {"name": settings.kubernetes.config_map}}
        )
    return volumes
