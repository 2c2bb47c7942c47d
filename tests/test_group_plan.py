"""The pure part of node groups: members, self, leader and a round's world, from literals; and the
transport a group declares, judged on a round's outcome before Results records it."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from netmon import baseline
from netmon.config import NetmonConfig, parse_config, resolve
from netmon.errors import ConfigError
from netmon.gpu.fabric import FabricReading
from netmon.gpu.nvml import NvmlUnavailable
from netmon.group.auth import Sealer
from netmon.group.keys import GroupKeys
from netmon.group.link import GroupLink
from netmon.group.members import (
    GroupConfig,
    World,
    identify_self,
    lay_out,
    leader_of,
    node_transport,
    round_transport,
)
from netmon.probe import crossnode, nccl_debug, transport_faults
from netmon.probe.build import Placement, build_spec
from netmon.probe.crossnode import INTENT_OF_TRANSPORT, transport_checked
from netmon.probe.spec import ProbeFailure, ProbeOutcome, ProbeSpec, SizeResult
from netmon.serve.coordinator import Coordinator
from netmon.serve.current import CurrentConfig
from netmon.serve.keeper import BaselineKeeper
from netmon.serve.readiness import DeviceLocks, Readiness
from netmon.serve.results import Results
from netmon.topology.model import Nic, Topology

A, B, C = "10.0.0.1:29400", "10.0.0.2:29400", "gpu-c:29400"


def config(**fields: Any) -> GroupConfig:
    return GroupConfig.model_validate(
        {"name": "rack-a", "members": [B, A, C], "secret_file": "/s", **fields}
    )


def test_each_members_ranks_follow_the_previous_members_in_member_order() -> None:
    world = lay_out([C, A, B], {A: 2, B: 1, C: 3})
    assert world.members == (A, B, C)
    assert world.ranks_of == {A: (0, 1), B: (2,), C: (3, 4, 5)}
    assert world.size == 6
    assert world.reporters == (0, 2, 3)  # one per member
    assert world.host == "10.0.0.1"  # rank 0's member


def test_rank_0_listens_on_the_address_its_member_reported() -> None:
    # gpu-c may resolve to 127.0.1.1 on its own node; the address it bound is what others use.
    world = lay_out([C, "zz:1"], {C: 1, "zz:1": 1}, {C: "192.168.1.7", "zz:1": "192.168.1.9"})
    assert world.host == "192.168.1.7"
    assert lay_out([C], {C: 1}, {C: ""}).host == "gpu-c"


def test_a_world_survives_its_json() -> None:
    world = lay_out([A, B], {A: 1, B: 2}, {A: "::1"})
    assert World.from_json(world.to_json()) == world


def test_the_lowest_named_reachable_member_leads() -> None:
    assert leader_of([C, B, A]) == A
    assert leader_of([]) is None


def test_self_is_the_member_whose_host_is_one_of_this_hosts_names() -> None:
    assert identify_self(config(), names=["gpu-c", "gpu-c.example"]) == C
    assert identify_self(config(self=B), names=["anything"]) == B
    with pytest.raises(ValueError, match=r"group\.self: cannot tell"):
        identify_self(config(), names=["elsewhere"])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"members": ["10.0.0.1"]}, "is not HOST:PORT"),
        ({"members": [A, A]}, "unique"),
        ({"members": ["10.0.0.1:70000"]}, "is not HOST:PORT"),
        ({"name": "Rack A"}, "lowercase"),
        ({"self": "10.9.9.9:1"}, "not one of the members"),
    ],
)
def test_bad_group_settings_say_what_is_wrong(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        config(**fields)


# --- the transport a group declares between nodes (docs/GROUPS.md, "The transport")


def node_config(tmp_path: Path, transport: str | None) -> NetmonConfig:
    group: dict[str, Any] = {"name": "rack-a", "members": [A, B], "secret_file": "/s"}
    if transport is not None:
        group["transport"] = transport
    document = {
        "backend": "nccl",
        "devices": ["0", "1"],
        "state_dir": str(tmp_path),
        "pause_file": str(tmp_path / "pause"),
        "pause_dir": str(tmp_path / "pause.d"),
        "group": group,
        "probes": [
            {"name": "small", "sizes": [8], "interval": "1m"},
            {"name": "cross", "scope": "group_one_gpu", "sizes": ["1M"], "interval": "15m"},
            {"name": "peers", "scope": "node_pairs", "sizes": ["1M"], "interval": "1h"},
        ],
    }
    return resolve(parse_config(document), gpus=2)


@pytest.mark.parametrize("transport", ["ib", "socket", "net", "any"])
def test_a_group_declares_the_network_between_its_nodes(transport: str) -> None:
    assert config(transport=transport).transport == transport
    assert config().transport == "any"  # configurations without it keep working


@pytest.mark.parametrize("value", ["rdma", "IB", "efa", "", ["ib"], 1])
def test_another_transport_is_refused_in_one_line_naming_the_field(value: object) -> None:
    group = {"name": "rack-a", "members": [A], "secret_file": "/s", "transport": value}
    document = {"group": group}
    with pytest.raises(ConfigError) as caught:
        parse_config(document)
    message = str(caught.value)
    assert message.startswith("config: group.transport: use ib ")
    assert "\n" not in message


def round_outcome(faults: tuple[str, ...], transports: tuple[str, ...]) -> ProbeOutcome:
    """A group round that completed, as the launcher returns it, with what NCCL's log showed."""
    spec = ProbeSpec(
        backend="nccl", ranks=2, devices=("0", "0"), sizes=(1 << 20,), path="group", intent="net_ib"
    )
    samples = [0.001, 0.0011, 0.0012]
    result = SizeResult.of_samples(spec, 1 << 20, 1 << 18, samples, [samples, samples], None)
    return ProbeOutcome(
        spec=spec,
        results=(result,),
        started_at=1.0,
        wall_s=2.0,
        transports=transports,
        transport_faults=faults,
    )


def test_a_round_on_sockets_where_ib_is_declared_fails_counted_and_learns_nothing(
    tmp_path: Path,
) -> None:
    config = node_config(tmp_path, "ib")
    book = baseline.BaselineBook(config.baseline)
    results = Results(CurrentConfig(config), BaselineKeeper(book))
    (probe,) = [p for p in config.probes or () if p.name == "cross"]

    outcome = transport_checked(round_outcome(("socket_where_ib_expected",), ("net_socket",)))
    assert outcome.failure is not None
    assert outcome.failure.reason == "transport_mismatch"
    assert "socket_where_ib_expected" in outcome.failure.describe()
    assert outcome.results, "the measurement is kept for the log, not exported"

    assert results.finished(probe, outcome, "group", export=True) == []
    snapshot = results.snapshot()
    assert snapshot.probes["cross"].failures == {"transport_mismatch": 1}
    assert snapshot.probes["cross"].last_success is None
    assert snapshot.series == ()
    assert book.verdicts() == {}
    assert snapshot.transport_faults[("cross", "group", "socket_where_ib_expected")] == 1

    # The same round on IB is a success that is exported and learned.
    fine = transport_checked(round_outcome((), ("net_ib", "p2p")))
    assert fine.ok
    results.finished(probe, fine, "group", export=True)
    assert [p.path for p in results.snapshot().series] == ["group"]
    assert len(book.verdicts()) == 1


def test_only_a_network_mismatch_fails_a_round() -> None:
    # A fault inside the node is counted as before but does not say the network was wrong.
    assert transport_checked(round_outcome(("p2p_disabled_on_nvlink",), ("net_ib",))).ok
    # No log to judge (gloo ranks, or NCCL_DEBUG set by the probe): nothing to fail on.
    assert transport_checked(round_outcome((), ("gloo",))).ok
    assert transport_checked(round_outcome((), ())).ok
    # A round that failed keeps its own failure.
    timeout = ProbeFailure(phase="measure", rank=1, cause="timeout", detail="x")
    failed = round_outcome(("no_net_between_nodes",), ("p2p",)).model_copy(
        update={"failure": timeout}
    )
    assert transport_checked(failed).failure == timeout


@pytest.mark.parametrize(
    ("transport", "intent"),
    [("ib", "net_ib"), ("socket", "net_socket"), ("net", "net"), ("any", "any")],
)
def test_a_rounds_spec_carries_the_groups_transport_as_its_intent(
    tmp_path: Path, transport: str, intent: str
) -> None:
    config = node_config(tmp_path, transport)
    assert config.group is not None
    (probe,) = [p for p in config.probes or () if p.name == "cross"]
    placement = Placement(
        devices=("0", "0"),
        ranks=2,
        host="10.0.0.1",
        reporters=(0, 1),
        local_ranks=(0,),
        label="group",
        intent=INTENT_OF_TRANSPORT[config.group.transport],
    )
    spec = build_spec(probe, config, placement=placement)
    assert (spec.intent, spec.path) == (intent, "group")


def test_the_declared_networks_reasons_start_at_zero_for_the_groups_probes(
    tmp_path: Path,
) -> None:
    ib = node_config(tmp_path, "ib")
    results = Results(CurrentConfig(ib), BaselineKeeper(baseline.BaselineBook(ib.baseline)))
    known = results.snapshot().transport_faults
    assert set(known.values()) == {0}
    across = {"socket_where_ib_expected", "plugin_where_ib_expected", "no_net_between_nodes"}
    assert {r for (p, path, r) in known if p == "cross"} == across
    assert {path for (p, path, _) in known if p == "cross"} == {"group"}
    assert {path for (p, path, _) in known if p == "peers"} == {"node_pair"}
    local = {r for (p, _, r) in known if p == "small"}
    assert local and not local & set(crossnode.NET_REASONS)
    unset = node_config(tmp_path, None)
    anything = Results(CurrentConfig(unset), BaselineKeeper(baseline.BaselineBook(unset.baseline)))
    assert {p for (p, _, _) in anything.snapshot().transport_faults} == {"small"}


# --- the transport a group's rounds are judged against when `transport` is unset: the node's


HGX = tuple(FabricReading(i, f"GPU-{i}", "completed", 0, 0, None) for i in range(8))
NVL72 = tuple(dataclasses.replace(r, cluster_uuid="ab" * 16) for r in HGX)


@pytest.mark.parametrize(
    ("fields", "backend", "rdma", "domain", "transport"),
    [
        # RDMA devices and no multi-node NVLink domain: a round NCCL put on sockets is flagged.
        ({}, "nccl", ["mlx5_0"], False, "net"),
        ({}, "nccl", [], False, "any"),  # no RDMA: sockets may be the network
        ({}, "nccl", ["mlx5_0"], True, "any"),  # NVLink may join the nodes (MNNVL)
        ({}, "nccl", ["mlx5_0"], None, "any"),  # NVML did not say
        ({}, "gloo", ["mlx5_0"], False, "any"),  # no NCCL log to judge
        ({}, None, ["mlx5_0"], False, "any"),  # gloo is the default backend
        # What the operator wrote wins, `any` included.
        ({"transport": "any"}, "nccl", ["mlx5_0"], False, "any"),
        ({"transport": "socket"}, "nccl", ["mlx5_0"], False, "socket"),
        ({"transport": "ib"}, "nccl", [], True, "ib"),
    ],
)
def test_an_unset_transport_is_what_the_node_shows(
    fields: dict[str, Any],
    backend: str | None,
    rdma: list[str],
    domain: bool | None,
    transport: str,
) -> None:
    assert round_transport(config(**fields), backend, rdma, domain)[0] == transport


def rdma_root(tmp_path: Path, *devices: str) -> Path:
    """A /sys/class/infiniband of these devices."""
    root = tmp_path / "infiniband"
    root.mkdir(exist_ok=True)
    for device in devices:
        (root / device).mkdir()
    return root


class FabricReads:
    """netmon.gpu.nvml_links.read_fabric as a node answers it (readings, or NVML's error),
    counted."""

    def __init__(self, answer: Sequence[FabricReading] | Exception) -> None:
        self.answer, self.calls = answer, 0

    def __call__(self) -> Sequence[FabricReading]:
        self.calls += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_the_node_shows_its_rdma_devices_and_nvlink_domain(tmp_path: Path) -> None:
    ib = rdma_root(tmp_path, "mlx5_0", "mlx5_1")
    unset = config()
    hgx = FabricReads(HGX)
    transport, why = node_transport(unset, "nccl", None, hgx, ib)
    assert (transport, hgx.calls) == ("net", 1)
    assert why == "RDMA devices on this node (mlx5_0, mlx5_1): sockets are a fallback"
    assert node_transport(unset, "nccl", None, FabricReads(NVL72), ib)[0] == "any"
    assert node_transport(unset, "nccl", None, FabricReads(()), ib)[0] == "any"
    assert (
        node_transport(unset, "nccl", None, FabricReads(NvmlUnavailable("no driver")), ib)[0]
        == "any"
    )
    # No RDMA device (no such directory): NVML is not even asked.
    nothing = FabricReads(HGX)
    assert node_transport(unset, "nccl", None, nothing, tmp_path / "absent")[0] == "any"
    assert nothing.calls == 0
    # A `topo -m` topology lists the node's RDMA NICs too.
    topo = Topology(gpus=(), nics=(Nic("NIC0", "mlx5_0"),))
    assert node_transport(unset, "nccl", topo, FabricReads(HGX), tmp_path / "absent")[0] == "net"
    # Configured, or gloo: nothing is read.
    untouched = FabricReads(HGX)
    assert node_transport(config(transport="socket"), "nccl", None, untouched, ib)[0] == "socket"
    assert node_transport(unset, "gloo", None, untouched, ib)[0] == "any"
    assert untouched.calls == 0


def coordinator(
    config: NetmonConfig, fabric: FabricReads, rdma: Path, keys: GroupKeys | None = None
) -> Coordinator:
    """A coordinator that is never started: its rounds' specs are built, nothing runs."""
    assert config.group is not None
    current = CurrentConfig(config)
    results = Results(current, BaselineKeeper(baseline.BaselineBook(config.baseline)))
    # No GPU is ever surveyed: the idle source is never asked.
    readiness = Readiness(current, DeviceLocks(), None, threading.Event())  # type: ignore[arg-type]
    link = GroupLink(29400, "10.0.0.1", A, secret=b"0123456789abcdef")  # never started
    sealer = Sealer(config.group.name, b"0123456789abcdef")
    return Coordinator(
        current,
        config.group,
        A,
        link,
        sealer,
        readiness,
        results,
        fabric=fabric,
        rdma=rdma,
        keys=keys,
    )


# One member's log of a 2-node round NCCL carried on TCP sockets: its quiet fallback when the
# RDMA devices cannot be opened (the formats of NCCL's src/init.cc and src/transport/net.cc).
SOCKETS_LOG = "\n".join(
    [
        "node-a:4100:4100 [0] NCCL INFO NCCL version 2.27.5+cuda12.9",
        "node-a:4100:4120 [0] NCCL INFO comm 0x55d0 rank 0 nRanks 2 nNodes 2 localRanks 1 "
        "localRank 0 MNNVL 0",
        "node-a:4100:4130 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0",
        "node-a:4100:4130 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    ]
)


@pytest.mark.parametrize(
    ("transport", "intent", "flagged"),
    [(None, "net", True), ("any", "any", False), ("ib", "net_ib", True)],
)
def test_a_round_on_sockets_from_an_rdma_node_fails_unless_the_group_allows_it(
    tmp_path: Path, transport: str | None, intent: str, flagged: bool
) -> None:
    config = node_config(tmp_path, transport)
    rounds = coordinator(config, FabricReads(HGX), rdma_root(tmp_path, "mlx5_0")).rounds
    (probe,) = [p for p in config.probes or () if p.name == "cross"]
    spec = rounds._group_spec(probe, config, lay_out([A, B], {A: 1, B: 1}), ["0", "0"])
    assert (spec.intent, spec.path) == (intent, "group")
    report = nccl_debug.parse(SOCKETS_LOG)
    ran = round_outcome(tuple(transport_faults.judge(report, spec.intent)), ("net_socket",))
    checked = transport_checked(ran.model_copy(update={"spec": spec}))
    assert (checked.failure is not None) is flagged
    if flagged:
        assert checked.failure is not None and checked.failure.reason == "transport_mismatch"


@pytest.mark.parametrize(
    ("transport", "domain", "channel", "env"),
    [
        ("net", True, True, {"NCCL_MNNVL_ENABLE": "0"}),  # the network is what is measured
        ("net_ib", None, False, {"NCCL_MNNVL_ENABLE": "0"}),
        ("any", True, False, {"NCCL_MNNVL_ENABLE": "0"}),  # NCCL would fail init (mnnvl.cc)
        ("any", True, True, {}),  # an NVL72 rack with its IMEX channel: NCCL's choice
        ("any", False, False, {}),
        ("any", None, False, {}),
    ],
)
def test_a_cross_node_round_asks_for_mnnvl_only_where_it_can_start(
    transport: str, domain: bool | None, channel: bool, env: dict[str, str]
) -> None:
    from netmon.group.members import mnnvl_env

    found, why = mnnvl_env(transport, domain, channel)  # type: ignore[arg-type]
    assert found == env and why


def test_an_imex_channel_is_a_channel_device_in_its_directory(tmp_path: Path) -> None:
    from netmon.group.members import imex_channel_present

    assert not imex_channel_present(tmp_path / "absent")
    assert not imex_channel_present(tmp_path)
    (tmp_path / "channel0").write_text("")
    assert imex_channel_present(tmp_path)


def test_an_nvl72_node_without_its_imex_channel_asks_for_the_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML's fabric reading on a simulated node whose GPUs share a multi-node NVLink domain (a
    cluster UUID), through the real reader: without an IMEX channel a round must not leave NCCL
    to try MNNVL, which fails the communicator at init."""
    from netmon.gpu.nvml_links import read_fabric
    from netmon.group.members import node_mnnvl_env
    from tests.gpu_node import dgx_h100

    node = dgx_h100(tmp_path)
    for gpu in node.document["gpus"]:
        gpu["cluster_uuid"] = "5f0c3a9e1b2d4c6e8f7a9b0c1d2e3f40"
    node.write()
    node.activate(monkeypatch)
    env, why = node_mnnvl_env("nccl", "any", read_fabric)
    assert env == {"NCCL_MNNVL_ENABLE": "0"} and "IMEX" in why, why
    monkeypatch.setattr("netmon.group.members.imex_channel_present", lambda: True)
    assert node_mnnvl_env("nccl", "any", read_fabric)[0] == {}
    for gpu in node.document["gpus"]:
        gpu.pop("cluster_uuid")
    node.write()
    monkeypatch.setattr("netmon.group.members.imex_channel_present", lambda: False)
    assert node_mnnvl_env("nccl", "any", read_fabric)[0] == {}  # a single-node fabric
