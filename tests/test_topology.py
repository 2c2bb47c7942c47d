"""Topology parsing, NVML translation and pair planning.

The `topo_*.txt` fixtures are real published `nvidia-smi` output, copied unedited from their
published sources (tests/fixtures/SOURCES.md). Literal matrices written in this file are
CONSTRUCTED to exercise one case each (a PCIe switch tree, an old driver's headings...) and say
so. NVML is replayed through a stand-in (tests/fake_nvml.py) whose every call is bound to the
installed pynvml's signatures: there is no GPU here.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from netmon.gpu.nvml import NvmlUnavailable, read_topology
from netmon.topology import readings as topo
from netmon.topology.model import (
    NODE,
    NOT_AVAILABLE,
    PHB,
    PIX,
    PXB,
    SELF,
    SYS,
    Gpu,
    Nic,
    Pair,
    PathClass,
    Topology,
)
from netmon.topology.parse import parse_p2p_matrix, parse_topo_matrix
from netmon.topology.plan import plan_pair_rounds, plan_rounds, shares_uplink
from netmon.topology.readings import (
    GpuTopologyReading,
    NvLinkReading,
    cpu_list,
    single_node,
    topology_from_readings,
)
from netmon.topology.render import render_text, to_json
from tests.fake_nvml import TopologyNvml, bus_id, cpu_mask, nvml_error

FIXTURES = Path(__file__).parent / "fixtures"
TOPO_FILES = sorted(p.name for p in FIXTURES.glob("topo_*.txt") if "p2p" not in p.name)
P2P_FILE = "topo_p2p_rw_2x_rtx5090_gns.txt"
H100_8_NONIC = "topo_8xH100_sxm_nv18_nonic_mlengineering.txt"
H100_8_9NIC = "topo_8xH100_nv18_9nic_TRUNCATED.txt"
H100_4 = "topo_4xH100_hgx_nv6_4nic_TRUNCATED_LEGEND.txt"
A6000_3 = "topo_3x_rtxa6000_nv4_bridge_pair.txt"


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def parsed(name: str) -> Topology:
    return parse_topo_matrix(text(name))


def nv(links: int) -> PathClass:
    return PathClass.nvlink(links)


# --- Every fixture parses -----------------------------------------------------------------------

# file -> (GPUs, NICs, NVML index -> NUMA Affinity, GPU0's CPU Affinity, path class counts)
EXPECTED: dict[str, tuple[int, int, list[int | None], str | None, dict[str, int]]] = {
    H100_8_NONIC: (8, 0, [0, 0, 0, 0, 1, 1, 1, 1], "0-51,104-155", {"NV18": 28}),
    H100_8_9NIC: (8, 9, [0, 0, 0, 0, 1, 1, 1, 1], "0-79", {"NV18": 28}),
    H100_4: (4, 4, [3, 1, 7, 5], "6,14,22,30", {"NV6": 6}),
    A6000_3: (3, 0, [0, 0, 0], "0-31,64-95", {"NV4": 1, "NODE": 2}),
    "topo_2x_nvlink_nv2_mlengineering.txt": (2, 0, [None, None], "0-23", {"NV2": 1}),
    "topo_4x_rtx6000ada_pcie_cx7_asus_esc8000a.txt": (
        4,
        4,
        [0, 0, 1, 1],
        "0-31",
        {"NODE": 2, "SYS": 4},
    ),
    "topo_2x_rtx6000ada_phb_cx7_puget_wrx90.txt": (2, 2, [0, 0], "0-23", {"PHB": 1}),
    "topo_2x_rtx5090_phb.txt": (2, 0, [0, 0], "0-63", {"PHB": 1}),
}


def test_every_topo_fixture_is_covered() -> None:
    assert sorted(EXPECTED) == TOPO_FILES


@pytest.mark.parametrize("name", TOPO_FILES)
def test_fixture_parses(name: str) -> None:
    gpus, nics, numa, cpu0, classes = EXPECTED[name]
    topology = parsed(name)
    assert topology.indices == tuple(range(gpus))
    assert len(topology.nics) == nics
    assert [g.numa for g in topology.gpus] == numa
    assert topology.gpus[0].cpu_affinity == cpu0
    assert {str(p): n for p, n in topology.classes().items()} == classes
    assert topology.asymmetric_pairs() == []
    # Every GPU-NIC path is there: no fixture lacks a GPU row.
    assert len(topology.nic_path) == gpus * nics
    for a in topology.indices:
        assert topology.path_between(a, a) == SELF


def test_8x_h100_cells() -> None:
    topology = parsed(H100_8_NONIC)
    assert topology.path_between(0, 1) == nv(18)
    assert topology.nvlink_count(3, 6) == 18
    assert topology.is_nvlink(7, 0)
    assert topology.gpus[4].cpu_affinity == "52-103,156-207"
    assert len(topology.pairs()) == 28


def test_9_nic_file_cut_after_nic5_keeps_every_gpu_row() -> None:
    topology = parsed(H100_8_9NIC)
    assert [n.name for n in topology.nics] == [f"NIC{i}" for i in range(9)]
    assert all(n.device is None for n in topology.nics)  # the Legend was cut off
    # Each GPU is PIX to exactly one NIC: GPU0-NIC8, GPU1-NIC7, ..., GPU7-NIC1; NIC0 is SYS to all.
    for gpu in range(8):
        pix = [nic for (g, nic), p in topology.nic_path.items() if g == gpu and p == PIX]
        assert pix == [f"NIC{8 - gpu}"]
        assert topology.nic_path[(gpu, "NIC0")] == SYS
    assert topology.nic_path[(4, "NIC1")] == NODE
    assert topology.gpus[7] == Gpu(7, numa=1, cpu_affinity="80-159")


def test_4x_h100_nv6_with_pix_nics_and_cut_legend() -> None:
    topology = parsed(H100_4)
    assert topology.path_between(2, 3) == nv(6)
    assert all(topology.nic_path[(i, f"NIC{i}")] == PIX for i in range(4))
    assert topology.nic_path[(0, "NIC1")] == SYS
    assert topology.nics == tuple(Nic(f"NIC{i}") for i in range(4))


def test_nic_legend_names_devices() -> None:
    topology = parsed("topo_4x_rtx6000ada_pcie_cx7_asus_esc8000a.txt")
    assert topology.nics == tuple(Nic(f"NIC{i}", f"mlx5_{i}") for i in range(4))
    assert topology.path_between(0, 1) == NODE
    assert topology.path_between(1, 2) == SYS
    assert topology.nic_path[(2, "NIC3")] == NODE


def test_tab_separated_with_an_empty_column_before_gpu_numa_id() -> None:
    topology = parsed("topo_2x_rtx5090_phb.txt")
    assert topology.gpus == (
        Gpu(0, numa=0, cpu_affinity="0-63"),
        Gpu(1, numa=0, cpu_affinity="0-63"),
    )
    assert topology.path_between(0, 1) == PHB


def test_bridge_pair_and_an_unbridged_gpu() -> None:
    topology = parsed(A6000_3)
    assert topology.path_between(0, 1) == nv(4)
    assert topology.path_between(0, 2) == NODE
    assert not topology.is_nvlink(1, 2)


# --- Formats and damage -------------------------------------------------------------------------


def test_the_p2p_status_file_is_refused_as_a_path_matrix_and_read_as_p2p() -> None:
    with pytest.raises(ValueError, match=r"line 2: cell 'GNS' .* parse_p2p_matrix"):
        parse_topo_matrix(text(P2P_FILE))
    p2p = parse_p2p_matrix(text(P2P_FILE))
    assert p2p.gpus == (0, 1)
    assert p2p.status == {(0, 1): "GNS", (1, 0): "GNS"}
    assert not p2p.supported(0, 1)


def test_a_path_matrix_is_refused_as_p2p() -> None:
    with pytest.raises(ValueError, match=r"line 1: .*parse_topo_matrix"):
        parse_p2p_matrix(text(H100_4))
    # CONSTRUCTED: a bare GPU matrix without the affinity columns, so the cells must tell.
    with pytest.raises(ValueError, match=r"line 2: cell 'NV4' .*parse_topo_matrix"):
        parse_p2p_matrix("GPU0 GPU1\nGPU0 X NV4\nGPU1 NV4 X\n")


def test_p2p_ok() -> None:
    p2p = parse_p2p_matrix(" \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n GPU1\tOK\tX\t\n")  # CONSTRUCTED
    assert p2p.supported(1, 0)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("", "empty"),
        ("hello world\n", r"line 1: not an `nvidia-smi topo -m` matrix"),
        ("\n\n$ nvidia-smi topo -m\nGPU0 GPU1\n", "line 3: .*starting with GPU0"),
        ("GPU0 GPU1 CPU Affinity\nGPU0 X NV4 0-3\nGPU7 NV4 X 0-3\n", "line 3: .*GPU7"),
        ("GPU0 GPU1 CPU Affinity\nGPU0 X NV4 0-3\nGPU1 NV4\n", "line 3: .*1 cells for 2"),
        ("GPU0 GPU1 CPU Affinity\nGPU0 X NV4 0-3\nGPU0 X NV4 0-3\n", "line 3: a second row"),
        # An empty cell collapses under whitespace splitting: X leaves the diagonal.
        (
            "GPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSYS\t0-3\nGPU1\t\t X \t0-3\n",
            "line 3: cell GPU1/GPU0 is 'X'.*line up",
        ),
        ("GPU0\tGPU1\tCPU Affinity\nGPU0\t X \t\t0-3\n", "line 2: cell '0-3' is not"),
        ("GPU0 GPU1 CPU Affinity\nGPU0 X nv4 0-3\nGPU1 NV4 X 0-3\n", "line 2: .*'nv4'"),
        ("GPU0 GPU1 CPU Affinity\nGPU0 X NV4 0-3 7\nGPU1 NV4 X 0-3\n", "line 2: 2 values"),
        ("GPU0 GPU0 CPU Affinity\n", "line 1: column GPU0 appears twice"),
        ("GPU0 NIC0 GPU1\n", "line 1: GPU1 after the NIC columns"),
        ("GPU0 GPU1 NUMA-Affinity\n", "line 1: unexpected column heading 'NUMA-Affinity'"),
    ],
)
def test_not_a_matrix_is_a_clear_error(bad: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_topo_matrix(bad)


def test_single_space_copy_as_web_pages_print_it() -> None:
    # The 4xH100 fixture with every run of whitespace squeezed to one space.
    squeezed = "\n".join(" ".join(line.split()) for line in text(H100_4).splitlines())
    assert parse_topo_matrix(squeezed) == parsed(H100_4)


def test_ansi_escapes_from_a_terminal_copy_are_ignored() -> None:
    lines = text(H100_8_NONIC).splitlines()
    lines[0] = "\x1b[4m" + lines[0] + "\x1b[0m"
    assert parse_topo_matrix("\n".join(lines)) == parsed(H100_8_NONIC)


def test_a_missing_gpu_row_is_filled_from_the_others() -> None:
    lines = text(H100_8_NONIC).splitlines()
    topology = parse_topo_matrix("\n".join(lines[:-1]))  # the GPU7 row cut off
    assert topology.path_between(7, 0) == nv(18)
    assert topology.gpus[7] == Gpu(7)  # its affinity went with the row
    with pytest.raises(ValueError, match="no row for GPU6 or GPU7"):
        parse_topo_matrix("\n".join(lines[:-2]))


def test_old_driver_device_columns_soc_and_no_numa() -> None:
    # CONSTRUCTED in the shape of drivers from before NODE and the NIC Legend.
    old = (
        "\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\n"
        "GPU0\t X \tSOC\tPHB\t0-11\n"
        "GPU1\tSOC\t X \tSOC\t12-23\n"
        "mlx5_0\tPHB\tSOC\t X \t\n"
    )
    topology = parse_topo_matrix(old)
    assert topology.nics == (Nic("mlx5_0", "mlx5_0"),)
    assert topology.path_between(0, 1) == PathClass("SOC")
    assert topology.path_between(0, 1).distance == SYS.distance
    assert topology.nic_path == {(0, "mlx5_0"): PHB, (1, "mlx5_0"): PathClass("SOC")}
    assert topology.gpus[1] == Gpu(1, cpu_affinity="12-23")


def test_unknown_trailing_heading_and_na_cells_are_tolerated() -> None:
    # CONSTRUCTED: a future column after the known ones, and N/A paths.
    future = "GPU0 GPU1 CPU Affinity NUMA Affinity Fabric Clique\nGPU0 X N/A 0-7 0 1 2\n"
    topology = parse_topo_matrix(future + "GPU1 N/A X 8-15 1 1 2\n")
    assert topology.path_between(0, 1) == NOT_AVAILABLE
    assert topology.gpus[1] == Gpu(1, numa=1, cpu_affinity="8-15")


def test_asymmetric_cells_count_as_the_farther_class() -> None:
    # CONSTRUCTED: should never happen; a link only one end reports is not trusted.
    topology = parse_topo_matrix("GPU0 GPU1\nGPU0 X NV4\nGPU1 PHB X\n")
    assert topology.path[(0, 1)] == nv(4)
    assert topology.path_between(0, 1) == topology.path_between(1, 0) == PHB
    assert topology.asymmetric_pairs() == [(0, 1)]
    assert "Asymmetric cells" in render_text(topology, plan_rounds(topology))


def test_path_class_order_and_validation() -> None:
    order = [SELF, nv(18), nv(4), PIX, PXB, PHB, NODE, SYS, NOT_AVAILABLE]
    assert sorted(reversed(order), key=lambda p: p.distance) == order
    assert nv(18).nvlinks == 18 and not SYS.is_nvlink and str(PXB) == "PXB"
    with pytest.raises(ValueError):
        PathClass("GNS")
    with pytest.raises(ValueError):
        PathClass.nvlink(0)


def test_topology_rejects_an_incomplete_matrix() -> None:
    with pytest.raises(ValueError, match="no path for GPU1-GPU0"):
        Topology(gpus=(Gpu(0), Gpu(1)), path={(0, 1): SYS})
    with pytest.raises(ValueError, match="unknown GPU"):
        Topology(gpus=(Gpu(0),), nic_path={(1, "NIC0"): PIX}, nics=(Nic("NIC0"),))


def test_restricted_keeps_only_the_given_gpus_with_their_indices() -> None:
    full = parsed("topo_4x_rtx6000ada_pcie_cx7_asus_esc8000a.txt")
    part = full.restricted([3, 1])
    assert part.indices == (1, 3)
    assert part.gpus == (full.gpu(1), full.gpu(3))
    assert part.pairs() == {(1, 3): full.path_between(1, 3)}
    assert part.nics == full.nics
    assert part.nic_path == {k: v for k, v in full.nic_path.items() if k[0] in (1, 3)}
    # Pairs are planned over the configured GPUs only, by their own indices.
    assert plan_rounds(part) == [[(1, 3)]]
    assert full.restricted(full.indices) == full
    assert full.restricted([]).gpus == ()
    with pytest.raises(KeyError, match="no GPU4"):
        full.restricted([0, 4])


# --- Pair rounds --------------------------------------------------------------------------------


def check_plan(n: int, rounds: list[list[Pair]]) -> None:
    """Every unordered pair exactly once, no GPU twice in a round, no empty round."""
    flat = [pair for members in rounds for pair in members]
    assert sorted(flat) == [(a, b) for a in range(n) for b in range(a + 1, n)]
    for members in rounds:
        assert members
        gpus = [gpu for pair in members for gpu in pair]
        assert len(gpus) == len(set(gpus))


@given(st.integers(min_value=2, max_value=16))
def test_circle_method_is_complete_and_minimal(n: int) -> None:
    rounds = plan_pair_rounds(n)
    check_plan(n, rounds)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    assert all(len(members) == n // 2 for members in rounds)


@given(st.integers(min_value=2, max_value=12), st.data())
def test_constraints_are_repaired_keeping_every_pair_once(n: int, data: st.DataObject) -> None:
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    conflicts = data.draw(st.sets(st.tuples(st.sampled_from(pairs), st.sampled_from(pairs))))

    def avoid(p: Pair, q: Pair) -> bool:  # deliberately one-sided: asked both ways round
        return (p, q) in conflicts

    rounds = plan_pair_rounds(n, avoid)
    check_plan(n, rounds)
    for members in rounds:
        for p in members:
            assert not any(avoid(p, q) for q in members if q != p)


def test_no_constraint_leaves_the_circle_plan_unchanged() -> None:
    assert plan_pair_rounds(8, lambda p, q: False) == plan_pair_rounds(8)


def test_tiny_and_invalid_sizes() -> None:
    assert plan_pair_rounds(0) == plan_pair_rounds(1) == []
    assert plan_pair_rounds(2) == [[(0, 1)]]
    assert plan_pair_rounds(3) == [[(1, 2)], [(0, 2)], [(0, 1)]]
    with pytest.raises(ValueError):
        plan_pair_rounds(-1)


@pytest.mark.parametrize("name", [H100_8_NONIC, H100_8_9NIC])
def test_8x_nv18_gives_28_pairs_in_7_rounds_of_4(name: str) -> None:
    rounds = plan_rounds(parsed(name))
    assert len(rounds) == 7
    assert all(len(members) == 4 for members in rounds)
    check_plan(8, rounds)
    # NVLink pairs share no PCIe uplink, even beside PIX NICs.
    assert rounds == plan_pair_rounds(8)


@pytest.mark.parametrize("name", [H100_4, "topo_4x_rtx6000ada_pcie_cx7_asus_esc8000a.txt"])
def test_4_gpus_give_6_pairs_in_3_rounds(name: str) -> None:
    # NODE/SYS only, no PCIe switch shared by two GPUs: nothing to keep apart.
    rounds = plan_rounds(parsed(name))
    assert len(rounds) == 3
    check_plan(4, rounds)


# CONSTRUCTED: two PCIe switches, each with two GPUs, one switch per CPU socket.
TWO_SWITCHES = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity
GPU0\t X \tPIX\tSYS\tSYS\t0-15\t0
GPU1\tPIX\t X \tSYS\tSYS\t0-15\t0
GPU2\tSYS\tSYS\t X \tPIX\t16-31\t1
GPU3\tSYS\tSYS\tPIX\t X \t16-31\t1
"""
# CONSTRUCTED: the same two switches under one root port (PXB between them).
ONE_TREE = TWO_SWITCHES.replace("SYS", "PXB")


def test_pairs_leaving_their_switch_contend_for_its_uplink() -> None:
    topology = parse_topo_matrix(TWO_SWITCHES)
    avoid = shares_uplink(topology)
    assert avoid((0, 2), (1, 3))  # both climb out of both switches
    assert avoid((0, 3), (1, 2))
    assert not avoid((0, 1), (2, 3))  # peer to peer inside each switch
    rounds = plan_rounds(topology)
    check_plan(4, rounds)
    # The four cross pairs need a round each; the two PIX pairs share one: 5 is the minimum.
    assert len(rounds) == 5
    assert [(0, 1), (2, 3)] in rounds


def test_pxb_pairs_contend_for_the_switch_uplinks_only() -> None:
    topology = parse_topo_matrix(ONE_TREE)
    avoid = shares_uplink(topology)
    assert avoid((0, 2), (1, 3))
    assert not avoid((0, 1), (2, 3))


def test_through_host_every_pair_behind_a_switch_climbs_it() -> None:
    topology = parse_topo_matrix(TWO_SWITCHES)
    avoid = shares_uplink(topology, through_host=True)
    assert avoid((0, 1), (2, 3)) is False  # different switches, different root ports
    # CONSTRUCTED: four GPUs on one switch; through the host, no two pairs may overlap.
    one_switch = parse_topo_matrix(TWO_SWITCHES.replace("SYS", "PIX"))
    assert not shares_uplink(one_switch)((0, 1), (2, 3))
    host = shares_uplink(one_switch, through_host=True)
    assert host((0, 1), (2, 3))
    rounds = plan_rounds(one_switch, through_host=True)
    check_plan(4, rounds)
    assert len(rounds) == 6


def test_a_shared_nic_switch_reveals_gpus_under_one_switch() -> None:
    # CONSTRUCTED: NVLink hides the GPUs' PCIe relation, but both are PIX to NIC0.
    matrix = (
        "GPU0 GPU1 GPU2 GPU3 NIC0 CPU Affinity\n"
        "GPU0 X NV4 SYS SYS PIX 0-7\n"
        "GPU1 NV4 X SYS SYS PIX 0-7\n"
        "GPU2 SYS SYS X NV4 SYS 8-15\n"
        "GPU3 SYS SYS NV4 X SYS 8-15\n"
    )
    topology = parse_topo_matrix(matrix)
    assert shares_uplink(topology)((0, 2), (1, 3))
    assert not shares_uplink(topology)((0, 1), (2, 3))  # NVLink pairs stay off PCIe


def test_plan_rounds_uses_the_gpu_indices() -> None:
    topology = Topology(
        gpus=(Gpu(2), Gpu(5), Gpu(7)),
        path={(a, b): SYS for a in (2, 5, 7) for b in (2, 5, 7) if a != b},
    )
    assert sorted(p for members in plan_rounds(topology) for p in members) == [
        (2, 5),
        (2, 7),
        (5, 7),
    ]


# --- Output -------------------------------------------------------------------------------------


def test_json_shape() -> None:
    topology = parsed("topo_4x_rtx6000ada_pcie_cx7_asus_esc8000a.txt")
    rounds = plan_rounds(topology)
    data = json.loads(json.dumps(to_json(topology, rounds)))
    assert data["gpus"][2] == {"index": 2, "numa": 1, "cpu_affinity": "32-63"}
    assert data["nics"][0]["name"] == "NIC0"
    assert data["nics"][0]["device"] == "mlx5_0"
    assert data["nics"][0]["paths"][0] == {"gpu": 0, "path": "NODE"}
    assert data["pairs"][0] == {"gpu": 0, "peer_gpu": 1, "path": "NODE"}
    assert len(data["pairs"]) == 6
    assert data["classes"] == {"NODE": 2, "SYS": 4}
    assert data["rounds"] == [[list(pair) for pair in members] for members in rounds]
    assert all(len(pair) == 2 for members in data["rounds"] for pair in members)


def test_json_of_8x_nv18() -> None:
    data = to_json(parsed(H100_8_9NIC), plan_rounds(parsed(H100_8_9NIC)))
    assert {p["path"] for p in data["pairs"]} == {"NV18"}
    assert len(data["rounds"]) == 7
    assert "device" not in data["nics"][0]
    assert data["gpus"][0] == {"index": 0, "numa": 0, "cpu_affinity": "0-79"}


def test_json_with_nvml_identities() -> None:
    gpu = Gpu(0, uuid="GPU-1", pci_bus_id="00000000:18:00.0", numa=0, cpu_affinity="0-3")
    data = to_json(Topology(gpus=(gpu,)), [])
    assert data["gpus"] == [
        {
            "index": 0,
            "uuid": "GPU-1",
            "pci_bus_id": "00000000:18:00.0",
            "numa": 0,
            "cpu_affinity": "0-3",
        }
    ]
    assert data["pairs"] == [] and data["rounds"] == []


def test_render_text() -> None:
    topology = parsed(H100_8_NONIC)
    out = render_text(topology, plan_rounds(topology))
    lines = out.splitlines()
    assert lines[0].split() == [
        *(f"GPU{i}" for i in range(8)),
        "CPU",
        "Affinity",
        "NUMA",
        "Affinity",
    ]
    assert lines[1].split()[:3] == ["GPU0", "X", "NV18"]
    assert "  NV18: 28" in lines
    assert "Pair plan: 28 pairs in 7 rounds" in lines
    assert "  round 1: 0-7 (NV18)  1-6 (NV18)  2-5 (NV18)  3-4 (NV18)" in lines


def test_render_text_names_nics() -> None:
    topology = parsed("topo_2x_rtx6000ada_phb_cx7_puget_wrx90.txt")
    out = render_text(topology, plan_rounds(topology))
    assert "NICs: NIC0: mlx5_0, NIC1: mlx5_1" in out
    assert "Pair plan: 1 pair in 1 round" in out


# --- NVML readings -> topology ------------------------------------------------------------------

_LEVEL = {
    "PIX": topo.NVML_TOPOLOGY_SINGLE,
    "PXB": topo.NVML_TOPOLOGY_MULTIPLE,
    "PHB": topo.NVML_TOPOLOGY_HOSTBRIDGE,
    "NODE": topo.NVML_TOPOLOGY_NODE,
    "SYS": topo.NVML_TOPOLOGY_SYSTEM,
}


def readings_like(
    topology: Topology, *, nvswitch: bool = False, typed: bool = True
) -> tuple[list[GpuTopologyReading], dict[Pair, int | None]]:
    """NVML readings of a machine with this topology: per GPU its active links (to each NVLink
    peer, or `nvswitch`: into four switches), and the common ancestor of each pair. NVLink pairs
    get SYS for their hidden PCIe class, as topo -m cannot show it."""
    gpu_type = topo.NVML_NVLINK_DEVICE_TYPE_GPU if typed else None
    switch_type = topo.NVML_NVLINK_DEVICE_TYPE_SWITCH if typed else None
    readings = []
    for gpu in topology.gpus:
        counts = {
            peer: topology.nvlink_count(gpu.index, peer)
            for peer in topology.indices
            if peer != gpu.index
        }
        if nvswitch:
            links = [
                NvLinkReading(f"00000000:{0xA0 + n % 4:02X}:00.0", switch_type)
                for n in range(max(counts.values()))
            ]
        else:
            links = [
                NvLinkReading(bus_id(p), gpu_type) for p, n in counts.items() for _ in range(n)
            ]
        readings.append(
            GpuTopologyReading(
                index=gpu.index,
                uuid=f"GPU-synthetic-{gpu.index}",
                pci_bus_id=bus_id(gpu.index),
                numa=single_node([1 << gpu.numa] if gpu.numa is not None else [0]),
                cpu_affinity=cpu_list(cpu_mask(gpu.cpu_affinity)),
                links=tuple(links),
            )
        )
    ancestors: dict[Pair, int | None] = {
        pair: _LEVEL.get(str(path), topo.NVML_TOPOLOGY_SYSTEM if path.is_nvlink else None)
        for pair, path in topology.pairs().items()
    }
    return readings, ancestors


def without_ids(topology: Topology) -> Topology:
    """What `topo -m` shows too: no UUIDs, bus ids or P2P status."""
    gpus = tuple(replace(g, uuid=None, pci_bus_id=None) for g in topology.gpus)
    return replace(topology, gpus=gpus, p2p=None)


def without_nics(topology: Topology) -> Topology:
    return replace(topology, nics=(), nic_path={})


@pytest.mark.parametrize("name", TOPO_FILES)
def test_readings_equivalent_to_each_fixture_give_its_topology(name: str) -> None:
    expected = without_nics(parsed(name))
    readings, ancestors = readings_like(expected)
    built = topology_from_readings(readings, ancestors)
    assert without_ids(built) == expected
    assert built.gpus[0].uuid == "GPU-synthetic-0"
    assert built.gpus[0].pci_bus_id == bus_id(0)


@pytest.mark.parametrize("typed", [True, False])
def test_nvswitch_links_count_as_nv18(typed: bool) -> None:
    # Every link ends at a switch: typed by the driver, or (older drivers) only by its bus id.
    expected = parsed(H100_8_NONIC)
    readings, ancestors = readings_like(expected, nvswitch=True, typed=typed)
    assert without_ids(topology_from_readings(readings, ancestors)) == expected


def test_4x_h100_nv6_from_hand_written_readings() -> None:
    # The fixture's board: each GPU has 18 links, 6 to each of its three peers, and one NUMA node.
    numa = [3, 1, 7, 5]
    cpus = ["6,14,22,30", "4,12,20,28", "7,15,23,31", "5,13,21,29"]
    readings = [
        GpuTopologyReading(
            index=i,
            uuid=None,
            pci_bus_id=bus_id(i),
            numa=single_node([1 << numa[i]]),
            cpu_affinity=cpu_list(cpu_mask(cpus[i])),
            links=tuple(NvLinkReading(bus_id(p)) for p in range(4) if p != i for _ in range(6)),
        )
        for i in range(4)
    ]
    ancestors: dict[Pair, int | None] = {
        (a, b): topo.NVML_TOPOLOGY_SYSTEM for a in range(4) for b in range(a + 1, 4)
    }
    built = topology_from_readings(readings, ancestors)
    assert without_ids(built) == without_nics(parsed(H100_4))


def test_ancestor_levels_and_gaps() -> None:
    gpus = [GpuTopologyReading(i, None, bus_id(i), None, None) for i in range(3)]
    built = topology_from_readings(
        gpus, {(0, 1): topo.NVML_TOPOLOGY_INTERNAL, (2, 1): topo.NVML_TOPOLOGY_MULTIPLE}
    )
    assert built.path_between(0, 1) == PIX  # two GPUs on one board (K80): not "X"
    assert built.path_between(1, 2) == PXB  # either key order
    assert built.path_between(0, 2) == NOT_AVAILABLE  # NVML could not say
    odd = topology_from_readings(gpus[:2], {(0, 1): 35})
    assert odd.path_between(0, 1) == NOT_AVAILABLE


def test_one_sided_link_readings_are_trusted() -> None:
    # GPU1's remote info failed (None): GPU0's view of the 4 bridge links stands.
    a = GpuTopologyReading(0, None, bus_id(0), None, None, (NvLinkReading(bus_id(1)),) * 4)
    b = GpuTopologyReading(1, None, bus_id(1), None, None, (NvLinkReading(None),) * 4)
    built = topology_from_readings([a, b], {(0, 1): topo.NVML_TOPOLOGY_NODE})
    assert built.path_between(0, 1) == nv(4)


def test_legacy_bus_id_spelling_matches() -> None:
    a = GpuTopologyReading(
        0, None, "00000000:18:00.0", None, None, (NvLinkReading("0000:2a:00.0"),)
    )
    b = GpuTopologyReading(
        1, None, "00000000:2A:00.0", None, None, (NvLinkReading("0000:18:00.0"),)
    )
    assert topology_from_readings([a, b], {}).path_between(0, 1) == nv(1)


def test_untyped_links_need_every_bus_id_to_be_called_switch_links() -> None:
    far = NvLinkReading("00000000:A0:00.0")
    known = [GpuTopologyReading(i, None, bus_id(i), None, None, (far,) * 6) for i in range(2)]
    assert topology_from_readings(known, {}).path_between(0, 1) == nv(6)
    # GPU1's address unknown: its "far end" might be GPU1 itself, so no guess.
    unknown = [known[0], replace(known[1], pci_bus_id=None)]
    assert topology_from_readings(unknown, {}).path_between(0, 1) == NOT_AVAILABLE


def test_topology_is_read_only() -> None:
    path = {(0, 1): SYS, (1, 0): SYS}
    topology = Topology(gpus=(Gpu(0), Gpu(1)), path=path)
    path[(0, 1)] = PIX
    assert topology.path_between(0, 1) == SYS
    with pytest.raises(TypeError):
        topology.path[(0, 1)] = PIX  # type: ignore[index]


def test_ibm_npu_links_are_not_gpu_links() -> None:
    npu = NvLinkReading("00000000:F0:00.0", topo.NVML_NVLINK_DEVICE_TYPE_IBMNPU)
    gpus = [GpuTopologyReading(i, None, bus_id(i), None, None, (npu,) * 2) for i in range(2)]
    assert topology_from_readings(gpus, {(0, 1): 50}).path_between(0, 1) == SYS


def test_masks() -> None:
    assert cpu_list(cpu_mask("0-51,104-155")) == "0-51,104-155"
    assert cpu_list([0b1011]) == "0-1,3"
    assert cpu_list([0, 1]) == "64"
    assert cpu_list([]) is None and cpu_list([0, 0]) is None
    assert single_node([0b100]) == 2
    assert single_node([0b110]) is None
    assert single_node([0]) is None


def test_nvml_constants_match_pynvml() -> None:
    for name in (
        "NVML_TOPOLOGY_INTERNAL",
        "NVML_TOPOLOGY_SINGLE",
        "NVML_TOPOLOGY_MULTIPLE",
        "NVML_TOPOLOGY_HOSTBRIDGE",
        "NVML_TOPOLOGY_NODE",
        "NVML_TOPOLOGY_SYSTEM",
        "NVML_NVLINK_DEVICE_TYPE_GPU",
        "NVML_NVLINK_DEVICE_TYPE_IBMNPU",
        "NVML_NVLINK_DEVICE_TYPE_SWITCH",
        "NVML_NVLINK_DEVICE_TYPE_UNKNOWN",
    ):
        assert getattr(topo, name) == getattr(pynvml, name), name


# --- The live reader, through a stand-in pynvml ------------------------------------------------


@pytest.mark.parametrize("typed", [True, False])
def test_read_topology_through_nvml(typed: bool) -> None:
    fake = TopologyNvml(typed=typed)
    topology = read_topology(fake)
    assert without_ids(topology) == parsed(A6000_3)
    assert topology.gpus[2].uuid == "GPU-synthetic-2"
    assert topology.gpus[2].pci_bus_id == bus_id(2)
    assert fake.shutdowns == 2  # the topology's session, and the P2P status's
    # P2P as NVML answers it: the bridged pair does it; what NVML does not answer is not guessed
    # (so no pair is said to lack it, and NCCL decides).
    assert topology.p2p is not None and topology.p2p.supported(0, 1)
    assert (0, 2) not in topology.p2p.status and topology.p2p.without([0, 1, 2]) == []
    # Every link number is asked once per GPU; only active links are asked further.
    assert fake.times_called("nvmlDeviceGetNvLinkState") == 3 * pynvml.NVML_NVLINK_MAX_LINKS
    assert fake.times_called("nvmlDeviceGetNvLinkRemotePciInfo") == 8


def test_read_topology_without_a_driver() -> None:
    fake = TopologyNvml(init_error=nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    with pytest.raises(NvmlUnavailable, match="NVML unavailable: Driver Not Loaded"):
        read_topology(fake)
    assert fake.shutdowns == 0


def test_read_topology_on_this_machine() -> None:
    # The real pynvml: no driver here, so a clear NvmlUnavailable; with a GPU, a real topology.
    try:
        topology = read_topology()
    except NvmlUnavailable as exc:
        assert "NVML unavailable" in str(exc)
    else:
        assert len(topology.pairs()) == len(topology.gpus) * (len(topology.gpus) - 1) // 2


# ---- the idle set a `gpus: idle` collective runs on ----


def test_idle_set_takes_the_largest_nvlink_island_that_is_large_enough() -> None:
    from netmon.topology.plan import idle_set

    bridged = parse_topo_matrix(text("topo_3x_rtxa6000_nv4_bridge_pair.txt"))
    assert idle_set(bridged, [0, 1, 2], 2) == (0, 1)  # the NV4 pair, not the PCIe mix
    assert idle_set(bridged, [0, 1, 2], 3) == (0, 1, 2)  # no island of 3: every idle GPU
    assert idle_set(bridged, [0, 2], 2) == (0, 2)
    assert idle_set(bridged, [2], 2) == ()
    dgx = parse_topo_matrix(text("topo_8xH100_sxm_nv18_nonic_mlengineering.txt"))
    assert idle_set(dgx, [0, 2, 4, 5, 7], 4) == (0, 2, 4, 5, 7)
    assert idle_set(dgx, [0, 2, 5], 4) == ()
    assert idle_set(None, [3, 1], 2) == (1, 3)


def test_equal_islands_prefer_one_numa_node_then_the_lowest_indexes() -> None:
    from netmon.topology.model import Gpu, PathClass, Topology
    from netmon.topology.plan import idle_set

    # Two NV2 islands of two GPUs: {0, 1} across NUMA nodes, {2, 3} on NUMA node 1.
    numa = {0: 0, 1: 1, 2: 1, 3: 1}
    gpus = tuple(Gpu(i, numa=numa[i]) for i in range(4))
    nv = {frozenset({0, 1}), frozenset({2, 3})}
    links = {
        (a, b): PathClass.parse("NV2" if frozenset({a, b}) in nv else "SYS")
        for a in range(4)
        for b in range(4)
        if a != b
    }
    topology = Topology(gpus, path=links)
    assert idle_set(topology, [0, 1, 2, 3], 2) == (2, 3)
    assert idle_set(topology, [0, 1, 2], 2) == (0, 1)  # {2} alone is too small
