"""Sweeps of 128 to 4,096 simulated nodes: does the planner name the fault, in how many rounds,
and how often does it name a healthy link (docs/SWEEPS.md, docs/BENCHMARKS.md)?

Each trial builds a rail-optimised two-tier fabric (nodes in groups of --leaf-size, one leaf per
group and rail, --spines spines per rail, every leaf with one uplink to each), injects faults,
and runs one sweep with netmon's own planner and judge (netmon.sweep.locate.localise.Localiser, the
code `netmon sweep` runs), its pairs measured by the simulated network (bench/fabric_sim.py) instead
of a scheduler. A trial starts with no history: the first sweep on a new cluster.

    python bench/sweep_sim.py --nodes 1024 --rails 8 --fault node-cable --trials 100 --seed 1 --json

Fault classes: node-cable (one node's cable on one rail), uplink (one leaf-to-spine uplink),
multi (three at once, each a cable or an uplink), spine or leaf (one switch slow on all its
uplinks), none (a healthy fabric: false suspects only). A fault slows its link to 10-90 % of its
rate (--slowdown: the share of the rate it takes away, drawn uniformly), shows in every
measurement or, with --flap, in that share of them.

Production's conditions: --planner-fabric none (the network has its fabric, the planner is not
told), --flapping N (N other cables failing half their measurements; naming one, or the path
through one, is counted apart as flapping_named), --second-type SHARE:FACTOR (a second node
type, told to the planner as a class).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from netmon.baseline.book import BaselineBook
from netmon.sweep.locate.fabric import ROUTINGS, Cable, Fabric, Link, rail_optimised
from netmon.sweep.locate.judge import Rules
from netmon.sweep.locate.localise import Localiser, Suspect
from netmon.sweep.locate.plan import SweepNode
from netmon.sweep.scheduler import PairRun

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fabric_sim import Fault, Network, Noise, recorded_deviations

CLASSES = ("node-cable", "uplink", "multi", "spine", "leaf", "none")
# Rounds within which a fault must be named to count (issue 25's and 35's acceptance).
ROUND_BUDGET = {"node-cable": 2, "uplink": 6, "multi": 6, "spine": 6, "leaf": 6, "none": 6}
FLAPPING_SHARE = 0.5  # a flapping cable fails this share of its measurements
DEFAULT_NOISE_SCALE = 0.3
DEFAULT_COHORT_RATIO = 0.97


@dataclass(frozen=True)
class Setup:
    nodes: int
    rails: int
    leaf_size: int
    spines: int
    routing: str
    fault: str
    slowdown: tuple[float, float]
    flap: float
    max_rounds: int
    confirm_repeats: int
    rules: Rules
    noise: Noise
    # How the simulated network really routes: "model" as the planner assumes (--routing,
    # its seed), or "ecmp" with a hash the planner does not know (a fabric whose routing is
    # not the model's).
    true_routing: str = "model"
    planner_fabric: str = "known"  # "none": the planner is not told the fabric
    flapping: int = 0  # random healthy cables that fail half their measurements, beside the fault
    # (share, factor): that share of nodes is a second node type, factor times as fast.
    second_type: tuple[float, float] | None = None


def build_fabric(setup: Setup, seed: int) -> tuple[Fabric, list[SweepNode]]:
    groups = _groups(setup)
    fabric = rail_optimised(groups, setup.rails, setup.spines, setup.routing, seed)  # type: ignore[arg-type]
    names = [name for members in groups.values() for name in members]
    second = _second_type(setup, names, seed)
    return fabric, [
        SweepNode(name, rails=setup.rails, kind="b" if name in second else "a") for name in names
    ]


def _second_type(setup: Setup, names: list[str], seed: int) -> set[str]:
    """The nodes of the second type: that share of them, at random (a fleet bought in two
    batches is seldom one block per leaf)."""
    if setup.second_type is None:
        return set()
    share, _ = setup.second_type
    return set(random.Random(f"types-{seed}").sample(names, round(share * len(names))))


def _groups(setup: Setup) -> dict[str, list[str]]:
    names = [f"n{i:04d}" for i in range(setup.nodes)]
    return {
        f"su{g:03d}": names[g * setup.leaf_size : (g + 1) * setup.leaf_size]
        for g in range((setup.nodes + setup.leaf_size - 1) // setup.leaf_size)
    }


def true_fabric(setup: Setup, model: Fabric, seed: int) -> Fabric:
    """The fabric the network routes by: the planner's model, or ECMP with another hash."""
    if setup.true_routing == "model":
        return model
    return rail_optimised(_groups(setup), setup.rails, setup.spines, "ecmp", seed + 7919)


def draw_faults(
    setup: Setup, fabric: Fabric, nodes: list[SweepNode], rng: random.Random
) -> list[Fault]:
    if setup.fault in ("spine", "leaf"):
        return _switch_fault(setup, fabric, rng)
    kinds = {"node-cable": ["cable"], "uplink": ["uplink"], "none": []}.get(setup.fault)
    if kinds is None:  # multi
        kinds = [rng.choice(["cable", "uplink"]) for _ in range(3)]
    faults: list[Fault] = []
    taken: set[Link] = set()
    for kind in kinds:
        while True:
            link: Link
            if kind == "cable":
                link = Cable(rng.choice(nodes).name, rng.randrange(setup.rails))
            else:
                link = rng.choice(fabric.all_uplinks())
            if link not in taken:
                break
        taken.add(link)
        slowdown = rng.uniform(*setup.slowdown)
        faults.append(Fault(link, 1.0 - slowdown, setup.flap))
    return faults


def _switch_fault(setup: Setup, fabric: Fabric, rng: random.Random) -> list[Fault]:
    """One leaf or spine slow on all its uplinks (one slowdown for the whole switch)."""
    uplinks = fabric.all_uplinks()
    side = 0 if setup.fault == "leaf" else 1
    switch = rng.choice(sorted({link.ends[side] for link in uplinks}))
    factor = 1.0 - rng.uniform(*setup.slowdown)
    return [
        Fault(link, factor, setup.flap, switch) for link in uplinks if link.ends[side] == switch
    ]


def draw_flapping(
    setup: Setup, nodes: list[SweepNode], faults: list[Fault], rng: random.Random
) -> list[Fault]:
    """Healthy-looking cables that fail half their measurements (a marginal transceiver):
    beside the fault, never on its node."""
    faulty = {f.link.node for f in faults if isinstance(f.link, Cable)}
    chosen: set[Cable] = set()
    candidates = [n.name for n in nodes if n.name not in faulty]
    while len(chosen) < min(setup.flapping, len(candidates)):
        chosen.add(Cable(rng.choice(candidates), rng.randrange(setup.rails)))
    return [Fault(link, 0.5, FLAPPING_SHARE) for link in sorted(chosen)]


def run_trial(setup: Setup, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    fabric, nodes = build_fabric(setup, seed)
    faults = draw_faults(setup, fabric, nodes, rng)
    flapping = draw_flapping(setup, nodes, faults, rng)
    # Separate streams for the faults, the network and the planner (salted, not seed + 1,
    # which is the next trial's fault seed).
    real = true_fabric(setup, fabric, seed)
    speed = (
        {n.name: setup.second_type[1] for n in nodes if n.kind == "b"} if setup.second_type else {}
    )
    network = Network(
        real, faults + flapping, setup.noise, random.Random(f"network-{seed}"), speed=speed
    )
    known = setup.planner_fabric == "known"
    loc = Localiser(
        nodes,
        setup.rules,
        BaselineBook(setup.rules.policy),
        random.Random(f"planner-{seed}"),
        max_rounds=setup.max_rounds,
        confirm_repeats=setup.confirm_repeats,
        fabric=fabric if known else None,
    )
    pairs_per_round: list[int] = []
    while pairs := loc.next_round():
        pairs_per_round.append(len(pairs))
        measured = network.measure(pairs)
        loc.record(
            [PairRun(plan, "ok", busbw) for plan, busbw in zip(pairs, measured, strict=True)]
        )
    scored = score(faults, flapping, loc.ranked(), loc.rounds, pairs_per_round, setup)
    scored["mismatch"] = loc.ledger is not None and loc.ledger.mismatch is not None
    scored["refused"] = loc.refused
    return scored


def _matches(suspect: Suspect, fault: Fault) -> bool:
    if fault.switch is not None:
        return suspect.kind == "switch" and suspect.node == fault.switch
    if suspect.kind == "uplink":
        return fault.link == suspect.uplink
    if suspect.kind == "node":
        return any(fault.link == Cable(suspect.node, rail) for rail in suspect.rails)
    if suspect.kind == "path":  # the path through a bad cable: its end is named with it
        ends = (suspect.node, suspect.peer or "")
        return any(fault.link == Cable(end, rail) for end in ends for rail in suspect.rails)
    return False


def _on_switch(suspect: Suspect, faults: list[Fault]) -> bool:
    """An uplink of the slow switch named on its own: not the answer, not a healthy link."""
    return suspect.kind == "uplink" and any(f.link == suspect.uplink for f in faults)


def score(
    faults: list[Fault],
    flapping: list[Fault],
    ranked: list[Suspect],
    rounds: int,
    pairs: list[int],
    setup: Setup,
) -> dict[str, Any]:
    budget = ROUND_BUDGET[setup.fault]
    # A flapping cable is a real fault too: naming its node is neither the answer nor false.
    flapped = [s for s in ranked if any(_matches(s, f) for f in flapping)]
    ranked = [s for s in ranked if s not in flapped]
    in_time = [s for s in ranked if s.round <= budget]
    switch = setup.fault in ("spine", "leaf")
    wanted = faults[:1] if switch else faults  # one switch, however many uplinks
    named = [any(_matches(s, f) for s in in_time) for f in wanted]
    false = [
        s
        for s in ranked
        if not any(_matches(s, f) for f in faults) and not (switch and _on_switch(s, faults))
    ]
    top1 = bool(wanted) and bool(in_time) and any(_matches(in_time[0], f) for f in wanted)
    rounds_named = [
        min(s.round for s in ranked if _matches(s, f))
        for f in wanted
        if any(_matches(s, f) for s in ranked)
    ]
    single = setup.fault in ("node-cable", "uplink", "spine", "leaf")
    return {
        "faults": [(f.kind, round(1 - f.factor, 3)) for f in wanted],
        "top1": top1 if single else all(named) and bool(faults),
        "all_named": all(named) if faults else None,
        "named_any_round": bool(wanted)
        and all(any(_matches(s, f) for s in ranked) for f in wanted),
        "false": len(false),
        "flapping_named": len(flapped),
        "rounds": rounds,
        "named_round": max(rounds_named) if rounds_named else None,
        "pairs": pairs,
    }


def _share(trials: list[dict[str, Any]], key: str) -> float:
    return round(sum(bool(t[key]) for t in trials) / len(trials), 4)


def summarise(setup: Setup, trials: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    n = len(trials)
    rounds = [t["rounds"] for t in trials]
    named_rounds = [t["named_round"] for t in trials if t["named_round"] is not None]
    deep = [t for t in trials if t["faults"] and min(s for _, s in t["faults"]) >= 0.3]
    width = max(len(t["pairs"]) for t in trials)
    per_round = [
        round(statistics.mean(t["pairs"][i] for t in trials if len(t["pairs"]) > i), 1)
        for i in range(width)
    ]
    node_sweeps = n * setup.nodes
    faulty = setup.fault != "none"
    false = sum(t["false"] for t in trials)
    return {
        "trials": n,
        "nodes": setup.nodes,
        "rails": setup.rails,
        "leaf_size": setup.leaf_size,
        "spines": setup.spines,
        "routing": setup.routing,
        "fault": setup.fault,
        "slowdown": list(setup.slowdown),
        "flap": setup.flap,
        "noise": {"scale": setup.noise.scale, "sigma": round(setup.noise.sigma, 4)},
        "rules": {
            "cohort_ratio": setup.rules.cohort_ratio,
            "spread_k": setup.rules.spread_k,
            "confirm_repeats": setup.confirm_repeats,
        },
        "top1_correct": _share(trials, "top1") if faulty else None,
        "all_named": _share(trials, "all_named") if faulty else None,
        # Named at all, in any round the sweep had (a sweep without its fabric takes a round
        # more than the budget above: the quiet round).
        "named_any_round": _share(trials, "named_any_round") if faulty else None,
        "top1_correct_30pct": _share(deep, "top1") if deep else None,
        "rounds_median": statistics.median(rounds),
        "rounds_max": max(rounds),
        "named_round_median": statistics.median(named_rounds) if named_rounds else None,
        "named_round_max": max(named_rounds) if named_rounds else None,
        "pairs_per_round": per_round,
        "false_suspects": false,
        "planner_fabric": setup.planner_fabric,
        "flapping": setup.flapping,
        "flapping_named": sum(t["flapping_named"] for t in trials),
        "second_type": list(setup.second_type) if setup.second_type else None,
        "refused": _share(trials, "refused"),
        "error": next((t["refused"] for t in trials if t["refused"]), None),
        "true_routing": setup.true_routing,
        "routing_mismatch_flagged": _share(trials, "mismatch"),
        "false_per_10k_node_sweeps": round(false / node_sweeps * 10_000, 3),
        "seconds": round(seconds, 2),
        "seconds_per_trial": round(seconds / n, 3),
    }


def planning_cost(setup: Setup, seed: int) -> dict[str, Any]:
    """Seconds and peak traced memory of planning each round of one healthy sweep (the
    planner's own work: measuring is the simulator's, and left out). Timed in one pass and
    traced in a second of the same seed: tracing slows allocation several times over."""
    timed = _plan_rounds(setup, seed, trace=False)
    traced = _plan_rounds(setup, seed, trace=True)
    rounds = [
        {"pairs": pairs, "plan_seconds": round(seconds, 3), "peak_mb": round(peak / 2**20, 1)}
        for (pairs, seconds, _), (_, _, peak) in zip(timed, traced, strict=True)
    ]
    return {"nodes": setup.nodes, "rails": setup.rails, "routing": setup.routing, "rounds": rounds}


def _plan_rounds(setup: Setup, seed: int, trace: bool) -> list[tuple[int, float, int]]:
    fabric, nodes = build_fabric(setup, seed)
    network = Network(fabric, [], setup.noise, random.Random(seed))
    if trace:
        tracemalloc.start()
    loc = Localiser(
        nodes,
        setup.rules,
        BaselineBook(setup.rules.policy),
        random.Random(seed),
        max_rounds=setup.max_rounds,
        confirm_repeats=setup.confirm_repeats,
        fabric=fabric,
    )
    rounds = []
    while True:
        if trace:
            tracemalloc.reset_peak()
        started = time.perf_counter()
        pairs = loc.next_round()
        seconds = time.perf_counter() - started
        if not pairs:
            break
        peak = tracemalloc.get_traced_memory()[1] if trace else 0
        rounds.append((len(pairs), seconds, peak))
        measured = network.measure(pairs)
        loc.record([PairRun(plan, "ok", bw) for plan, bw in zip(pairs, measured, strict=True)])
    if trace:
        tracemalloc.stop()
    return rounds


def _share_factor(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    share, _, factor = text.partition(":")
    try:
        parsed = float(share), float(factor)
    except ValueError:
        raise SystemExit(f"--second-type: {text!r} is not SHARE:FACTOR (e.g. 0.1:0.85)") from None
    if not (0 < parsed[0] < 1 and parsed[1] > 0):
        raise SystemExit("--second-type: SHARE between 0 and 1, FACTOR over 0 (e.g. 0.1:0.85)")
    return parsed


def main(argv: list[str] | None = None) -> int:
    # The planner's warnings (a routing that does not fit) are counted in the summary instead.
    logging.getLogger("netmon.sweep").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--rails", type=int, default=8)
    parser.add_argument("--leaf-size", type=int, default=32, help="nodes per leaf (a group)")
    parser.add_argument("--spines", type=int, help="spines per rail (default: --leaf-size)")
    parser.add_argument("--routing", choices=ROUTINGS, default="table")
    parser.add_argument("--fault", choices=CLASSES, default="none")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slowdown", default="0.1-0.9", help="share of the rate a fault takes")
    parser.add_argument("--flap", type=float, default=1.0, help="share of measurements it shows")
    parser.add_argument("--max-rounds", type=int, default=6)
    parser.add_argument("--confirm-repeats", type=int, default=3, help="sweep.confirm_repeats")
    parser.add_argument("--noise-scale", type=float, default=DEFAULT_NOISE_SCALE)
    parser.add_argument(
        "--cohort-ratio",
        type=float,
        default=DEFAULT_COHORT_RATIO,
        help="sweep.cohort_ratio (netmon sweep: 0.8 unless set; 0.97 advised at scale)",
    )
    parser.add_argument("--spread-k", type=float, default=4.0, help="sweep.spread_k")
    parser.add_argument(
        "--true-routing",
        choices=("model", "ecmp"),
        default="model",
        help="how the network really routes: as the planner's model, or ECMP with another hash",
    )
    parser.add_argument(
        "--planner-fabric",
        choices=("known", "none"),
        default="known",
        help="whether the planner is told the fabric (the network always has it)",
    )
    parser.add_argument(
        "--flapping", type=int, default=0, help="cables that fail half their measurements"
    )
    parser.add_argument(
        "--second-type",
        metavar="SHARE:FACTOR",
        help="that share of nodes is a second node type, FACTOR times as fast (a class)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--plan-cost", action="store_true", help="time and trace one healthy sweep's planning"
    )
    args = parser.parse_args(argv)
    low, _, high = args.slowdown.partition("-")
    setup = Setup(
        nodes=args.nodes,
        rails=args.rails,
        leaf_size=args.leaf_size,
        spines=args.spines or args.leaf_size,
        routing=args.routing,
        fault=args.fault,
        slowdown=(float(low), float(high or low)),
        flap=args.flap,
        max_rounds=args.max_rounds,
        confirm_repeats=args.confirm_repeats,
        rules=Rules(cohort_ratio=args.cohort_ratio, spread_k=args.spread_k),
        noise=Noise(tuple(recorded_deviations()), args.noise_scale),
        true_routing=args.true_routing,
        planner_fabric=args.planner_fabric,
        flapping=args.flapping,
        second_type=_share_factor(args.second_type),
    )
    if args.plan_cost:
        print(json.dumps(planning_cost(setup, args.seed)))
        return 0
    started = time.monotonic()
    trials = [run_trial(setup, args.seed * 100_003 + i) for i in range(args.trials)]
    summary = {"seed": args.seed, **summarise(setup, trials, time.monotonic() - started)}
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            print(f"{key:28} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
