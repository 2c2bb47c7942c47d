"""Sweeps on Kubernetes, the pure parts: the JobSets a round makes, checked against the JobSet
CRD's schema (tests/fixtures/crds) and JobSet's own limits on names; the settings; how a pair is
decided from what its pods show; which nodes are busy. The scheduler against an API server is
tests/test_sweep_kube.py."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from netmon.config import parse_config
from netmon.errors import UsageError
from netmon.serve.sweep_inbox import node_names
from netmon.sweep.kube import manifests as km
from netmon.sweep.kube.result import BUSY_AFTER_S, PairWatch, judge_logs
from netmon.sweep.kube.scheduler import own_pod
from netmon.sweep.kube.settings import Toleration
from netmon.sweep.kube.state import PodRef, PodView, occupied, tolerated
from netmon.sweep.locate.plan import PairPlan
from netmon.sweep.runner import new_sweep_id
from netmon.sweep.settings import SweepConfig
from tests import crd_schema

SWEEP = "1795650296539-964aea"


def settings(**kube: Any) -> SweepConfig:
    base = {
        "image": "r.example/netmon:0.1.0",
        "config_map": "netmon",
        "pod_priority_class": "netmon-sweep-pods",
        "allow_without_rdma": True,
        "max_pairs_per_jobset": 8,
    }
    return SweepConfig(scheduler="kubernetes", kubernetes={**base, **kube})


def jobset(pairs: list[PairPlan], backend: str = "nccl", **kube: Any) -> dict[str, Any]:
    name = km.jobset_name("netmon-sweep", SWEEP, pairs[0].round, 0)
    part = km.RoundPart(name, SWEEP, pairs[0].round, tuple(enumerate(pairs)), 2e9, backend)
    return km.build_jobset(part, settings(**kube), "netmon", now=2e9 - 300)


def pod_template(document: dict[str, Any], index: int) -> dict[str, Any]:
    spec: dict[str, Any] = document["spec"]["replicatedJobs"][index]["template"]["spec"]
    return spec


def env_of(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def rank_lines(nodes: list[str], index: int, rails: int, busbw: float, exits: int = 0) -> str:
    """A pod's log as netmon.sweep.kube.pod_ranks and netmon.sweep.ranks.rank write it."""
    lines = []
    if index == 0 and exits == 0:
        for rail in range(rails):
            report = {"rail": rail, "busbw": busbw + rail, "times": [0.01], "started_at": 1.0}
            lines.append("NETMON-SWEEP " + json.dumps({**report, "node": nodes[index]}))
    end = {"node": nodes[index], "index": index, "exits": [exits] * rails}
    return "\n".join([*lines, "NETMON-SWEEP-POD " + json.dumps(end)])


PAIR, TRIO = PairPlan(("a", "b"), 1, 8), PairPlan(("c", "d", "e"), 1, 8)


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_a_rounds_jobset_validates_against_the_jobset_crd(backend: str) -> None:
    rails = 8 if backend == "nccl" else 1
    pairs = [PairPlan(("a", "b"), 1, rails), PairPlan(("c", "d", "e"), 1, rails)]
    document = jobset(pairs, backend)
    assert crd_schema.errors(document) == []
    meta, spec = document["metadata"], document["spec"]
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "netmon-sweep"
    assert meta["labels"]["kueue.x-k8s.io/priority-class"] == "netmon-sweep"
    assert meta["labels"][km.LABEL_SWEEP] == SWEEP and meta["labels"][km.LABEL_ROUND] == "1"
    assert spec["failurePolicy"] == {"maxRestarts": 0} and spec["suspend"] is True
    assert spec["network"]["enableDNSHostnames"] is True
    assert spec["network"]["subdomain"] == meta["name"] and spec["ttlSecondsAfterFinished"] > 0
    assert [job["name"] for job in spec["replicatedJobs"]] == ["p0", "p1"]
    for index, plan in enumerate(pairs):
        template = pod_template(document, index)
        pods = template["template"]["spec"]
        assert template["parallelism"] == template["completions"] == len(plan.nodes)
        assert template["completionMode"] == "Indexed" and template["backoffLimit"] == 0
        assert template["activeDeadlineSeconds"] == 300 + km.ACTIVE_GRACE_S
        assert pods["restartPolicy"] == "Never" and "imagePullSecrets" not in pods
        required = pods["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        (term,) = required["nodeSelectorTerms"]
        assert term["matchFields"][0]["values"] == list(plan.nodes)
        (apart,) = pods["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert apart["topologyKey"] == "kubernetes.io/hostname"
        labels = template["template"]["metadata"]["labels"]
        assert apart["labelSelector"]["matchLabels"].items() <= labels.items()
        assert labels[km.LABEL_PAIR] == str(index)
        env = env_of(template)
        # JobSet's pod hostname: <jobset>-<replicatedJob>-<job index>-<pod index>, under the
        # headless service named by the subdomain.
        assert env["NETMON_SWEEP_MASTER"] == f"{meta['name']}-p{index}-0-0.{meta['name']}"
        assert env["NETMON_SWEEP_NODE"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert env["NETMON_SWEEP_RAILS"] == str(rails)
        assert env["NETMON_SWEEP_ITERS"] == "10"
        (container,) = pods["containers"]
        limits = container["resources"]["limits"]
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert "runAsUser" not in container["securityContext"]
        if backend == "nccl":
            assert limits["nvidia.com/gpu"] == "8" and "NVIDIA_VISIBLE_DEVICES" not in env
        else:
            assert "nvidia.com/gpu" not in limits and env["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_a_confirming_pair_measures_repeats_times_longer() -> None:
    confirm = PairPlan(("a", "b"), 2, 8, purpose="locate", repeats=3)
    document = jobset([PAIR, confirm])
    assert env_of(pod_template(document, 0))["NETMON_SWEEP_ITERS"] == "10"
    assert env_of(pod_template(document, 1))["NETMON_SWEEP_ITERS"] == str(10 * 3)


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_private_registries_and_rdma_reach_the_pods(backend: str) -> None:
    kube = {
        "image_pull_secrets": ["regcred", "mirror.example"],
        "rdma_resource": "rdma/hca_shared_devices_a",
        "ipc_lock": True,
    }
    document = jobset([PAIR], backend, **kube)
    assert crd_schema.errors(document) == []
    pods = pod_template(document, 0)["template"]["spec"]
    assert pods["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror.example"}]
    (container,) = pods["containers"]
    limits = container["resources"]["limits"]
    # One RDMA unit per pod, with the GPUs: gloo ranks use TCP whatever the node has.
    assert limits.get("rdma/hca_shared_devices_a") == ("1" if backend == "nccl" else None)
    security = container["securityContext"]
    # IPC_LOCK survives the ranks' exec only for root; nothing else is added back.
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert security["runAsUser"] == 0 and security["runAsNonRoot"] is False
    assert security["allowPrivilegeEscalation"] is False
    with pytest.raises(ValidationError):
        settings(rdma_resource="not a resource")
    with pytest.raises(ValidationError):
        settings(image_pull_secrets=["Not_A_Name"])


def test_validation_refuses_a_mutated_jobset() -> None:
    good = jobset([PAIR])
    assert crd_schema.errors(good) == []
    mutations: list[Callable[[dict[str, Any]], None]] = [
        lambda d: pod_template(d, 0).update(completionMod="Indexed"),  # unknown field
        lambda d: pod_template(d, 0).update(parallelism="two"),  # wrong type
        lambda d: d["spec"].update(ttlSecondsAfterFinished=-1),  # under the minimum
        lambda d: d["spec"]["successPolicy"].update(operator="Most"),  # not in the enum
        lambda d: d["metadata"]["labels"].update({km.LABEL_SWEEP: "not a label value!"}),
        lambda d: d["metadata"].update(name="Upper_Case"),
    ]
    for mutate in mutations:
        bad = copy.deepcopy(good)
        mutate(bad)
        assert crd_schema.errors(bad), bad
    # Without strict field validation the API server prunes an unknown field: no error.
    unknown = copy.deepcopy(good)
    mutations[0](unknown)
    assert crd_schema.errors(unknown, strict=False) == []


DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def test_names_stay_within_what_jobset_takes_at_4096_nodes() -> None:
    """The worst case: 4,096 nodes are 2,048 pairs in a round, numbered across it (p0 to
    p2047), one JobSet each at max_pairs_per_jobset 1 (parts 0 to 2047), in the last round
    (max_rounds is at most 10), a trio's last pod index 2. JobSet's webhook refuses a JobSet
    whose name (also its subdomain and headless service), longest Job name
    (<jobset>-<replicatedJob>-<job index>) or longest pod name (that, -<pod index>-<5 random>)
    is not a DNS-1035 label of at most 63 characters."""
    with pytest.raises(ValidationError):
        SweepConfig(max_rounds=11)
    assert len(new_sweep_id(now=9_999_999_999.999)) == len(new_sweep_id()) == len(SWEEP)
    pairs, last_round = 4096 // 2, 10
    trio = PairPlan(("n4093", "n4094", "n4095"), last_round, 8)
    longest = 0
    prefixes = ("netmon-sweep", "netmon_sweep_cluster_a", "A_very.LONG_job_name-x", "9", "___")
    for prefix in prefixes:
        name = km.jobset_name(prefix, SWEEP, last_round, pairs - 1)
        part = km.RoundPart(name, SWEEP, last_round, ((pairs - 1, trio),), 2e9, "nccl")
        document = km.build_jobset(part, settings(max_pairs_per_jobset=1), "netmon", 2e9 - 300)
        assert crd_schema.errors(document) == []
        spec = document["spec"]
        assert spec["network"]["subdomain"] == name and DNS_1035.match(name), name
        for job in spec["replicatedJobs"]:
            assert job["name"] == "p2047"
            job_name = f"{name}-{job['name']}-{job['replicas'] - 1}"
            pod_name = f"{job_name}-{job['template']['spec']['completions'] - 1}-abcde"
            for generated in (name, job_name, pod_name):
                assert len(generated) <= 63 and DNS_1035.match(generated), generated
            longest = max(longest, len(pod_name))
    # netmon-sweep-clu-1795650296539-964aea-r10-2047-p2047-0-2-abcde: a prefix of PREFIX_MAX.
    assert longest == 62


def test_a_round_is_split_only_where_kueue_needs_it() -> None:
    pairs = [PairPlan((f"n{2 * i}", f"n{2 * i + 1}"), 1, 1) for i in range(19)]
    parts = km.split_round(pairs, 8)
    assert [len(part) for part in parts] == [8, 8, 3]
    assert [index for part in parts for index, _ in part] == list(range(19))


def test_the_settings_name_what_is_wrong() -> None:
    with pytest.raises(UsageError, match=r"sweep\.kubernetes\.bogus: unknown setting"):
        parse_config({"sweep": {"kubernetes": {"bogus": 1}}})
    with pytest.raises(UsageError, match=r"sweep\.kubernetes\.queue"):
        parse_config({"sweep": {"kubernetes": {"queue": "Not A Name"}}})
    with pytest.raises(UsageError, match=r"sweep\.scheduler"):
        parse_config({"sweep": {"scheduler": "pbs"}})
    config = parse_config({"sweep": {"scheduler": "kubernetes"}}).sweep
    assert config is not None and config.kubernetes.max_pairs_per_jobset == 1  # per Workload
    # The bearer token crosses the network in clear over http: only to this machine.
    for server in ("http://10.0.0.1:6443", "http://api.example:80", "http://127.0.0.1.nip.io"):
        with pytest.raises(UsageError, match=r"^[^\n]*sweep\.kubernetes\.api_server: use https"):
            parse_config({"sweep": {"kubernetes": {"api_server": server}}})
    for server in ("https://10.0.0.1:6443", "http://127.0.0.1:8001", "http://[::1]:1"):
        kube = parse_config({"sweep": {"kubernetes": {"api_server": server}}}).sweep
        assert kube is not None and kube.kubernetes.api_server == server
    assert parse_config({"sweep": {"kubernetes": {"api_server": "http://localhost:8001"}}})


def view(name: str, index: int, **fields: Any) -> PodView:
    base: dict[str, Any] = {"pair": 0, "node": None, "phase": "Pending", "disruption": None}
    base |= {"unschedulable": None, "waiting": None}
    return PodView(name=name, index=index, **{**base, **fields})


def test_a_pair_is_decided_from_what_its_pods_show() -> None:
    plan = PairPlan(("a", "b"), 1, 1)
    watch = PairWatch(0, plan, "js", 0.0)
    stuck = view("p0", 0, unschedulable="0/2 nodes are available: 1 Insufficient nvidia.com/gpu")
    for now in (0.0, BUSY_AFTER_S - 1):
        watch.observe([stuck, view("p1", 1, node="a", phase="Running")], now)
        assert watch.decided is None
    watch.observe([stuck, view("p1", 1, node="a", phase="Running")], BUSY_AFTER_S + 1)
    assert watch.decided is not None and watch.decided[0] == "busy"
    # Pods that ran somewhere else than the pair's nodes measured something else.
    outcome, detail, _ = judge_logs(
        plan, [rank_lines(["a", "c"], 0, 1, 1e9), rank_lines(["a", "c"], 1, 1, 1e9)]
    )
    assert outcome == "error" and "not the pair's nodes" in detail
    # A rail whose NCCL log showed TCP sockets measured another network: never judged.
    fell_back = rank_lines(["a", "b"], 0, 1, 1e9).replace(
        '"started_at": 1.0', '"started_at": 1.0, "transport_faults": ["socket_where_ib_expected"]'
    )
    outcome, detail, _ = judge_logs(plan, [fell_back, rank_lines(["a", "b"], 1, 1, 1e9)])
    assert outcome == "transport_mismatch" and "socket_where_ib_expected" in detail
    # At the deadline: a container that cannot start is an error, a pod running a timeout.
    late = PairWatch(0, plan, "js", 0.0)
    late.observe([view("p0", 0, node="a", waiting="ImagePullBackOff: back-off pulling")], 1.0)
    late.expire(True, "", 2.0)
    assert late.decided == ("error", "ImagePullBackOff: back-off pulling")
    running = PairWatch(0, plan, "js", 0.0)
    running.observe([view("p0", 0, node="a", phase="Running")], 1.0)
    running.expire(True, "", 2.0)
    assert running.decided is not None and running.decided[0] == "timeout"


def test_tolerations_match_taints_as_the_kube_scheduler_does() -> None:
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    assert tolerated(taint, [Toleration(key="nvidia.com/gpu", operator="Exists")])
    assert tolerated(taint, [Toleration(key="nvidia.com/gpu", value="present")])
    assert not tolerated(taint, [Toleration(key="nvidia.com/gpu", value="absent")])
    assert not tolerated(
        taint, [Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoExecute")]
    )
    assert tolerated(taint, [Toleration(operator="Exists")])  # an empty key: every taint
    assert not tolerated({"key": "other", "effect": "NoSchedule"}, [])


def test_the_sweeps_own_pod_is_known_and_makes_no_node_busy(tmp_path: Path) -> None:
    chart = {
        "NETMON_SWEEP_POD_NAME": "netmon-sweep-29170000-x7k2p",
        "NETMON_SWEEP_POD_NAMESPACE": "netmon",
        "NETMON_SWEEP_POD_UID": "0b6c1d2e",
        "HOSTNAME": "netmon-sweep-29170000-x7k2p",
    }
    absent = tmp_path / "absent"
    assert own_pod(chart, absent) == PodRef("netmon", "netmon-sweep-29170000-x7k2p", "0b6c1d2e")
    namespace = tmp_path / "namespace"
    namespace.write_text("ops\n")  # the service account's namespace file
    assert own_pod({"HOSTNAME": "sweeper-abc"}, namespace) == PodRef("ops", "sweeper-abc")
    assert own_pod({"HOSTNAME": "laptop"}, absent) is None  # not in a pod
    me: dict[str, Any] = {
        "metadata": {"name": "sweeper-abc", "namespace": "ops", "uid": "u1"},
        "spec": {"nodeName": "c1", "containers": [{"name": "sweep"}]},
        "status": {"phase": "Running"},
    }
    namesake = copy.deepcopy(me)
    namesake["metadata"] |= {"namespace": "other", "uid": "u2"}
    namesake["spec"]["nodeName"] = "c2"
    assert occupied([me, namesake], "nvidia.com/gpu", False, SWEEP) == {"c1", "c2"}
    mine = own_pod({"HOSTNAME": "sweeper-abc"}, namespace)
    assert occupied([me, namesake], "nvidia.com/gpu", False, SWEEP, mine) == {"c2"}
    by_uid = PodRef("", "", "u1")
    assert occupied([me, namesake], "nvidia.com/gpu", False, SWEEP, by_uid) == {"c2"}


def test_a_daemon_in_a_pod_takes_reports_for_its_node() -> None:
    assert node_names("netmon-7xk2p", {"NODE_NAME": "gpu-017"}) == ("netmon-7xk2p", "gpu-017")
    assert node_names("gpu01.example", {}) == ("gpu01", "gpu01.example")
