"""A mixed fleet: node classes from what the scheduler says of each node, pairs matched and
judged within their class, and the backend chosen per pair (netmon.sweep.locate.classes)."""

from __future__ import annotations

import os
import random
from pathlib import Path

from netmon.baseline.book import BaselineBook
from netmon.baseline.policy import BaselinePolicy
from netmon.sweep.locate import classes
from netmon.sweep.locate.judge import Rules
from netmon.sweep.locate.localise import Localiser
from netmon.sweep.locate.plan import PairPlan, SweepNode
from netmon.sweep.scheduler import PairRun
from netmon.sweep.settings import SweepConfig
from netmon.sweep.slurm.scheduler import SlurmScheduler

LINK = 1.0e8


def test_a_nodes_class_is_its_gpu_type_count_and_features() -> None:
    assert classes.gpus_of("gpu:h100:8(S:0-1)") == 8
    assert classes.gpus_of("gpu:a100:4,gpu:a10:2") == 6
    assert classes.gpus_of("(null)") == 0
    assert classes.gpu_types("gpu:h100:8(S:0-1)") == ["h100"] and classes.gpu_types("gpu:8") == []
    assert classes.node_class(8, ["h100"]) == "h100x8"
    assert classes.node_class(8, [], ["ib400", "nvl"]) == "gpux8+ib400+nvl"
    assert classes.node_class(0, [], classes.slurm_features("(null)")) == "cpu"
    assert (
        classes.node_class(4, ["a100"], classes.slurm_features("ib200,a100")) == "a100x4+a100+ib200"
    )
    assert classes.backend_for("auto", [8, 8]) == "nccl"
    assert classes.backend_for("auto", [8, 0]) == "gloo"
    assert classes.backend_for("gloo", [8, 8]) == "gloo"


def _fleet(
    count: int, share: float, rng: random.Random, told: bool
) -> tuple[list[SweepNode], set[str]]:
    names = [f"n{i:03d}" for i in range(count)]
    second = set(rng.sample(names, round(share * count)))
    kind = {n: ("h200x8" if n in second else "h100x8") if told else "" for n in names}
    return [SweepNode(n, rails=2, kind=kind[n]) for n in names], second


def _sweep(nodes: list[SweepNode], speed: dict[str, float], seed: int) -> Localiser:
    noise = random.Random(seed * 31 + 7)
    loc = Localiser(
        nodes, Rules(cohort_ratio=0.9), BaselineBook(BaselinePolicy()), random.Random(seed)
    )
    while pairs := loc.next_round():
        runs = [
            PairRun(
                plan,
                "ok",
                tuple(
                    LINK * min(speed.get(n, 1.0) for n in plan.nodes) * noise.gauss(1.0, 0.01)
                    for _ in range(plan.rails)
                ),
            )
            for plan in pairs
        ]
        loc.record(runs)
    return loc


def test_a_slower_node_type_is_not_named_when_its_class_is_known() -> None:
    """A tenth of the fleet 15 % slower: told as a class, nobody is named over 30 sweeps;
    untold (one cohort), the slower type is what gets named: the condition this guards."""
    named_untold = 0
    for seed in range(30):
        rng = random.Random(seed)
        nodes, second = _fleet(64, 0.1, rng, told=True)
        speed = {n: 0.85 for n in second}
        assert not _sweep(nodes, speed, seed).suspects(), seed
        untold, _ = _fleet(64, 0.1, random.Random(seed), told=False)
        named_untold += len(_sweep(untold, speed, seed).suspects())
    assert named_untold > 30


def test_a_cut_cable_in_a_mixed_fleet_is_named_alone() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        nodes, second = _fleet(64, 0.1, rng, told=True)
        cut = rng.choice(sorted(second)) if seed % 2 else rng.choice([n.name for n in nodes])
        speed = {n: 0.85 for n in second} | {cut: 0.4 * (0.85 if cut in second else 1.0)}
        assert [s.node for s in _sweep(nodes, speed, seed).suspects()] == [cut], seed


def test_the_first_round_matches_within_a_class() -> None:
    rng = random.Random(3)
    nodes, second = _fleet(40, 0.2, rng, told=True)
    loc = Localiser(nodes, Rules(), BaselineBook(BaselinePolicy()), rng)
    for plan in loc.next_round():
        assert len({n in second for n in plan.nodes}) == 1, plan


def test_slurm_reads_each_nodes_class_and_runs_a_cpu_pair_on_gloo(tmp_path: Path) -> None:
    """One CPU-only node in a GPU partition: its pairs are gloo, the GPU nodes' NCCL."""
    sinfo = tmp_path / "sinfo"
    sinfo.write_text(
        "#!/bin/sh\n"
        "echo 'g1|idle|gpu:h100:8(S:0-1)|10.0.0.1|ib400'\n"
        "echo 'g2|plnd|gpu:h100:8(S:0-1)|10.0.0.2|ib400'\n"
        "echo 'g3|idle|gpu:h200:8|10.0.0.3|(null)'\n"
        "echo 'c1|idle|(null)|10.0.0.4|(null)'\n"
        "echo 'x1|alloc|gpu:h100:8|10.0.0.5|ib400'\n"
    )
    sinfo.chmod(0o755)
    environ = {"PATH": f"{tmp_path}:{os.environ['PATH']}"}
    scheduler = SlurmScheduler(SweepConfig(), "s", "sweep", environ=environ)
    found = {n.name: n for n in scheduler.nodes("sweep", None)}
    assert {n: found[n].kind for n in found} == {
        "g1": "h100x8+ib400",
        "g2": "h100x8+ib400",
        "g3": "h200x8",
        "c1": "cpu",
    }
    assert found["g1"].rails == 8 and found["c1"].rails == 1
    assert scheduler.backend(PairPlan(("g1", "g2"), 1, 8)) == "nccl"
    assert scheduler.backend(PairPlan(("g3", "c1"), 1, 1)) == "gloo"
