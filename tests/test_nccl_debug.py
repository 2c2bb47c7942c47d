"""netmon.probe.nccl_debug against published NCCL_DEBUG=INFO logs (tests/fixtures/nccl_info_*, see
tests/fixtures/SOURCES.md) and literal lines in the formats of NCCL's source (src/debug.cc,
src/transport/{p2p,shm,net,nvls}.cc, src/graph/paths.cc)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from netmon.group.members import TRANSPORTS
from netmon.probe import crossnode, debugenv
from netmon.probe import nccl_debug as nd
from netmon.probe import transport_faults as tf
from netmon.probe.launcher import Launcher
from netmon.probe.spec import ProbeSpec

FIXTURES = Path(__file__).parent / "fixtures"


def load(name: str) -> nd.TransportReport:
    return nd.parse((FIXTURES / name).read_text())


@pytest.fixture(scope="module")
def p5() -> nd.TransportReport:
    return load("nccl_info_2node_p5_16xH100_efa_nvls.txt")


def test_p5_version_comm_and_nvls(p5: nd.TransportReport) -> None:
    assert p5.nccl_version == "2.22.3+cuda12.2"
    assert p5.version_tuple == (2, 22, 3)
    assert p5.connects_lazily is True
    assert len(p5.comms) == 16
    assert {(c.n_ranks, c.n_nodes, c.local_ranks, c.mnnvl) for c in p5.comms} == {(16, 2, 8, False)}
    assert sorted(c.rank for c in p5.comms) == list(range(16))
    assert p5.n_ranks == 16
    assert p5.n_nodes == 2
    assert p5.nvls_available is True
    assert p5.nvls_used is True
    assert p5.warnings == ()
    assert p5.p2p_disabled_on_nvlink == ()
    assert p5.unrecognized == ()


def test_p5_transports_split_by_node(p5: nd.TransportReport) -> None:
    assert p5.transports == {"p2p", "net_other", "nvls"}
    assert p5.intra_node_transports == {"p2p", "nvls"}
    assert p5.inter_node_transports == {"net_other"}
    by_via = Counter((c.transport, c.locality) for c in p5.connections)
    # 448 "via P2P/CUMEM" lines; 256 [send] + 256 [receive] "via NET/AWS Libfabric/N/GDRDMA".
    assert by_via == {("p2p", "intra_node"): 448, ("net_other", "inter_node"): 512}
    assert {c.via for c in p5.connections if c.transport == "p2p"} == {"P2P/CUMEM"}
    net = [c for c in p5.connections if c.transport == "net_other"]
    assert all(c.gdr for c in net)
    assert Counter(c.direction for c in net) == {"send": 256, "receive": 256}
    first = p5.connections[0]
    assert first.via == "NET/AWS Libfabric/0/GDRDMA"
    assert (first.channel, first.conn_index, first.direction) == (0, 0, "receive")
    assert (first.src, first.dst) == (nd.Endpoint(8, "0"), nd.Endpoint(0, "0"))
    assert first.host == "test-nccl-worker-0"


def test_p5_env_overrides(p5: nd.TransportReport) -> None:
    assert p5.env_value("NCCL_BUFFSIZE") == "8388608"
    assert p5.env_value("NCCL_P2P_NET_CHUNKSIZE") == "524288"
    assert p5.env_value("NCCL_TOPO_FILE") == (
        "/opt/aws-ofi-nccl/install/share/aws-ofi-nccl/xml/p5.48xl-topo.xml"
    )
    assert p5.env_value("NCCL_P2P_DISABLE") is None


def test_p5_judged(p5: nd.TransportReport) -> None:
    # P2P/CUMEM plus NVLS fits an NVLink intent; not proof of it (docs/FACTS.md, "Transport log").
    assert tf.judge(p5, "nvlink") == []
    assert tf.judge(p5, "any") == []
    assert tf.judge(p5, "pcie") == ["p2p_where_pcie_expected", "nvls_where_pcie_expected"]


def test_nccl687_ib_and_p2p_read_in_busid_notation() -> None:
    report = load("nccl_info_2node_ib_p2pipc_read_nccl687_excerpt.txt")
    assert report.nccl_version is None
    assert report.comms == ()
    assert report.transports == {"p2p", "net_ib"}
    p2p = [c for c in report.connections if c.transport == "p2p"]
    net = [c for c in report.connections if c.transport == "net_ib"]
    assert (len(p2p), len(net)) == (7, 4)
    assert {c.via for c in p2p} == {"P2P/IPC/read"}
    assert all(c.p2p_read for c in p2p)
    assert {c.via for c in net} == {"NET/IB/0/GDRDMA"}
    assert all(c.gdr and c.direction == "send" for c in net)
    # Old busId-style device notation: "3[4a000] -> 6[44000]".
    assert (net[0].src, net[0].dst) == (nd.Endpoint(3, "4a000"), nd.Endpoint(6, "44000"))
    assert (net[0].channel, net[0].conn_index) == (0, None)
    assert net[0].host == "cosmos-hpc-100a45"
    # P2P never leaves a host without MNNVL; where the NET peers (ranks 6 and 2) live, the
    # excerpt does not say.
    assert {c.locality for c in p2p} == {"intra_node"}
    assert {c.locality for c in net} == {"unknown"}
    assert report.intra_node_transports == {"p2p"}
    assert report.inter_node_transports == frozenset()
    assert tf.judge(report, "nvlink") == []
    assert tf.judge(report, "pcie") == ["p2p_where_pcie_expected"]


def test_nccl1817_shm_only_contradicts_nvlink() -> None:
    report = load("nccl_info_8gpu_shm_direct_nccl1817_excerpt.txt")
    assert report.transports == {"shm"}
    assert len(report.connections) == 11
    assert {c.via for c in report.connections} == {"SHM/direct/direct"}
    assert {c.locality for c in report.connections} == {"intra_node"}
    assert report.connections[0].src == nd.Endpoint(7, "7")
    assert report.connections[0].channel == 1
    assert tf.judge(report, "nvlink") == ["shm_where_nvlink_expected"]
    assert tf.judge(report, "pcie") == []
    assert tf.judge(report, "any") == []


P2P_DISABLED_WARN = (
    "\n"
    "[2025-06-11 11:44:19] node-000:1234:1240 [1] graph/paths.cc:330 NCCL WARN P2P is disabled "
    "between NVLINK connected GPUs 1 and 0. This should not be the case given their connectivity, "
    "and is probably due to a hardware issue. If you still want to proceed, you can set "
    "NCCL_IGNORE_DISABLED_P2P=1.\n"
)


def test_p2p_disabled_on_nvlink_warning_is_a_fault_for_every_intent() -> None:
    report = nd.parse(P2P_DISABLED_WARN)
    assert report.p2p_disabled_on_nvlink == ((1, 0),)
    assert len(report.warnings) == 1
    assert report.warnings[0].startswith("P2P is disabled between NVLINK connected GPUs 1 and 0.")
    for intent in ("nvlink", "pcie", "any"):
        assert tf.judge(report, intent) == ["p2p_disabled_on_nvlink"]


def test_other_warnings_are_kept_but_not_judged() -> None:
    text = "h:1:2 [0] NCCL WARN Cuda failure 'out of memory'\nh:1:2 [0] NCCL WARN Cuda failure 'x'"
    report = nd.parse(text)
    assert report.warnings == ("Cuda failure 'out of memory'", "Cuda failure 'x'")
    assert tf.judge(report, "any") == []


def test_honest_pcie_path() -> None:
    # The honest PCIe probe of docs/FACTS.md, "PCIe path": P2P off, SHM on, NVLS off.
    text = "\n".join(
        [
            "gpu1:77:77 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
            "gpu1:77:90 [0] NCCL INFO NCCL_P2P_DISABLE set by environment to 1",
            "gpu1:77:90 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.",
            "gpu1:77:90 [0] NCCL INFO comm 0x5581 rank 0 nRanks 2 nNodes 1 localRanks 2 "
            "localRank 0 MNNVL 0",
            "gpu1:77:95 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct",
            "gpu1:78:96 [1] NCCL INFO Channel 00 : 1[1] -> 0[0] via SHM/direct/direct",
        ]
    )
    report = nd.parse(text)
    assert report.connects_lazily is False
    assert report.env_value("NCCL_P2P_DISABLE") == "1"
    assert report.env_value("NCCL_NVLS_ENABLE") == "0"
    assert report.transports == {"shm"}
    assert tf.judge(report, "pcie") == []
    assert tf.judge(report, "nvlink") == ["p2p_disabled_by_env", "shm_where_nvlink_expected"]


def test_p2p_level_loc_counts_as_disabled() -> None:
    report = nd.parse("h:1:1 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to LOC")
    assert report.env_value("NCCL_P2P_LEVEL") == "LOC"
    assert tf.judge(report, "nvlink") == ["p2p_disabled_by_env"]
    # Connections not logged yet (lazy connect): nothing contradicts, nothing is proven.
    assert not report.observed


@pytest.mark.parametrize(
    ("via", "transport"),
    [
        ("P2P/IPC", "p2p"),
        ("P2P/IPC/read", "p2p"),
        ("P2P/IPC/CE", "p2p"),
        ("P2P/CUMEM", "p2p"),
        ("P2P/CUMEM/read", "p2p"),
        ("P2P/CUMEM/CE", "p2p"),
        ("P2P/MNNVL", "p2p"),
        ("P2P/direct pointer", "p2p"),
        ("P2P/direct pointer/read", "p2p"),
        ("P2P/indirect/2[2]/read", "p2p"),
        ("SHM/direct/direct", "shm"),
        ("SHM/CE/direct", "shm"),
        ("P2P/common device", "p2p"),
        ("SHM/direct", "shm"),
        ("direct shared memory", "shm"),
        ("NET/IB/0/GDRDMA", "net_ib"),
        ("NET/IB/3(5)/GDRDMA(PCI)/Shared", "net_ib"),
        ("NET/IBext_v8/1/GDRDMA", "net_ib"),
        ("NET/Socket/0", "net_socket"),
        ("NET/AWS Libfabric/2/GDRDMA", "net_other"),
        ("NET/Libfabric/0/GDRDMA", "net_other"),
        ("COLLNET/SHARP/0", None),
        ("CE/something-new", None),
    ],
)
def test_classify_via(via: str, transport: str | None) -> None:
    assert nd.classify_via(via) == transport


def test_connection_line_shapes_across_versions() -> None:
    text = "\n".join(
        [
            # "Ring" lines (before 2.7) and SHM's name before 2.13.
            "old:1:1 [0] NCCL INFO Ring 00 : 0[0] -> 1[1] via P2P/common device",
            "old:1:1 [0] NCCL INFO Channel 00 : 0[7000] -> 1[a000] via direct shared memory",
            # Today's SHM line has no "/connIndex"; P2P and NET lines do.
            "new:2:2 [0] NCCL INFO Channel 03 : 0[0] -> 1[1] via SHM/direct",
            "new:2:2 [0] NCCL INFO Channel 01/1 : 0[0] -> 1[1] via P2P/CUMEM/read",
            "new:2:2 [0] NCCL INFO Channel 02/0 : 0[0] -> 9[1] [send] via NET/Socket/0",
            "new:2:2 [0] NCCL INFO Channel 04/0 : 0[0] -> 1[1] via GIN/future/0",
            # Ring order lines carry no arrow and are not connections.
            "new:2:2 [0] NCCL INFO Channel 00/16 :    0   7   6   5   4   3   2   1",
        ]
    )
    report = nd.parse(text)
    shapes = [(c.channel, c.conn_index, c.transport, c.direction) for c in report.connections]
    assert shapes == [
        (0, None, "p2p", None),
        (0, None, "shm", None),
        (3, None, "shm", None),
        (1, 1, "p2p", None),
        (2, 0, "net_socket", "send"),
    ]
    assert report.unrecognized == ("GIN/future/0",)
    assert report.connections[1].src == nd.Endpoint(0, "7000")
    assert report.connections[3].p2p_read
    assert not report.connections[4].gdr


def test_mpirun_tags_timestamps_and_launcher_prefixes() -> None:
    text = "\n".join(
        [
            "[1,3]<stdout>:hostA:25:90 [3] NCCL INFO NCCL version 2.23.4+cuda12.6",
            "[2025-01-02 03:04:05.123456] hostA:25:91 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] "
            "via P2P/IPC",
            "[rank3]: hostA:25:91 [3] NCCL INFO NVLS multicast support is not available on dev 3",
        ]
    )
    report = nd.parse(text)
    assert report.nccl_version == "2.23.4+cuda12.6"
    assert report.connections[0].host == "hostA"
    assert report.connections[0].via == "P2P/IPC"
    assert report.nvls_available is False
    assert report.nvls_used is False


def test_version_banner_without_host_prefix() -> None:
    # Since 2.26 the banner is its own log level, printed bare.
    assert nd.parse("NCCL version 2.27.3+cuda12.9\n").nccl_version == "2.27.3+cuda12.9"


def test_locality_from_hosts_and_single_node() -> None:
    text = "\n".join(
        [
            "a:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 "
            "MNNVL 0",
            "b:2:2 [0] NCCL INFO comm 0x2 rank 2 nRanks 4 nNodes 2 localRanks 2 localRank 0 "
            "MNNVL 0",
            "a:1:3 [0] NCCL INFO Channel 00/0 : 0[0] -> 2[0] [send] via NET/IB/0/GDRDMA",
            "a:1:3 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0",
            "a:1:3 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/IPC",
        ]
    )
    report = nd.parse(text)
    localities = [(c.dst.rank, c.transport, c.locality) for c in report.connections]
    # Rank 1's host comes from the P2P line (P2P joins ranks on one host without MNNVL).
    assert localities == [
        (2, "net_ib", "inter_node"),
        (1, "net_ib", "intra_node"),
        (1, "p2p", "intra_node"),
    ]
    assert tf.judge(report, "nvlink") == ["net_where_nvlink_expected"]
    assert tf.judge(report, "pcie") == ["p2p_where_pcie_expected", "net_where_pcie_expected"]

    one_node = "\n".join(
        [
            "a:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0",
            "a:1:3 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0",
        ]
    )
    assert nd.parse(one_node).intra_node_transports == {"net_socket"}


def test_mnnvl_p2p_without_hosts_is_not_assumed_local() -> None:
    text = "\n".join(
        [
            "n1:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 8 nNodes 2 localRanks 4 localRank 0 "
            "MNNVL 1",
            "n1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 4[0] via P2P/MNNVL",
        ]
    )
    report = nd.parse(text)
    assert report.mnnvl
    assert report.connections[0].locality == "unknown"
    assert report.intra_node_transports == frozenset()


def test_a_rank_on_two_hosts_is_unplaced() -> None:
    # Two communicators reuse rank numbers; where "rank 1" lives is then unknown.
    text = "\n".join(
        [
            "a:1:1 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 1 nranks 2 cudaDev 0 busId 1000 "
            "- Init COMPLETE",
            "b:2:2 [0] NCCL INFO ncclCommInitRank comm 0x2 rank 1 nranks 2 cudaDev 0 busId 1000 "
            "- Init COMPLETE",
            "c:3:3 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0",
        ]
    )
    assert nd.parse(text).connections[0].locality == "unknown"


def test_empty_and_unrelated_text() -> None:
    for text in (
        "",
        "hello\nworld\n",
        "Warning: Permanently added 'x' to the list of known hosts.",
    ):
        report = nd.parse(text)
        assert report.nccl_version is None
        assert report.transports == frozenset()
        assert not report.observed
        assert report.nvls_available is None
        assert report.n_ranks is None
        assert report.connects_lazily is None
        for intent in ("nvlink", "pcie", "any"):
            assert tf.judge(report, intent) == []


def test_reasons_are_bounded() -> None:
    texts = [
        P2P_DISABLED_WARN,
        (FIXTURES / "nccl_info_8gpu_shm_direct_nccl1817_excerpt.txt").read_text(),
        (FIXTURES / "nccl_info_2node_ib_p2pipc_read_nccl687_excerpt.txt").read_text(),
    ]
    for text in texts:
        for intent in ("nvlink", "pcie", "any"):
            assert set(tf.judge(nd.parse(text), intent)) <= set(tf.REASONS)


# --- between nodes: a node group's `transport` (netmon.probe.crossnode)

NET_INTENTS: tuple[nd.Intent, ...] = ("net_ib", "net_socket", "net")


def one_member_log(via: str, n_nodes: int = 2, mnnvl: int = 0) -> str:
    """What one member of a 2-node round finds in its own rank's NCCL_DEBUG_FILE, in the formats
    of NCCL's src/init.cc and src/transport/{net,p2p}.cc: its peer's host is never named."""
    return "\n".join(
        [
            "node-a:4100:4100 [0] NCCL INFO NCCL version 2.27.5+cuda12.9",
            "node-a:4100:4120 [0] NCCL INFO Using network Socket",
            f"node-a:4100:4120 [0] NCCL INFO comm 0x55d0 rank 0 nRanks 2 nNodes {n_nodes} "
            f"localRanks 1 localRank 0 MNNVL {mnnvl}",
            f"node-a:4100:4130 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via {via}",
            f"node-a:4100:4130 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via {via}",
        ]
    )


def test_the_published_ib_log_fits_ib_and_net_but_not_socket() -> None:
    report = load("nccl_info_2node_ib_p2pipc_read_nccl687_excerpt.txt")
    # The NET peers' hosts are unknown (locality "unknown"), which is what a member's own log
    # shows of the other node: it still counts as the network between the nodes.
    assert crossnode.network_transports(report) == {"net_ib"}
    assert tf.judge(report, "net_ib") == []
    assert tf.judge(report, "net") == []
    assert tf.judge(report, "net_socket") == ["ib_where_socket_expected"]


def test_the_published_efa_log_is_a_plugin_neither_ib_nor_socket(p5: nd.TransportReport) -> None:
    # AWS Libfabric (EFA through aws-ofi-nccl) is a net plugin: not NCCL's IB verbs transport.
    assert crossnode.network_transports(p5) == {"net_other"}
    assert tf.judge(p5, "net_ib") == ["plugin_where_ib_expected"]
    assert tf.judge(p5, "net_socket") == ["plugin_where_socket_expected"]
    assert tf.judge(p5, "net") == []
    assert tf.judge(p5, "any") == []


@pytest.mark.parametrize(
    ("via", "expected"),
    [
        (
            "NET/Socket/0",
            {"net_ib": ["socket_where_ib_expected"], "net": ["socket_where_net_expected"]},
        ),
        ("NET/IB/0/GDRDMA", {"net_socket": ["ib_where_socket_expected"]}),
        ("NET/IB/1(3)/GDRDMA/Shared", {"net_socket": ["ib_where_socket_expected"]}),
        ("NET/IBext_v8/0/GDRDMA", {"net_socket": ["ib_where_socket_expected"]}),
        (
            "NET/AWS Libfabric/0/GDRDMA",
            {
                "net_ib": ["plugin_where_ib_expected"],
                "net_socket": ["plugin_where_socket_expected"],
            },
        ),
    ],
)
def test_one_members_log_is_judged_against_each_network_intent(
    via: str, expected: dict[str, list[str]]
) -> None:
    report = nd.parse(one_member_log(via))
    assert {c.locality for c in report.connections} == {"unknown"}
    for intent in NET_INTENTS:
        assert tf.judge(report, intent) == expected.get(intent, []), intent
    assert tf.judge(report, "any") == []


def test_a_socket_fallback_fails_ib_whatever_else_was_used() -> None:
    text = (
        one_member_log("NET/IB/0/GDRDMA")
        + "\n"
        + ("node-a:4100:4130 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/Socket/1")
    )
    assert tf.judge(nd.parse(text), "net_ib") == ["socket_where_ib_expected"]


def test_several_nodes_without_a_network_connection_are_no_network() -> None:
    # A multi-node NVLink domain (MNNVL 1) joins the nodes by P2P: no network was measured.
    report = nd.parse(one_member_log("P2P/MNNVL/read", mnnvl=1))
    assert crossnode.network_transports(report) == frozenset()
    for intent in NET_INTENTS:
        assert tf.judge(report, intent) == ["no_net_between_nodes"]
    assert tf.judge(report, "any") == []


def test_network_inside_one_node_is_not_the_network_between_nodes() -> None:
    # P2P and SHM both off: NCCL goes through the NIC inside the node; nNodes 1 says so.
    text = "\n".join(
        [
            "gpu1:77:90 [0] NCCL INFO comm 0x5581 rank 0 nRanks 2 nNodes 1 localRanks 2 "
            "localRank 0 MNNVL 0",
            "gpu1:77:95 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0",
        ]
    )
    report = nd.parse(text)
    assert report.connections[0].locality == "intra_node"
    for intent in NET_INTENTS:
        assert tf.judge(report, intent) == []


def test_nothing_to_judge_without_connection_lines() -> None:
    # gloo ranks, NCCL_DEBUG set by the probe, or a run that never connected: no verdict.
    for text in ("", one_member_log("NET/Socket/0").rsplit("\n", 2)[0]):
        report = nd.parse(text)
        assert not report.observed
        for intent in NET_INTENTS:
            assert tf.judge(report, intent) == []
    assert tf.judge_logs([], "net_ib") == ((), ())


def test_network_reasons_are_bounded_and_each_intent_names_its_own() -> None:
    assert set(crossnode.NET_REASONS) <= set(tf.REASONS)
    assert len(set(tf.REASONS)) == len(tf.REASONS)
    assert crossnode.network_reasons("any") == crossnode.network_reasons("nvlink") == ()
    produced: set[str] = set()
    for via in ("NET/Socket/0", "NET/IB/0", "NET/AWS Libfabric/0", "P2P/MNNVL"):
        report = nd.parse(one_member_log(via, mnnvl=int(via.startswith("P2P"))))
        for intent in NET_INTENTS:
            found = tf.judge(report, intent)
            assert set(found) <= set(crossnode.network_reasons(intent)), (via, intent)
            produced.update(found)
    assert produced == set(crossnode.NET_REASONS)
    assert {crossnode.INTENT_OF_TRANSPORT[t] for t in TRANSPORTS} == {*NET_INTENTS, "any"}


# --- NCCL_DEBUG: what the ranks are given, an operator's own settings kept (probe.debugenv)

_DEBUG_VARIABLES = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")


def rank_env(
    monkeypatch: pytest.MonkeyPatch, spec_env: dict[str, str] | None = None, /, **process: str
) -> dict[str, str]:
    """Rank 0's environment for a 2-GPU NCCL probe, with `process` as netmon's own environment
    (no GPU is needed to compute it)."""
    for name in _DEBUG_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in process.items():
        monkeypatch.setenv(name, value)
    spec = ProbeSpec(backend="nccl", ranks=2, devices=("0", "1"), env=spec_env or {})
    return Launcher(spec)._rank_env(0)


def debug_of(env: dict[str, str]) -> dict[str, str]:
    return {name: env[name] for name in _DEBUG_VARIABLES if name in env}


def test_without_an_operators_setting_the_ranks_log_info_to_netmons_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = debug_of(rank_env(monkeypatch))
    assert env.pop("NCCL_DEBUG_FILE").endswith("/nccl.rank0.%h.%p.log")
    assert env == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": debugenv.DEBUG_SUBSYS}


@pytest.mark.parametrize("where", ["process", "spec"])
def test_an_operators_warn_level_is_kept(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    if where == "process":
        env = rank_env(monkeypatch, NCCL_DEBUG="WARN")
    else:
        env = rank_env(monkeypatch, {"NCCL_DEBUG": "WARN"})
    # WARN prints no transport: no file of netmon's, so the transports stay unknown, unjudged.
    assert debug_of(env) == {"NCCL_DEBUG": "WARN"}


def test_an_operators_subsystems_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    env = debug_of(rank_env(monkeypatch, NCCL_DEBUG_SUBSYS="INIT,NET"))
    assert env.pop("NCCL_DEBUG_FILE").endswith("/nccl.rank0.%h.%p.log")  # INIT: every "via" line
    assert env == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    # Without INIT the log would show some transports and hide others: the level is not raised.
    assert debug_of(rank_env(monkeypatch, NCCL_DEBUG_SUBSYS="COLL")) == {
        "NCCL_DEBUG_SUBSYS": "COLL"
    }
    spec_env = {"NCCL_DEBUG_SUBSYS": "^INIT"}
    assert debug_of(rank_env(monkeypatch, spec_env)) == spec_env


def test_an_operators_info_level_and_file_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    # INFO with NCCL's default subsystems (INIT among them): netmon reads it from its own file.
    env = debug_of(rank_env(monkeypatch, NCCL_DEBUG="info"))
    assert env.pop("NCCL_DEBUG_FILE").endswith("/nccl.rank0.%h.%p.log")
    assert env == {"NCCL_DEBUG": "info"}
    # Their own file is theirs: netmon neither moves it nor looks for it.
    theirs = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/var/log/nccl/%h.%p.log"}
    assert debug_of(rank_env(monkeypatch, **theirs)) == theirs
    only_file = {"NCCL_DEBUG_FILE": "/var/log/nccl/%h.%p.log"}
    assert debug_of(rank_env(monkeypatch, only_file)) == only_file


def test_cpu_ranks_get_no_nccl_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _DEBUG_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert debug_of(Launcher(ProbeSpec(backend="gloo"))._rank_env(0)) == {}


@pytest.mark.parametrize(
    ("level", "subsys", "complete"),
    [
        (None, None, False),
        ("VERSION", None, False),
        ("WARN", "ALL", False),
        ("INFO", None, True),  # NCCL's default subsystems: INIT, BOOTSTRAP, ENV
        ("info", "init,net", True),
        ("ABORT", None, True),  # above INFO in NCCL's order: prints INFO lines too
        ("TRACE", "INIT", True),
        ("INFO", "ALL", True),
        ("INFO", "P2P,SHM,NET", False),  # NVLS and communicator lines are INIT's only
        ("INFO", "^INIT", False),
        ("INFO", "^COLL,PROXY", True),
        ("INFO", "^ALL", False),
        ("verbose", None, False),
    ],
)
def test_which_settings_log_the_transports(
    level: str | None, subsys: str | None, complete: bool
) -> None:
    assert debugenv.logs_transports(level, subsys) is complete


# Every kind of line nd.parse reads from NCCL's log (its pattern in netmon.probe.nccl_debug), one
# message of each in NCCL's format, and the subsystems NCCL tags it with (INFO(flags, ...) in
# NCCL's source, v2.18 to v2.28): "ALL" for the version banner (INFO(NCCL_ALL, ...) at INFO,
# src/init.cc), WARN lines (always NCCL_ALL) and src/graph/paths.cc's P2P settings.
LOGGED_WITH: tuple[tuple[str, str, frozenset[str]], ...] = (
    ("_VERSION_RE", "NCCL version 2.28.7+cuda12.9", frozenset({"ALL"})),  # src/init.cc
    ("_CHANNEL_RE", "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", frozenset({"INIT", "P2P"})),
    ("_CHANNEL_RE", "Channel 00 : 0[0] -> 1[1] via SHM/direct/direct", frozenset({"INIT", "SHM"})),
    (
        "_CHANNEL_RE",
        "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA",
        frozenset({"INIT", "NET"}),
    ),
    (
        "_COMM_RE",  # src/init.cc
        "comm 0x55d0 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0",
        frozenset({"INIT"}),
    ),
    (
        "_RANK_LINE_RE",  # src/init.cc, Init START and COMPLETE
        "ncclCommInitRankConfig comm 0x55d0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 18000 "
        "commId 0x1 - Init COMPLETE",
        frozenset({"INIT"}),
    ),
    ("_ENV_RE", "NCCL_BUFFSIZE set by environment to 8388608.", frozenset({"ENV"})),  # param.cc
    ("_ENV_RE", "NCCL_P2P_LEVEL set by environment to LOC", frozenset({"ALL"})),  # paths.cc
    ("_NVLS_SUPPORT_RE", "NVLS multicast support is available on dev 0", frozenset({"INIT"})),
    (
        "_NVLS_USED_RE",  # src/transport/nvls.cc
        "NVLS comm 0x55d0 headRank 0 nHeads 8 nvlsRanks 8 buffSize 1048576",
        frozenset({"INIT", "NVLS"}),
    ),
    ("_NVLS_USED_RE", "Connected NVLS tree", frozenset({"INIT"})),
    (
        "_P2P_NVLINK_DISABLED_RE",  # a WARN
        "P2P is disabled between NVLINK connected GPUs 1 and 0.",
        frozenset({"ALL"}),
    ),
)
# Patterns that are no kind of NCCL line: a line's frame (launcher tags, NCCL's prefix), the
# parts of a NET "via", and nccl-tests' own device listing.
NOT_LINE_KINDS = {"_MPI_TAG_RE", "_LINE_RE", "_NET_RE", "_TESTS_RANK_RE"}


def test_netmon_asks_nccl_for_the_lines_it_parses_and_no_more() -> None:
    asked = set(debugenv.DEBUG_SUBSYS.split(","))
    # TUNING has rank 0 write a line per collective, inside the timed loop; nothing reads it.
    assert "TUNING" not in asked and "GRAPH" not in asked
    parsed = {name for name in vars(nd) if name.endswith("_RE")} - NOT_LINE_KINDS
    assert {kind for kind, _, _ in LOGGED_WITH} == parsed  # each kind's subsystems are stated
    for kind, message, flags in LOGGED_WITH:
        assert getattr(nd, kind).search(message), (kind, message)
        assert "ALL" in flags or flags & asked, f"{kind} lines would be missing: {message}"
    for subsystem in asked:
        needed = [
            m for _, m, flags in LOGGED_WITH if "ALL" not in flags and flags & asked == {subsystem}
        ]
        assert needed, f"nothing parsed needs {subsystem}"
    assert debugenv.logs_transports("INFO", debugenv.DEBUG_SUBSYS)
