"""Sweeps on Kubernetes, the scheduler: against a real HTTP server answering as the API server
does (tests/fake_apiserver.py: RBAC, pages, strict field validation, log tails), the JobSet,
Kueue and kube-scheduler's moves played by each test; `netmon sweep --scheduler kubernetes`
whole; a pair's pods run for real with gloo ranks on loopback. The JobSets themselves and the
pure parts are tests/test_sweep_kube_manifests.py."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from netmon.baseline.book import BaselineBook
from netmon.baseline.policy import BaselinePolicy
from netmon.cli.main import main
from netmon.errors import UsageError
from netmon.sweep.kube import manifests as km
from netmon.sweep.kube.api import LOG_TAIL_LINES, ApiTarget, KubeApi
from netmon.sweep.kube.result import judge_logs
from netmon.sweep.kube.scheduler import PERMISSIONS, KubernetesScheduler
from netmon.sweep.kube.state import PodRef
from netmon.sweep.locate.fabric_file import parse_topology
from netmon.sweep.locate.judge import Rules
from netmon.sweep.locate.localise import Localiser
from netmon.sweep.locate.plan import PairPlan
from netmon.sweep.scheduler import SchedulerError
from tests.fake_apiserver import TOKEN, FakeCluster, serving
from tests.test_sweep_kube_manifests import SWEEP, env_of, rank_lines, settings

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _sigterm_kept() -> Iterator[None]:
    """`netmon sweep --scheduler kubernetes` may take SIGTERM over; pytest keeps its own."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize(
    ("args", "kube", "named"),
    [
        (["--partition", "p"], {"image": "x"}, "--partition"),
        ([], {}, "sweep.kubernetes.image"),
        ([], {"image": "x"}, "sweep.kubernetes.pod_priority_class"),
        ([], {"image": "x", "pod_priority_class": "low"}, "sweep.kubernetes.api_server"),
        (
            [],
            {
                "image": "x",
                "allow_without_pod_priority": True,
                "api_server": "http://10.0.0.1:6443",
            },
            "sweep.kubernetes.api_server",
        ),
        (
            [],
            {
                "image": "x",
                "pod_priority_class": "low",
                "api_server": "https://127.0.0.1:1",
                "token_file": "/nonexistent/tok",
            },
            "sweep.kubernetes.token_file: /nonexistent/tok",
        ),
    ],
)
def test_usage_errors_exit_2_naming_the_setting(
    args: list[str],
    kube: dict[str, Any],
    named: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = tmp_path / "netmon.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path), "sweep": {"kubernetes": kube}}))
    code = main(["sweep", "--scheduler", "kubernetes", "--config", str(config), *args])
    error = capsys.readouterr().err
    assert code == 2 and named in error and len(error.strip().splitlines()) == 1, error


# The cluster the scheduler meets.


def node(name: str, gpus: int = 8, ready: bool = True, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
        "spec": spec,
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "96"},
            "addresses": [{"type": "InternalIP", "address": f"10.0.0.{len(name)}{name[-1]}"}],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(
    name: str,
    on: str,
    gpus: int = 0,
    owner: str = "ReplicaSet",
    labels: dict[str, str] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    meta |= {"labels": labels or {}, "ownerReferences": [{"kind": owner}]}
    return {
        "metadata": meta,
        "spec": {"nodeName": on, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": "Running", "podIP": f"192.168.1.{len(name)}"},
    }


DAEMON = {"app.kubernetes.io/name": "netmon", "app.kubernetes.io/component": "exporter"}


NCCL_INFO = "gpu-7:4711:4790 [3] NCCL INFO Channel 07/0 : 3[3] -> 11[3] [send] via NET/IB/3/GDRDMA"


def measured(
    busbw: float = 4.8e10, exits: int = 0, preempted_pair: int | None = None, noise: int = 0
) -> Callable[[FakeCluster, dict[str, Any]], None]:
    """Kueue admits the JobSet; every pair's pods run to the end (index 0 on the pair's last
    node), but for `preempted_pair`, whose pod 0 a pod of a higher priority preempts. Each log
    starts with `noise` lines of NCCL_DEBUG=INFO."""

    def scenario(cluster: FakeCluster, created: dict[str, Any]) -> None:
        name = created["metadata"]["name"]
        cluster.admit(name)
        for pair, job, nodes in cluster.pair_pods(name):
            rails = int(env_of(job["template"]["spec"])["NETMON_SWEEP_RAILS"])
            placed = list(reversed(nodes))
            for index, where in enumerate(placed):
                if pair == preempted_pair and index == 0:
                    gone = {"type": "DisruptionTarget", "status": "True"}
                    gone["reason"] = "PreemptionByScheduler"
                    cluster.add_pod(name, job, index, where, "Failed", "", [gone])
                    continue
                log = "\n".join(
                    [NCCL_INFO] * noise + [rank_lines(placed, index, rails, busbw, exits)]
                )
                cluster.add_pod(name, job, index, where, "Succeeded", log)

    return scenario


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeCluster, KubernetesScheduler]]:
    fake = FakeCluster()
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    with serving(fake) as url:
        api = KubeApi(ApiTarget(url, token, None), timeout=5.0)
        yield fake, KubernetesScheduler(settings(), SWEEP, api, poll_s=0.05)


def gets(fake: FakeCluster, path: str) -> int:
    return sum(1 for method, where, _ in fake.requests if method == "GET" and where == path)


def test_idle_nodes_hold_no_gpu_and_are_ready_schedulable_and_tolerated(
    cluster: tuple[FakeCluster, KubernetesScheduler],
) -> None:
    fake, scheduler = cluster
    fake.nodes = [
        node("n1"),
        node("n2"),  # a job's pod holds a GPU
        node("n3", ready=False),
        node("n4", unschedulable=True),
        node("n5", taints=[{"key": "maintenance", "effect": "NoSchedule"}]),
        node("n6", taints=[{"key": "nvidia.com/gpu", "value": "x", "effect": "NoSchedule"}]),
        node("n7", gpus=4),
    ]
    fake.pods = [
        pod("train-0", "n2", gpus=1),
        pod("web", "n1"),  # no GPU: not a reason to skip the node
        pod("netmon-x", "n7", owner="DaemonSet", labels=DAEMON),
    ]
    scheduler.settings = settings(
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        node_selector={"nvidia.com/gpu.present": "true"},
    )
    found = {n.name: n for n in scheduler.nodes("ignored", None)}
    assert sorted(found) == ["n1", "n6", "n7"] and scheduler.backend == "nccl"
    assert found["n7"].rails == 4 and found["n1"].rails == 8
    # A node's report goes to its daemon's pod, else to the node's InternalIP.
    assert scheduler.addresses["n7"] == "192.168.1.8" and scheduler.addresses["n1"] == "10.0.0.21"
    # Pages of at most 2 (the server's choice): 4 of nodes and 2 of pods, never one per node.
    assert gets(fake, "/api/v1/nodes") == 4 and gets(fake, "/api/v1/pods") == 2
    lists = [q for m, p, q in fake.requests if m == "GET" and not p.endswith("/log")]
    assert all(q["limit"] == "500" for q in lists)
    assert [q.get("continue") for q in lists[:4]] == [None, "2", "4", "6"]
    fake.pods.append(pod("train-1", "n6", gpus=8))
    assert scheduler.taken(["n1", "n6", "n7"]) == {"n6"}
    assert [n.name for n in scheduler.nodes("", "n1,n3")] == ["n1"]


def test_without_gpus_any_pod_but_a_daemonsets_takes_a_node(
    cluster: tuple[FakeCluster, KubernetesScheduler],
) -> None:
    fake, scheduler = cluster
    fake.nodes = [node("c1", gpus=0), node("c2", gpus=0), node("c3", gpus=0)]
    fake.pods = [pod("batch", "c2"), pod("fluentbit", "c3", owner="DaemonSet")]
    assert [n.name for n in scheduler.nodes("", None)] == ["c1", "c3"]
    assert scheduler.backend == "gloo"
    # The sweep's own pod (the CronJob's Job's) on c1 makes no node busy, on gloo nodes too.
    fake.pods.append(pod("netmon-sweep-29170000-x7k2p", "c1", owner="Job", namespace="netmon"))
    assert [n.name for n in scheduler.nodes("", None)] == ["c3"]
    scheduler.own = PodRef("netmon", "netmon-sweep-29170000-x7k2p")
    assert [n.name for n in scheduler.nodes("", None)] == ["c1", "c3"]
    scheduler.own = PodRef("", "", "uid-netmon-sweep-29170000-x7k2p")  # by the downward API's uid
    assert [n.name for n in scheduler.nodes("", None)] == ["c1", "c3"]


def run(scheduler: KubernetesScheduler, pairs: list[PairPlan]) -> list[Any]:
    return scheduler.run_round(pairs, time.time() + 60)


ROUND = [PairPlan(("a", "b"), 1, 2), PairPlan(("c", "d"), 1, 2), PairPlan(("e", "f", "g"), 1, 2)]


def test_a_round_is_one_jobset_whose_logs_become_busbw_per_rail(
    cluster: tuple[FakeCluster, KubernetesScheduler],
) -> None:
    fake, scheduler = cluster
    fake.scenario = measured(busbw=4.8e10)
    fake.garbage = ["/api/v1/namespaces/netmon/pods"]  # garbled while the round runs: asked again
    scheduler.backend = "nccl"
    runs = run(scheduler, ROUND)
    posts = [r for r in fake.requests if r[0] == "POST"]
    assert len(posts) == 1 and len(fake.created) == 1  # one per round, never one per pair
    assert [r.outcome for r in runs] == ["ok", "ok", "ok"], [r.detail for r in runs]
    assert [r.busbw for r in runs] == [(4.8e10, 4.8e10 + 1)] * 3 and fake.garbage == []
    assert {r.job for r in runs} == {fake.created[0]["metadata"]["name"]}
    ((deleted, options),) = fake.deletions
    assert deleted == fake.created[0]["metadata"]["name"] and fake.jobsets == {}
    assert options["propagationPolicy"] == "Background"


def test_more_pairs_than_a_workload_holds_make_more_jobsets(
    cluster: tuple[FakeCluster, KubernetesScheduler],
) -> None:
    fake, scheduler = cluster
    fake.scenario = measured()
    scheduler.settings = settings(max_pairs_per_jobset=2)
    runs = run(scheduler, ROUND)
    assert len(fake.created) == 2 and [r.outcome for r in runs] == ["ok"] * 3
    assert [len(c["spec"]["replicatedJobs"]) for c in fake.created] == [2, 1]


def test_preempted_pairs_are_preempted_never_judged(
    cluster: tuple[FakeCluster, KubernetesScheduler],
) -> None:
    fake, scheduler = cluster
    fake.scenario = measured(preempted_pair=1)
    runs = run(scheduler, ROUND)
    assert [r.outcome for r in runs] == ["ok", "preempted", "ok"]
    assert "PreemptionByScheduler" in runs[1].detail and runs[1].busbw == ()

    def evicted(cluster: FakeCluster, created: dict[str, Any]) -> None:
        name = created["metadata"]["name"]
        cluster.admit(name)
        for _, job, nodes in cluster.pair_pods(name):
            for index, where in enumerate(nodes):
                cluster.add_pod(name, job, index, where, "Running")
        cluster.evict(name, "Preempted", "Preempted to accommodate a workload")

    fake.scenario = evicted
    fake.kueue_versions = ("v1beta1",)  # an older Kueue: the scheduler finds the version it has
    runs = run(scheduler, [PairPlan(("a", "b"), 2, 2), PairPlan(("c", "d"), 2, 2)])
    assert [r.outcome for r in runs] == ["preempted", "preempted"]
    assert "Kueue preempted" in runs[0].detail


def test_not_admitted_in_time_is_busy_and_a_busy_gpu_is_busy(
    cluster: tuple[FakeCluster, KubernetesScheduler],
) -> None:
    fake, scheduler = cluster
    scheduler.settings = settings().model_copy(update={"pair_timeout": 0.5})
    message = "couldn't assign flavors to pod set p0: insufficient quota for nvidia.com/gpu"
    fake.scenario = lambda cluster, created: cluster.wait_for_quota(
        created["metadata"]["name"], message
    )
    runs = run(scheduler, ROUND[:1])
    assert runs[0].outcome == "busy" and "insufficient quota" in runs[0].detail
    assert len(fake.deletions) == 1  # deleted, admitted or not
    fake.scenario = measured(exits=75)
    assert run(scheduler, ROUND[:1])[0].outcome == "busy"


def test_a_confirming_pair_may_take_its_repeats_times_the_pair_timeout(
    cluster: tuple[FakeCluster, KubernetesScheduler],
) -> None:
    fake, scheduler = cluster
    scheduler.settings = settings().model_copy(update={"pair_timeout": 0.3})
    fake.scenario = lambda cluster, created: None  # never admitted: it waits to its deadline
    started = time.monotonic()
    (waited,) = run(scheduler, [PairPlan(("a", "b"), 2, 2, "locate", repeats=3)])
    assert waited.outcome == "busy" and time.monotonic() - started >= 0.85


def test_other_sweeps_block_and_left_overs_are_deleted_and_cleanup_ends_ours(
    cluster: tuple[FakeCluster, KubernetesScheduler],
) -> None:
    fake, scheduler = cluster
    now = time.time()
    for name, sweep, deadline in [
        ("other", "1795650000000-aaaaaa", now + 100),
        ("stale", "x", 1.0),
    ]:
        fake.jobsets[name] = {
            "metadata": {
                "name": name,
                "uid": name,
                "labels": {km.LABEL_SWEEP: sweep},
                "annotations": {km.ANNOTATION_DEADLINE: f"{deadline:.0f}"},
            },
            "spec": {"suspend": True},
        }
    assert scheduler.other_sweeps() == ["JobSet other"]
    assert [name for name, _ in fake.deletions] == ["stale"]
    fake.scenario = lambda cluster, created: None  # never admitted
    scheduler.settings = settings().model_copy(update={"pair_timeout": 0.2})
    run(scheduler, ROUND[:1])
    fake.jobsets[km.jobset_name("netmon-sweep", SWEEP, 3, 0)] = {
        "metadata": {
            "name": km.jobset_name("netmon-sweep", SWEEP, 3, 0),
            "labels": {km.LABEL_SWEEP: SWEEP},
        },
        "spec": {},
    }
    scheduler.cleanup()
    assert set(fake.jobsets) == {"other"}


def test_a_whole_sweep_through_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeCluster(scenario=measured())
    fake.nodes = [node(f"gpu{i}") for i in range(4)]
    with serving(fake) as url:
        config = sweep_config(tmp_path, url)
        code = main(["sweep", "--json", "--config", str(config), "--seed", "1"])
        report = json.loads(capsys.readouterr().out)
        assert code == 0 and report["suspects"] == [] and len(report["pairs"]) == 2
        assert {p["outcome"] for p in report["pairs"]} == {"pass"}
        # One pair per JobSet (one Workload: Kueue evicts a whole Workload at once).
        assert report["partition"] == "all nodes" and len(fake.created) == 2
        fake.garbage = ["/api/v1/nodes"]  # garbled at the start: the sweep cannot run
        code = main(["sweep", "--json", "--config", str(config), "--seed", "1"])
    captured = capsys.readouterr()
    assert code == 3 and "the answer is not JSON" in json.loads(captured.out)["error"]
    assert "could not run" in captured.err and "Traceback" not in captured.err


def test_the_nodes_topology_labels_are_the_fabrics_groups(
    cluster: tuple[FakeCluster, KubernetesScheduler],
) -> None:
    """GKE's sub-block label groups the nodes (the first of sweep.kubernetes.topology_labels a
    node has); round 1 stays inside them. One node without a label: no fabric is claimed."""
    fake, scheduler = cluster
    layer = "cloud.google.com/gce-topology-subblock"
    fake.nodes = [node(f"gpu{i}") for i in range(8)]
    for i, found in enumerate(fake.nodes):
        found["metadata"]["labels"][layer] = f"sb{i // 4}"
    nodes = scheduler.nodes("", None)
    text = scheduler.topology()
    assert text is not None
    fabric = parse_topology(text, rails=8)
    assert fabric.leaf("gpu0", 3) == fabric.leaf("gpu3", 3) != fabric.leaf("gpu4", 3)
    loc = Localiser(nodes, Rules(), BaselineBook(BaselinePolicy()), random.Random(1), fabric=fabric)
    assert all(not fabric.crosses(p.nodes, 0) for p in loc.next_round())
    del fake.nodes[5]["metadata"]["labels"][layer]
    scheduler.nodes("", None)
    assert scheduler.topology() is None


def test_a_cpu_only_node_runs_its_pair_on_gloo_and_the_gpu_pairs_on_nccl(
    cluster: tuple[FakeCluster, KubernetesScheduler],
) -> None:
    fake, scheduler = cluster
    fake.nodes = [node("gpu0"), node("gpu1"), node("cpu0", gpus=0), node("cpu1", gpus=0)]
    found = {n.name: n for n in scheduler.nodes("", None)}
    assert found["gpu0"].kind != found["cpu0"].kind == "cpu"
    assert scheduler._backend([(0, PairPlan(("gpu0", "gpu1"), 1, 8))]) == "nccl"
    assert scheduler._backend([(0, PairPlan(("cpu0", "cpu1"), 1, 1))]) == "gloo"


def test_gpu_pairs_without_rdma_refuse_unless_allowed(
    cluster: tuple[FakeCluster, KubernetesScheduler],
) -> None:
    fake, scheduler = cluster
    fake.nodes = [node(f"gpu{i}") for i in range(2)]
    scheduler.settings = settings(allow_without_rdma=False)
    with pytest.raises(UsageError, match=r"^sweep.kubernetes.rdma_resource: .*allow_without_rdma"):
        scheduler.nodes("", None)
    scheduler.settings = settings(allow_without_rdma=False, rdma_resource="rdma/ib")
    assert len(scheduler.nodes("", None)) == 2 and scheduler.backend == "nccl"


def test_every_api_failure_is_a_scheduler_error(
    cluster: tuple[FakeCluster, KubernetesScheduler], tmp_path: Path
) -> None:
    fake, scheduler = cluster
    fake.nodes = [node(f"n{i}") for i in range(5)]
    fake.garbage = ["/api/v1/nodes"]  # a proxy's error page, once
    with pytest.raises(SchedulerError, match=r"GET /api/v1/nodes: the answer is not JSON"):
        scheduler.nodes("", None)
    assert len(scheduler.nodes("", None)) == 5  # the next answer is JSON again, in 3 pages
    scheduler.api.max_answer = 300  # a page larger than that is refused, never cut
    with pytest.raises(SchedulerError, match=r"GET /api/v1/nodes: the answer passes 300 bytes"):
        scheduler.nodes("", None)
    scheduler.api.max_answer = 1 << 20
    fake.granted = PERMISSIONS - {("", "pods", "list", "cluster")}
    with pytest.raises(SchedulerError, match=r'HTTP 403: pods is forbidden: .* "pods"'):
        scheduler.nodes("", None)
    fake.granted = PERMISSIONS
    token = scheduler.api.target.token_file
    assert token is not None
    token.unlink()  # unreadable mid-sweep: the API cannot be asked, not a usage error
    with pytest.raises(SchedulerError, match=f"sweep.kubernetes.token_file: {token}: "):
        scheduler.nodes("", None)


def test_the_sweep_asks_exactly_what_the_chart_grants(
    cluster: tuple[FakeCluster, KubernetesScheduler],
) -> None:
    """Every call of a sweep, RBAC-checked by the server: together they use every permission
    in PERMISSIONS (tests/test_helm.py holds the chart's Role and ClusterRole equal to it)."""
    fake, scheduler = cluster
    fake.nodes = [node(f"n{i}") for i in range(4)]
    assert len(scheduler.nodes("", None)) == 4 and scheduler.other_sweeps() == []
    fake.scenario = measured()
    assert [r.outcome for r in run(scheduler, ROUND[:1])] == ["ok"]
    fake.scenario = lambda cluster, created: None  # suspended: its Workload is asked for
    scheduler.settings = settings().model_copy(update={"pair_timeout": 0.3})
    run(scheduler, ROUND[:1])
    scheduler.cleanup()
    assert fake.used == PERMISSIONS
    assert all(q == {"fieldValidation": "Strict"} for m, _, q in fake.requests if m == "POST")


def test_an_unknown_field_is_refused_not_dropped(
    cluster: tuple[FakeCluster, KubernetesScheduler],
) -> None:
    fake, scheduler = cluster
    name = km.jobset_name("netmon-sweep", SWEEP, 1, 0)
    part = km.RoundPart(name, SWEEP, 1, ((0, ROUND[0]),), time.time() + 60, "gloo")
    manifest = km.build_jobset(part, scheduler.settings, "netmon", time.time())
    manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["completionMod"] = "Indexed"
    with pytest.raises(SchedulerError, match=r"HTTP 422: JobSet is invalid: .*completionMod"):
        scheduler.api.create(scheduler._jobsets(), manifest)
    assert fake.jobsets == {}


def test_a_long_ncclDebug_log_keeps_its_report(
    cluster: tuple[FakeCluster, KubernetesScheduler],
) -> None:
    fake, scheduler = cluster
    fake.scenario = measured(noise=40_000)  # 3.4 MB a pod; the report is at the end
    runs = run(scheduler, ROUND[:2])
    assert [r.outcome for r in runs] == ["ok", "ok"], [r.detail for r in runs]
    logs = [q for m, p, q in fake.requests if p.endswith("/log")]
    assert logs and all(q == {"container": "rank", "tailLines": str(LOG_TAIL_LINES)} for q in logs)


def test_a_jobset_kueue_never_took_names_the_queue_and_priority_class(
    cluster: tuple[FakeCluster, KubernetesScheduler],
) -> None:
    """No Workload at the deadline: no LocalQueue or WorkloadPriorityClass of that name, or a
    namespace Kueue does not manage; or no Kueue at all."""
    fake, scheduler = cluster
    fake.scenario = lambda cluster, created: None
    scheduler.settings = settings(queue="gpu-idle", priority_class="lowest").model_copy(
        update={"pair_timeout": 0.3}
    )
    (skipped,) = run(scheduler, ROUND[:1])
    assert skipped.outcome == "busy" and "Kueue made no Workload for JobSet" in skipped.detail
    assert "LocalQueue gpu-idle (sweep.kubernetes.queue)" in skipped.detail
    assert "WorkloadPriorityClass lowest (sweep.kubernetes.priority_class)" in skipped.detail
    fake.kueue_versions = ()
    scheduler._kueue_version = None
    (skipped,) = run(scheduler, ROUND[:1])
    assert "serves no Kueue Workloads" in skipped.detail, skipped.detail


def sweep_config(tmp_path: Path, url: str, **sweep: Any) -> Path:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    kube = {
        "image": "netmon:0.1.0",
        "api_server": url,
        "token_file": str(token),
        "pod_priority_class": "netmon-sweep-pods",
        "allow_without_rdma": True,
    }
    config = tmp_path / "netmon.yaml"
    sweep = {"scheduler": "kubernetes", "kubernetes": kube, **sweep}
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path), "sweep": sweep}))
    return config


def test_sigterm_ends_the_sweep_with_its_jobsets_deleted(tmp_path: Path) -> None:
    """The CronJob's activeDeadlineSeconds: the Job controller deletes the pod, whose process
    gets SIGTERM; the sweep deletes its JobSets before it exits."""

    def admitted_then_killed(cluster: FakeCluster, created: dict[str, Any]) -> None:
        cluster.admit(created["metadata"]["name"])  # running, never ending
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()

    fake = FakeCluster(scenario=admitted_then_killed, nodes=[node("gpu0"), node("gpu1")])
    before = signal.getsignal(signal.SIGTERM)
    with serving(fake) as url, pytest.raises(SystemExit) as exited:
        main(["sweep", "--config", str(sweep_config(tmp_path, url)), "--seed", "1"])
    assert signal.getsignal(signal.SIGTERM) is before  # the sweep's handler was put back
    assert exited.value.code == 128 + signal.SIGTERM
    assert len(fake.created) == 1 and fake.jobsets == {}
    assert [name for name, _ in fake.deletions] == [fake.created[0]["metadata"]["name"]]


def test_a_pairs_pods_run_their_ranks_and_report_where_they_ran(tmp_path: Path) -> None:
    """Two pods of a pair, as pod_ranks runs in each: gloo ranks on loopback, rendezvous at
    pod 0's name, rank = the pod's index, the node from the environment."""
    plan = PairPlan(("node-a", "node-b"), 1, 1)
    base = {
        **os.environ,
        "NETMON_SWEEP_NODES": "node-a=node-a,node-b=node-b",
        "NETMON_SWEEP_MASTER": "localhost",
        "NETMON_SWEEP_RAILS": "1",
        "NETMON_SWEEP_PORT": str(29500 + os.getpid() % 500),
        "NETMON_SWEEP_SIZE": "4096",
        "NETMON_SWEEP_WARMUP": "0",
        "NETMON_SWEEP_ITERS": "2",
        "NETMON_SWEEP_DEADLINE": f"{time.time() + 60:.3f}",
        "NETMON_SWEEP_BACKEND": "gloo",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    # Index 0 on node-b: the node that is index 0 is the scheduler's choice.
    pods = [
        subprocess.Popen(
            [sys.executable, "-m", "netmon.sweep.kube.pod_ranks"],
            env={**base, "JOB_COMPLETION_INDEX": str(index), "NETMON_SWEEP_NODE": where},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        for index, where in enumerate(["node-b", "node-a"])
    ]
    logs = [p.communicate(timeout=90)[0] for p in pods]
    assert [p.returncode for p in pods] == [0, 0]
    outcome, detail, found = judge_logs(plan, logs)
    assert outcome == "ok", (detail, logs)
    assert len(found.busbw) == 1 and found.busbw[0] > 0
    assert '"node": "node-b"' in logs[0]
