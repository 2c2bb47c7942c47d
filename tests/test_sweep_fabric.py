"""The fabric model, uplink localisation and the sweep simulator's smoke (issue 25).

Sweeps here run netmon's own Localiser (the code `netmon sweep` runs) against the simulated
network of bench/fabric_sim.py: small fabrics, so that the whole file takes seconds; the
acceptance figures at 1,024-4,096 nodes are bench/sweep_sim.py's (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from netmon.baseline.book import BaselineBook
from netmon.baseline.policy import BaselinePolicy
from netmon.cli import sweep_command
from netmon.errors import UsageError
from netmon.sweep import report
from netmon.sweep import report as sweep_report
from netmon.sweep.locate import hostlist
from netmon.sweep.locate.fabric import Cable, Fabric, Hop, Uplink, rail_optimised
from netmon.sweep.locate.fabric_file import load, parse_fabric_file, parse_topology
from netmon.sweep.locate.judge import Rules
from netmon.sweep.locate.localise import UPLINK_PURPOSES, Localiser
from netmon.sweep.locate.plan import PairPlan, SweepNode, grouped_first_round
from netmon.sweep.locate.uplinks import hitting_set_size
from netmon.sweep.runner import Outcome, new_sweep_id, run_sweep
from netmon.sweep.scheduler import PairRun
from netmon.sweep.settings import SweepConfig

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from fabric_sim import Fault, Network, Noise, recorded_deviations  # noqa: E402

RULES = Rules(cohort_ratio=0.97)
NOISE = Noise(tuple(recorded_deviations()), 0.3)


def _fabric(groups: int, size: int, rails: int, routing: str = "table") -> Fabric:
    names = [f"n{i:03d}" for i in range(groups * size)]
    members = {f"su{g}": names[g * size : (g + 1) * size] for g in range(groups)}
    return rail_optimised(members, rails, size, routing)  # type: ignore[arg-type]


def _sweep(
    fabric: Fabric, rails: int, faults: list[Fault], seed: int, routes_by: Fabric | None = None
) -> tuple[Localiser, list[list[PairPlan]]]:
    """One sweep planned on `fabric`, measured on a network that routes as `routes_by` does
    (the planner's model when None)."""
    nodes = sorted({SweepNode(node, rails) for node, _ in fabric.leaf_of}, key=lambda n: n.name)
    loc = Localiser(
        nodes,
        RULES,
        BaselineBook(RULES.policy),
        random.Random(seed),
        max_rounds=6,
        confirm_repeats=3,
        fabric=fabric,
    )
    network = Network(routes_by or fabric, faults, NOISE, random.Random(seed + 7))
    rounds = []
    while pairs := loc.next_round():
        rounds.append(pairs)
        measured = network.measure(pairs)
        loc.record([PairRun(p, "ok", bw) for p, bw in zip(pairs, measured, strict=True)])
    return loc, rounds


def test_hostlist_expands_ranges_with_their_padding() -> None:
    assert hostlist.expand("n[08-10,3],gpu5") == ["n08", "n09", "n10", "n3", "gpu5"]
    assert hostlist.expand("sp[1-2]-r0") == ["sp1-r0", "sp2-r0"]
    with pytest.raises(ValueError, match="unbalanced"):
        hostlist.expand("n[1-2")
    with pytest.raises(ValueError, match="'x' is not a number"):
        hostlist.expand("n[x]")


def test_routing_models_pick_uplinks_as_the_fabrics_do() -> None:
    fabric = _fabric(groups=2, size=4, rails=1)
    # Under one leaf: cables only. Across: destination-mod-k, the destination's port.
    assert fabric.pair_hops(("n000", "n001"), 0) == ()
    hops = fabric.pair_hops(("n001", "n006"), 0)
    assert hops == (
        Hop("su0", "spine3", True),
        Hop("su1", "spine3", False),
        Hop("su1", "spine2", True),
        Hop("su0", "spine2", False),
    )
    # The same destination is reached through the same port from every source.
    assert {fabric.spine(src, "n006", 0) for src in ("n000", "n001", "n002")} == {"spine3"}
    ecmp = _fabric(groups=2, size=4, rails=1, routing="ecmp")
    spines = {ecmp.spine(src, "n006", 0) for src in ("n000", "n001", "n002", "n003")}
    assert ecmp.spine("n001", "n006", 0) == ecmp.spine("n001", "n006", 0)  # a fixed hash
    assert len(spines) > 1  # the source counts too
    # The operator's forwarding table wins over the model.
    given = Fabric(fabric.leaf_of, fabric.spines, tables={"su0": {"n006": "spine1"}})
    assert given.spine("n001", "n006", 0) == "spine1"


def test_topology_conf_and_fabric_file_parse_with_errors_naming_the_field(
    tmp_path: Path,
) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text(
        "# two units under two spines\n"
        "SwitchName=su1 Nodes=n[01-02]\nSwitchName=su2 Nodes=n03\n"
        "SwitchName=sp1 Switches=su[1-2]\nSwitchName=sp2 Switches=su[1-2] LinkSpeed=1\n"
    )
    fabric = load(conf, rails=2)
    assert fabric.leaf("n02", 1) == "su1/rail1"
    assert fabric.spines["su2/rail0"] == ("sp1/rail0", "sp2/rail0")
    assert fabric.spine("n01", "n03", 0) == "sp1/rail0"  # n03 is port 0 of su2
    # `scontrol show topology` lists an upper switch's nodes too: it stays a spine.
    shown = (
        "SwitchName=su1 Level=0 LinkSpeed=1 Nodes=n[01-02]\n"
        "SwitchName=su2 Level=0 LinkSpeed=1 Nodes=n03\n"
        "SwitchName=sp1 Level=1 LinkSpeed=1 Nodes=n[01-03] Switches=su[1-2]\n"
    )
    assert parse_topology(shown, rails=1).leaf("n03", 0) == "su2"
    assert parse_topology(shown, rails=1).crosses(("n01", "n03"), 0)
    with pytest.raises(ValueError, match="line 1: no SwitchName= or BlockName="):
        parse_topology("Nodes=n1\n", rails=1)
    # topology/block: each block a group round 1 stays in; how blocks connect is not told.
    blocks = load(
        _written(
            tmp_path / "block.conf",
            "BlockName=b1 Nodes=n[01-18]\nBlockName=b2 Nodes=n[19-36]\nBlockSizes=18,36\n",
        ),
        rails=2,
    )
    assert blocks.leaf("n18", 1) == "b1/rail1" and blocks.leaf("n19", 0) == "b2/rail0"
    assert blocks.spines["b1/rail0"] == () and blocks.pair_hops(("n01", "n19"), 0) == ()
    nodes = [SweepNode(f"n{i:02d}", 2) for i in range(1, 37)]
    loc = Localiser(nodes, RULES, BaselineBook(RULES.policy), random.Random(4), fabric=blocks)
    assert all(not blocks.crosses(p.nodes, 0) for p in loc.next_round())
    document = {"routing": "ecmp", "leaves": {"a": {"rail": 1, "nodes": "n[1-2]", "spines": "s1"}}}
    assert parse_fabric_file(document).leaf("n2", 1) == "a"
    with pytest.raises(ValueError, match="fabric routing"):
        parse_fabric_file({"routing": "random", "leaves": {}})
    with pytest.raises(ValueError, match=r"fabric leaves\.a: needs nodes"):
        parse_fabric_file({"leaves": {"a": {"rail": 0}}})


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_links_are_values_named_and_sorted_as_reports_name_them() -> None:
    """Cables and uplinks are values, named node/railK and leaf~spine (an uplink's name is the
    reports' and the metric labels'), and they sort as their names do (su11~x before su1~x)."""
    fabric = _fabric(groups=2, size=4, rails=1)
    assert fabric.links(("n001", "n006"), 0) == {
        Cable("n001", 0),
        Cable("n006", 0),
        Uplink("su0", "spine3"),
        Uplink("su1", "spine3"),
        Uplink("su1", "spine2"),
        Uplink("su0", "spine2"),
    }
    assert fabric.pair_hops(("n001", "n006"), 0)[0].link == Uplink("su0", "spine3")
    assert [str(Cable("n1", 0)), str(Uplink("su1/rail0", "sp2/rail0"))] == [
        "n1/rail0",
        "su1/rail0~sp2/rail0",
    ]
    assert sorted([Uplink("su1", "s2"), Uplink("su11", "s1"), Uplink("su1", "s1")]) == [
        Uplink("su11", "s1"),
        Uplink("su1", "s1"),
        Uplink("su1", "s2"),
    ]
    assert sorted([Cable("n1", 2), Cable("n1", 10)]) == [Cable("n1", 10), Cable("n1", 2)]
    assert len({Uplink("a", "b"), Uplink("a", "b"), Cable("a", 0)}) == 2
    assert Uplink("su1", "sp2").ends == ("su1", "sp2")


def test_round_one_stays_under_each_leaf_and_later_rounds_share_no_uplink() -> None:
    fabric = _fabric(groups=4, size=8, rails=2)
    loc, rounds = _sweep(fabric, 2, [], seed=3)
    assert all(not fabric.crosses(p.nodes, 0) for p in rounds[0])
    assert len(rounds[0]) == 16
    crossing = [p for pairs in rounds[1:] for p in pairs if p.purpose in UPLINK_PURPOSES]
    assert crossing, "no round crossed an uplink"
    for pairs in rounds[1:]:
        used = Counter(
            h for p in pairs for r in range(p.rails) for h in fabric.pair_hops(p.nodes, r)
        )
        assert max(used.values(), default=1) == 1, "two flows of one round on one uplink"
    assert not loc.ledger.uncovered()  # type: ignore[union-attr]
    assert loc.suspects() == []


def test_an_odd_node_out_still_joins_a_trio_of_its_own_group() -> None:
    fabric = _fabric(groups=2, size=4, rails=1)
    nodes = [SweepNode(f"n{i:03d}") for i in range(7)]  # one group of 4, one of 3
    group_of = {n.name: fabric.group(n.name, 1) for n in nodes}
    pairs, waiting = grouped_first_round(nodes, group_of, random.Random(1), "trio")
    assert waiting == []
    (trio,) = [p for p in pairs if len(p.nodes) == 3]
    assert len({group_of[n] for n in trio.nodes}) == 1


@pytest.mark.parametrize("routing", ["table", "ecmp"])
def test_a_slow_uplink_is_named_first_and_no_other_uplink(routing: str) -> None:
    fabric = _fabric(groups=4, size=8, rails=2, routing=routing)
    named = 0
    for seed in range(6):
        link = random.Random(seed).choice(fabric.all_uplinks())
        loc, _ = _sweep(fabric, 2, [Fault(link, 0.5)], seed)
        uplinks = [s.uplink for s in loc.ranked() if s.kind == "uplink"]
        top = loc.ranked()[0] if loc.suspects() else None
        named += uplinks == [link] and top is not None and top.kind == "uplink"
        assert loc.ledger is not None and loc.ledger.mismatch is None  # the model is right
    assert named >= 5, f"{routing}: named alone and first in {named} of 6"


def test_a_routing_the_fabric_does_not_follow_names_no_uplink_and_says_so() -> None:
    """The planner's destination-mod-k model on a fabric that hashes flows (ECMP): flows the
    model kept apart collide, and their contention would read as slow uplinks everywhere."""
    model = _fabric(groups=8, size=16, rails=2)
    real = _fabric(groups=8, size=16, rails=2, routing="ecmp")
    for seed in range(3):
        loc, rounds = _sweep(model, 2, [Fault(Cable("n017", 1), 0.4)], seed, routes_by=real)
        assert loc.ledger is not None and loc.ledger.mismatch is not None
        assert "under sweep.routing=table" in loc.ledger.mismatch
        assert [s.kind for s in loc.suspects()] == ["node"]  # the cable is still named
        assert loc.ledger.undecided() == [] and loc.ledger.uncovered() == []
        flagged = int(loc.ledger.mismatch.split()[2].rstrip(":"))  # "by round N: ..."
        assert not any(p.purpose in ("uplink", "cover") for r in rounds[flagged:] for p in r)
    # The same fabric planned with its own routing: never taken for a mismatch.
    for seed in range(3):
        loc, _ = _sweep(model, 2, [Fault(Cable("n017", 1), 0.4)], seed)
        assert loc.ledger is not None and loc.ledger.mismatch is None


def test_a_leaf_slow_on_every_uplink_is_named_as_the_switch() -> None:
    """Many uplinks, one switch: the leaf is named (no uplink of it alone, no node, no routing
    mismatch), and nothing is left undecided."""
    fabric = _fabric(groups=8, size=16, rails=2)
    slow = [Fault(u, 0.5) for u in fabric.all_uplinks() if u.leaf == "su0/rail0"]
    for seed in range(3):
        loc, _ = _sweep(fabric, 2, slow, seed)
        assert loc.ledger is not None and loc.ledger.mismatch is None
        assert [(s.kind, s.node, s.peer, s.rails) for s in loc.suspects()] == [
            ("switch", "su0/rail0", "leaf", (0,))
        ], seed
        assert not loc.ledger.undecided() and not loc.undecided()
    entry = report.suspect_entry(loc.suspects()[0])
    assert entry == {
        "kind": "switch",
        "switch": "su0/rail0",
        "level": "leaf",
        "rails": [0],
        "round": entry["round"],
        "ratio": entry["ratio"],
    }
    assert (
        sweep_command.human(
            {
                "sweep": "s",
                "nodes": [],
                "rounds": 4,
                "wall_seconds": 1.0,
                "pairs": [],
                "suspects": [entry],
            }
        ).count("leaf switch su0/rail0 (every uplink of it)")
        == 1
    )


def test_a_spine_slow_on_every_uplink_is_named_and_one_bad_uplink_is_no_switch() -> None:
    fabric = _fabric(groups=8, size=16, rails=2)
    spine = fabric.all_uplinks()[3].spine
    through = [u for u in fabric.all_uplinks() if u.spine == spine]
    slow = [Fault(u, 0.5) for u in through]
    for seed in range(3):
        loc, _ = _sweep(fabric, 2, slow, seed)
        assert [(s.kind, s.node, s.peer) for s in loc.suspects()] == [("switch", spine, "spine")], (
            seed
        )
        one, _ = _sweep(fabric, 2, slow[:1], seed)
        leaf = through[0].leaf
        assert [(s.kind, s.node, s.peer) for s in one.suspects()] == [("uplink", leaf, spine)]


def test_the_uplinks_that_explain_failures_are_counted_greedily() -> None:
    assert hitting_set_size([]) == 0
    assert hitting_set_size([{"a", "b"}, {"a", "c"}, {"a"}]) == 1
    assert hitting_set_size([{"a"}, {"b"}, {"c"}, set()]) == 3
    assert hitting_set_size([{"a", "b"}, {"b", "c"}, {"c", "d"}, {"d", "e"}]) == 2


def test_a_slow_cable_is_named_in_two_rounds_and_no_uplink_beside_it() -> None:
    fabric = _fabric(groups=4, size=8, rails=2)
    for seed in range(5):
        loc, _ = _sweep(fabric, 2, [Fault(Cable(f"n{seed * 5:03d}", 1), 0.6)], seed)
        (suspect,) = loc.suspects()
        assert (suspect.kind, suspect.node, suspect.rails) == ("node", f"n{seed * 5:03d}", (1,))
        assert suspect.round == 2


class SimulatedScheduler:
    """The Scheduler interface over the simulated network: what `netmon sweep` would get
    from Slurm on this fabric (the runner, planner and judge under test are the real ones)."""

    def __init__(
        self, fabric: Fabric, faults: list[Fault], topology: str, routes_by: Fabric | None = None
    ) -> None:
        self.fabric, self.text = fabric, topology
        self.network = Network(routes_by or fabric, faults, NOISE, random.Random(5))

    def nodes(self, partition: str, nodelist: str | None) -> list[SweepNode]:
        return sorted({SweepNode(n, 2) for n, _ in self.fabric.leaf_of}, key=lambda n: n.name)

    def taken(self, nodes: object) -> set[str]:
        return set()

    def other_sweeps(self) -> list[str]:
        return []

    def run_round(self, pairs: Sequence[PairPlan], deadline: float) -> list[PairRun]:
        measured = self.network.measure(pairs)
        return [PairRun(p, "ok", bw) for p, bw in zip(pairs, measured, strict=True)]

    def cleanup(self) -> None:
        pass

    def topology(self) -> str | None:
        return self.text


def _topology(leaves: int) -> str:
    """A topology.conf: `leaves` switches of 8 nodes each, under 8 spines."""
    text = "".join(
        f"SwitchName=su{g} Nodes=n[{g * 8:03d}-{g * 8 + 7:03d}]\n" for g in range(leaves)
    )
    return text + "".join(f"SwitchName=spine{s} Switches=su[0-{leaves - 1}]\n" for s in range(1, 9))


def _run(scheduler: SimulatedScheduler, settings: SweepConfig, book: BaselineBook) -> Outcome:
    return run_sweep(
        scheduler,
        settings,
        book,
        sweep=new_sweep_id(),
        partition="p",
        nodelist=None,
        rng=random.Random(2),
    )


def test_netmon_sweep_reads_the_fabric_and_reports_the_uplink(tmp_path: Path) -> None:
    text = _topology(leaves=4)
    fabric = parse_topology(text, rails=2)
    link = Uplink("su2/rail1", "spine4/rail1")
    settings = SweepConfig(fabric="slurm", cohort_ratio=0.97)  # 6 rounds: the fabric default
    book = BaselineBook(BaselinePolicy())
    outcome = _run(SimulatedScheduler(fabric, [Fault(link, 0.4)], text), settings, book)
    # The report's keys, those a sweep that could not run prints too (the command adds
    # `delivered` after the runner).
    assert {*outcome.whole, "delivered"} == set(sweep_report.KEYS)
    uplinks = [s for s in outcome.whole["suspects"] if s["kind"] == "uplink"]
    assert uplinks == [
        {
            "kind": "uplink",
            "uplink": "su2/rail1~spine4/rail1",
            "leaf": "su2/rail1",
            "spine": "spine4/rail1",
            "rails": [1],
            "round": uplinks[0]["round"],
            "ratio": uplinks[0]["ratio"],
        }
    ]
    assert uplinks[0]["ratio"] < 0.6
    assert not [s for s in outcome.whole["suspects"] if s["kind"] != "uplink"]
    assert outcome.whole["routing_mismatch"] is None
    # A fabric of 8 leaves hashing its flows (ECMP) where the planner assumed tables: said,
    # and no uplink named. (On 4 leaves a collision looks much like one bad switch.)
    text = _topology(leaves=8)
    fabric = parse_topology(text, rails=2)
    hashing = parse_topology(text, rails=2, routing="ecmp")
    scheduler = SimulatedScheduler(fabric, [Fault(link, 0.4)], text, routes_by=hashing)
    outcome = _run(scheduler, settings, book)
    mismatch = outcome.whole["routing_mismatch"]
    assert mismatch and "sweep.routing=table" in mismatch and mismatch in outcome.whole["notes"]
    assert [s for s in outcome.whole["suspects"] if s["kind"] == "uplink"] == []
    bad = SweepConfig(fabric=str(tmp_path / "missing.yaml"))
    with pytest.raises(UsageError, match=r"sweep\.fabric: "):
        _run(scheduler, bad, book)


def test_the_simulator_prints_its_contract() -> None:
    """bench/sweep_sim.py's command and keys, as issue 25 names them (a quick smoke)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sweep_sim.py"), "--nodes", "64", "--rails", "2",
         "--leaf-size", "16", "--fault", "uplink", "--trials", "4", "--seed", "9", "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    result = json.loads(done.stdout)
    for key in ("trials", "top1_correct", "rounds_median", "rounds_max", "false_suspects"):
        assert key in result, key
    assert result["trials"] == 4 and result["top1_correct"] >= 0.75
    assert result["rounds_max"] <= 6
