"""The sweep's scheduler on Kubernetes: the idle nodes from the API server, each round's pairs as
a JobSet that Kueue admits at the lowest WorkloadPriorityClass (so every user workload preempts
it), and how each pair came out from its pods, their logs and Kueue's Workload.

A round is one API object, not one per pair: Kueue queues and admits the JobSet as one
Workload. A Workload holds a bounded number of podSets (one per pair), so a round of more pairs
than `sweep.kubernetes.max_pairs_per_jobset` is that many pairs per JobSet. The pure parts are
kube_manifests (the JobSets), kube_state (what the answers say) and kube_result (a pair's
outcome); docs/DEPLOY.md, "Cluster sweeps on Kubernetes", has the setup.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from netmon.errors import UsageError
from netmon.sweep.kube import state
from netmon.sweep.kube.api import SERVICE_ACCOUNT, KubeApi, NotFound, api_target
from netmon.sweep.kube.manifests import (
    CONTAINER,
    JOBSET_API,
    LABEL_ROUND,
    LABEL_SWEEP,
    RoundPart,
    build_jobset,
    jobset_name,
    split_round,
)
from netmon.sweep.kube.result import PairWatch
from netmon.sweep.locate import classes
from netmon.sweep.locate.plan import PairPlan, SweepNode
from netmon.sweep.scheduler import PairRun, SchedulerError
from netmon.sweep.settings import SweepConfig

log = logging.getLogger(__name__)

POLL_S = 2.0
API_TIMEOUT_S = 10.0
# What a round keeps of the sweep's deadline after its pairs: the last logs and the deletion.
TAIL_S = 10.0
# Another sweep's JobSet this long past its ranks' deadline was left behind (its sweep died):
# deleted, rather than holding every later sweep off.
STALE_S = 120.0
KUEUE_VERSIONS = ("v1beta2", "v1beta1")  # v1beta2 from Kueue 0.15; v1beta1 up to 0.19 at least
# Every call the sweep makes, as RBAC names it: (API group, resource, verb, scope). The chart's
# Role ("namespace") and ClusterRole ("cluster") grant exactly these (tests/test_helm.py), and
# the tests' API server refuses anything else (tests/fake_apiserver.py).
PERMISSIONS = frozenset(
    {
        ("", "nodes", "list", "cluster"),
        ("", "pods", "list", "cluster"),  # which nodes are busy, where the daemons are
        ("", "pods", "list", "namespace"),  # a round's pods
        ("", "pods/log", "get", "namespace"),
        ("jobset.x-k8s.io", "jobsets", "create", "namespace"),
        ("jobset.x-k8s.io", "jobsets", "list", "namespace"),
        ("jobset.x-k8s.io", "jobsets", "delete", "namespace"),
        ("kueue.x-k8s.io", "workloads", "list", "namespace"),
    }
)


def own_pod(
    environ: Mapping[str, str], namespace_file: Path = SERVICE_ACCOUNT / "namespace"
) -> state.PodRef | None:
    """The pod this sweep runs in: the downward API's NETMON_SWEEP_POD_{UID,NAME,NAMESPACE}
    (the chart sets them), else HOSTNAME in the service account's namespace."""
    uid = environ.get("NETMON_SWEEP_POD_UID", "")
    name = environ.get("NETMON_SWEEP_POD_NAME") or environ.get("HOSTNAME", "")
    namespace = environ.get("NETMON_SWEEP_POD_NAMESPACE", "")
    if not namespace:
        try:
            namespace = namespace_file.read_text().strip()
        except OSError:
            namespace = ""
    if uid or (name and namespace):
        return state.PodRef(namespace, name, uid)
    return None


@dataclass
class KubernetesScheduler:
    settings: SweepConfig
    sweep: str
    api: KubeApi
    poll_s: float = POLL_S
    backend: str = "gloo"
    addresses: dict[str, str] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    own: state.PodRef | None = None  # the sweep's own pod, which makes no node busy
    _deadline: float = float("inf")
    _kueue_version: str | None = None
    _swept: list[state.NodeView] = field(default_factory=list)  # the last nodes() answer

    @classmethod
    def connect(
        cls, settings: SweepConfig, sweep: str, environ: Mapping[str, str] | None = None
    ) -> KubernetesScheduler:
        """In the pod's cluster (or sweep.kubernetes.api_server); UsageError names the setting."""
        k = settings.kubernetes
        if not k.image:
            raise UsageError("sweep.kubernetes.image: set the netmon image the pairs' ranks run")
        if not k.pod_priority_class and not k.allow_without_pod_priority:
            raise UsageError(
                "sweep.kubernetes.pod_priority_class: set a PriorityClass below every workload's "
                "(the chart's sweep.podPriorityClass), or allow_without_pod_priority: true"
            )
        environ = os.environ if environ is None else environ
        target = api_target(settings.kubernetes, environ)
        return cls(settings, sweep, KubeApi(target), own=own_pod(environ))

    @property
    def namespace(self) -> str:
        return self.settings.kubernetes.namespace

    def _jobsets(self) -> str:
        return f"/apis/{JOBSET_API}/namespaces/{self.namespace}/jobsets"

    def _timeout(self) -> float:
        """A call is bounded by what is left of the sweep's deadline."""
        return max(1.0, min(API_TIMEOUT_S, self._deadline - time.time()))

    def _cluster(self) -> tuple[list[state.NodeView], list[dict[str, object]]]:
        """Every node the selector takes, and every pod not ended: one list call of each."""
        k = self.settings.kubernetes
        selector = state.label_selector(k.node_selector)
        nodes = self.api.items(
            "/api/v1/nodes", {"labelSelector": selector} if selector else None, self._timeout()
        )
        ended = "status.phase!=Succeeded,status.phase!=Failed"
        pods = self.api.items("/api/v1/pods", {"fieldSelector": ended}, self._timeout())
        return [state.node_view(n, k.gpu_resource, k.topology_labels) for n in nodes], pods

    def _free(
        self, views: Sequence[state.NodeView], pods: Sequence[Mapping[str, object]]
    ) -> list[state.NodeView]:
        k = self.settings.kubernetes
        busy = state.occupied(pods, k.gpu_resource, self.backend == "nccl", self.sweep, self.own)
        return [v for v in views if state.schedulable(v, k.tolerations) and v.name not in busy]

    def nodes(self, partition: str, nodelist: str | None) -> list[SweepNode]:
        """`partition` is not Slurm's here: the nodes are sweep.kubernetes.node_selector's (of
        `nodelist`, node names separated by commas)."""
        views, pods = self._cluster()
        if nodelist:
            wanted = {name.strip() for name in nodelist.split(",") if name.strip()}
            views = [v for v in views if v.name in wanted]
        k = self.settings.kubernetes
        if self.settings.backend == "auto":
            usable = [v for v in views if state.schedulable(v, k.tolerations)]
            self.backend = "nccl" if any(v.gpus > 0 for v in usable) else "gloo"
        else:
            self.backend = self.settings.backend
        if self.backend == "nccl" and not k.rdma_resource and not k.allow_without_rdma:
            raise UsageError(
                "sweep.kubernetes.rdma_resource: GPU pairs without the RDMA device plugin's "
                "resource measure TCP sockets; set it (e.g. rdma/ib), or allow_without_rdma: true"
            )
        daemons = state.daemon_addresses(pods, k.daemon_labels)
        found = []
        self._swept = self._free(views, pods)
        for view in self._swept:
            address = daemons.get(view.name) or view.address or view.name
            self.addresses[view.name] = address
            rails = self.settings.rails or max(view.gpus, 1)
            found.append(SweepNode(view.name, rails=rails, address=address, kind=view.kind))
        return found

    def taken(self, nodes: Sequence[str]) -> set[str]:
        if not nodes:
            return set()
        views, pods = self._cluster()
        free = {v.name for v in self._free(views, pods)}
        return {name for name in nodes if name not in free}

    def other_sweeps(self) -> list[str]:
        try:
            query = {"labelSelector": LABEL_SWEEP}
            listed = self.api.items(self._jobsets(), query, self._timeout())
        except NotFound:
            raise SchedulerError(
                f"the API server serves no {JOBSET_API} JobSets in namespace "
                f"{self.namespace}: is the JobSet controller installed?"
            ) from None
        others = []
        for jobset in map(state.jobset_view, listed):
            if jobset.sweep == self.sweep or jobset.finished:
                continue
            if jobset.deadline is not None and jobset.deadline + STALE_S < time.time():
                log.warning(
                    "sweep: deleting %s, left behind by sweep %s", jobset.name, jobset.sweep
                )
                self.api.delete(f"{self._jobsets()}/{jobset.name}", self._timeout())
                continue
            others.append(f"JobSet {jobset.name}")
        return others

    def run_round(self, pairs: Sequence[PairPlan], deadline: float) -> list[PairRun]:
        if not pairs:
            return []
        self._deadline = deadline
        round_ = pairs[0].round
        # One JobSet deadline for the round's pairs: the longest-measuring pair's.
        timeout = self.settings.pair_timeout_for(max(plan.repeats for plan in pairs))
        pair_deadline = min(deadline - TAIL_S, time.time() + timeout)
        size = self.settings.kubernetes.max_pairs_per_jobset
        watches: list[PairWatch] = []
        for number, chunk in enumerate(split_round(pairs, size)):
            name = jobset_name(self.settings.job_name, self.sweep, round_, number)
            part = RoundPart(name, self.sweep, round_, chunk, pair_deadline, self._backend(chunk))
            watches += self._submit(part)
        self._watch(watches, round_, pair_deadline)
        for name in dict.fromkeys(w.jobset for w in watches):
            self._delete(name)
        return [watch.run() for watch in watches]

    def _submit(self, part: RoundPart) -> list[PairWatch]:
        submitted = time.time()
        watches = [PairWatch(i, plan, part.name, submitted) for i, plan in part.pairs]
        manifest = build_jobset(part, self.settings, self.namespace, submitted)
        try:
            self.api.create(self._jobsets(), manifest, self._timeout())
        except SchedulerError as exc:
            for watch in watches:
                watch.decide("error", f"the JobSet was not created: {exc}"[:300], time.time())
            return watches
        self.created.append(part.name)
        log.debug("sweep: created JobSet %s with %d pair(s)", part.name, len(part.pairs))
        return watches

    def _watch(self, watches: Sequence[PairWatch], round_: int, deadline: float) -> None:
        """Poll until every pair is decided or the deadline; what is left then expires."""
        admitted: dict[str, bool] = {}
        waiting_for: dict[str, str] = {}
        while True:
            open_ = [w for w in watches if w.decided is None]
            if not open_ or time.time() >= deadline:
                break
            try:
                self._poll(open_, round_, admitted, waiting_for)
            except SchedulerError as exc:  # the API server away for a while: ask again
                log.warning("sweep: cannot ask how round %d is doing: %s", round_, exc)
            if any(w.decided is None for w in watches):
                time.sleep(max(0.0, min(self.poll_s, deadline - time.time())))
        for watch in watches:
            if watch.decided is None:
                message = waiting_for.get(watch.jobset, "")
                watch.expire(admitted.get(watch.jobset, False), message, time.time())

    def _poll(
        self,
        watches: Sequence[PairWatch],
        round_: int,
        admitted: dict[str, bool],
        waiting_for: dict[str, str],
    ) -> None:
        selector = state.label_selector({LABEL_SWEEP: self.sweep, LABEL_ROUND: str(round_)})
        query = {"labelSelector": selector}
        listed = self.api.items(self._jobsets(), query, self._timeout())
        jobsets = {js.name: js for js in map(state.jobset_view, listed)}
        for js in jobsets.values():
            admitted[js.name] = admitted.get(js.name, False) or not js.suspended
        suspended = [js for js in jobsets.values() if js.suspended and js.finished is None]
        if suspended:
            self._kueue(suspended, watches, admitted, waiting_for)
        pods_path = f"/api/v1/namespaces/{self.namespace}/pods"
        pods = [state.pod_view(p) for p in self.api.items(pods_path, query, self._timeout())]
        for watch in watches:
            jobset = jobsets.get(watch.jobset)
            now = time.time()
            if jobset is None:
                watch.decide("error", f"JobSet {watch.jobset} was deleted", now)
                continue
            mine = [pod for pod in pods if pod.pair == watch.index]
            # Pods of a finished JobSet go because it ended them, not because of a preemption.
            watch.observe(mine, now, deleted_means_preempted=jobset.finished is None)
            for name in watch.logs_wanted():
                text = self.api.log(f"{pods_path}/{name}/log", CONTAINER, self._timeout())
                watch.read(name, text, time.time())
            if jobset.finished is not None and watch.decided is None:
                watch.ended_without(jobset.message or jobset.finished, time.time())

    def _kueue(
        self,
        suspended: Sequence[state.JobSetView],
        watches: Sequence[PairWatch],
        admitted: dict[str, bool],
        waiting_for: dict[str, str],
    ) -> None:
        """Kueue's word on the JobSets still suspended: waiting, or evicted after admission;
        no Workload at all is said too, since the pairs then wait for nothing."""
        workloads = self._workloads(suspended)
        by_owner = {state.workload_owner(w): state.admission(w) for w in workloads or []}
        for jobset in suspended:
            said = by_owner.get(jobset.uid)
            if said is None:
                waiting_for[jobset.name] = self._no_workload(jobset.name, workloads is not None)
                continue
            admitted[jobset.name] = admitted.get(jobset.name, False) or said.admitted
            waiting_for[jobset.name] = said.message
            if said.evicted:
                for watch in watches:
                    if watch.jobset == jobset.name:
                        watch.evicted(said, time.time())

    def _no_workload(self, name: str, kueue_served: bool) -> str:
        k = self.settings.kubernetes
        if not kueue_served:
            return (
                f"the API server serves no Kueue Workloads ({', '.join(KUEUE_VERSIONS)}) in "
                f"namespace {self.namespace}: is Kueue installed?"
            )
        return (
            f"Kueue made no Workload for JobSet {name}: check that the LocalQueue {k.queue} "
            f"(sweep.kubernetes.queue) exists in namespace {self.namespace}, that the "
            f"WorkloadPriorityClass {k.priority_class} (sweep.kubernetes.priority_class) "
            "exists, and that Kueue manages JobSets in this namespace"
        )

    def _workloads(self, jobsets: Sequence[state.JobSetView]) -> list[dict[str, object]] | None:
        """The JobSets' Workloads; None when the cluster serves no Kueue API."""
        uids = ",".join(js.uid for js in jobsets if js.uid)
        if not uids:
            return []
        query = {"labelSelector": f"kueue.x-k8s.io/job-uid in ({uids})"}
        for version in [self._kueue_version] if self._kueue_version else KUEUE_VERSIONS:
            path = f"/apis/kueue.x-k8s.io/{version}/namespaces/{self.namespace}/workloads"
            try:
                found = self.api.items(path, query, self._timeout())
            except NotFound:
                continue
            self._kueue_version = version
            return list(found)
        return None  # its JobSets stay suspended, the pairs busy

    def _delete(self, name: str) -> None:
        try:
            self.api.delete(f"{self._jobsets()}/{name}", self._timeout())
        except SchedulerError as exc:
            log.warning("sweep: cannot delete JobSet %s: %s", name, exc)

    def _backend(self, chunk: Sequence[tuple[int, PairPlan]]) -> str:
        """NCCL where every node of the JobSet's pairs has GPUs (sweep.backend: auto): a
        CPU-only node's pair runs gloo, the GPU nodes' pairs NCCL (netmon.sweep.locate.classes)."""
        if self.backend != "nccl":
            return self.backend
        gpus = {view.name: view.gpus for view in self._swept}
        nodes = [node for _, plan in chunk for node in plan.nodes]
        return classes.backend_for(self.settings.backend, (gpus.get(n, 1) for n in nodes))

    def topology(self) -> str | None:
        """The swept nodes' groups from their topology labels (sweep.kubernetes.
        topology_labels), as blocks; None where a node has none (then sweep.fabric's file)."""
        return state.topology_text(self._swept)

    def cleanup(self) -> None:
        """Delete every JobSet of this sweep still known (one list call, a delete for each)."""
        if not self.created:
            return
        try:
            query = {"labelSelector": f"{LABEL_SWEEP}={self.sweep}"}
            listed = self.api.items(self._jobsets(), query, self._timeout())
        except SchedulerError as exc:
            log.warning("sweep: cannot list the sweep's JobSets: %s", exc)
            return
        for jobset in map(state.jobset_view, listed):
            self._delete(jobset.name)
