"""`sweep.kubernetes`: where a sweep's pairs run on Kubernetes, as JobSets that Kueue admits at
the lowest priority (netmon.sweep.kube.scheduler; docs/DEPLOY.md, "Cluster sweeps on
Kubernetes")."""

from __future__ import annotations

import ipaddress
import urllib.parse
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

# Names the API server takes for namespaces, LocalQueues, ConfigMaps and service accounts (a
# DNS-1123 label), and for priority classes (a DNS-1123 subdomain).
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# An extended resource: a domain prefix, a slash, a name (rdma/ib, nvidia.com/hostdev).
EXTENDED_RESOURCE = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
SecretName = Annotated[str, StringConstraints(max_length=253, pattern=DNS_SUBDOMAIN)]
# Plain http only to this machine (a local proxy, the tests' server): elsewhere the bearer
# token would cross the network in clear.
LOOPBACK_NAMES = frozenset({"localhost"})


class Toleration(BaseModel):
    """A pod toleration, as the API has it (tolerationSeconds left out: a pair is short)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    def manifest(self) -> dict[str, str]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class KubernetesSweep(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Where the JobSets and their pods live; the Kueue LocalQueue there that admits them; the
    # WorkloadPriorityClass (the cluster's lowest) that lets every user workload preempt them.
    namespace: str = Field("netmon", max_length=63, pattern=DNS_LABEL)
    queue: str = Field("netmon-sweep", max_length=63, pattern=DNS_LABEL)
    priority_class: str = Field("netmon-sweep", max_length=253, pattern=DNS_SUBDOMAIN)
    # The pods' own PriorityClass, for the kube-scheduler's preemption of pods that Kueue does
    # not manage (a WorkloadPriorityClass does not set a pod's priority).
    pod_priority_class: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    image: str | None = None  # the netmon image the ranks run (required)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    # The Secrets (names, in `namespace`) the kubelet pulls the image with from a private
    # registry: the pods' imagePullSecrets.
    image_pull_secrets: tuple[SecretName, ...] = ()
    service_account: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    # The nodes a sweep takes (labels, all of them must match) and the taints its pods tolerate.
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    runtime_class: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    # The node daemons' ConfigMap: its netmon.yaml's `env` (NCCL_SOCKET_IFNAME...) for the ranks.
    config_map: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    # The pods on the node's network, not the pod network: the node's interfaces and addresses
    # (a RoCE NIC's GIDs belong to its netdev). It gives no RDMA device and no IPC_LOCK: without
    # rdma_resource (or a runtime that injects /dev/infiniband) NCCL uses TCP sockets.
    host_network: bool = False
    # The RDMA device plugin's resource (rdma/ib, rdma/hca_shared_devices_a, nvidia.com/hostdev),
    # one per pod with nccl: the plugin gives the pod /dev/infiniband and its device permission.
    rdma_resource: str | None = Field(None, max_length=316, pattern=EXTENDED_RESOURCE)
    # IPC_LOCK for the ranks, so that NCCL may pin its RDMA buffers past the memlock limit. A
    # capability survives the ranks' exec only for root: the rank container then runs as uid 0,
    # every other capability still dropped (docs/DEPLOY.md, "The RDMA variant").
    ipc_lock: bool = False
    # The labels of the node daemons' pods: a node's report goes to its daemon pod's address.
    daemon_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "netmon"}
    )
    gpu_resource: str = "nvidia.com/gpu"
    # Node labels that name the group of nodes under one leaf (the levels Kueue's Topology
    # Aware Scheduling reads), the most specific first: the first a node has is its group.
    # Where every swept node has one, round 1 stays inside groups (netmon.sweep.kube.state).
    topology_labels: tuple[str, ...] = (
        "topology.k8s.aws/network-node-layer-3",
        "cloud.google.com/gce-topology-subblock",
        "cloud.google.com/gce-topology-block",
    )
    # Pairs per JobSet: Kueue admits a JobSet as one Workload with a podSet per pair, and a
    # Workload holds at most 8 podSets (10 in Kueue 0.18, 18 from 0.19). Kueue evicts a whole
    # Workload: with 8 pairs in one, one user pod would take 16 nodes' results. 1 by default.
    max_pairs_per_jobset: int = Field(1, ge=1, le=18)
    # A sweep refuses to run without pod_priority_class (its pods would preempt nothing, but
    # the kube-scheduler would not preempt them either for pods Kueue does not manage) and,
    # on GPU nodes, without rdma_resource (NCCL would measure TCP sockets), unless these say
    # the site knows: a runtime that injects the RDMA devices, a cluster where every pod is
    # Kueue's.
    allow_without_pod_priority: bool = False
    allow_without_rdma: bool = False
    # The API server; default: the pod's own (KUBERNETES_SERVICE_HOST, its service account).
    api_server: str | None = Field(None, pattern=r"^https?://[^/\s]+$")
    token_file: Path | None = None
    ca_file: Path | None = None

    @field_validator("api_server")
    @classmethod
    def _https_off_this_machine(cls, value: str | None) -> str | None:
        if value is None or not value.startswith("http://"):
            return value
        host = urllib.parse.urlsplit(value).hostname or ""
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host.lower() in LOOPBACK_NAMES
        if not loopback:
            raise ValueError(
                "use https: plain http would send the bearer token in clear (http is taken "
                "only for 127.0.0.1, ::1 or localhost)"
            )
        return value
