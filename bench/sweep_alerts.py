"""How soon the sweep alerts catch a fault that comes and goes, and how often they page on a
healthy node, side by side: NetmonSweepSuspect (two sweeps in a row) alone, and with
NetmonSweepSuspectFlapping (3 onsets in the last 12 sweeps) beside it.

Each simulated node is swept `--sweeps` times; each sweep names it with probability p,
independently (a flapping fault: the share of single sweeps that name it, which
bench/sweep_sim.py measures with --flap; a healthy node: its false-suspect rate). The counts
are the daemon's own (netmon.sweep.delivery.inbox.SweepState, what POST /sweep keeps), and the alert
conditions are the rules' (deploy/prometheus/netmon-rules.yaml).

    python bench/sweep_alerts.py --json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from netmon.sweep.delivery.inbox import SweepState
from netmon.sweep.delivery.node_report import NodeReport

# The alerts' thresholds (deploy/prometheus/netmon-rules.yaml).
IN_A_ROW = 2
ONSETS = 3


def _report(index: int, named: bool) -> NodeReport:
    return NodeReport(
        sweep=f"{index:013d}-000000", node="n1", at=0.0, finished_at=0.0, results=(), suspect=named
    )


def _node(p: float, sweeps: int, rng: random.Random) -> dict[str, tuple[int | None, int]]:
    """Per condition: the first sweep after which it holds (None: never), and after how many
    of the sweeps it holds, that one included (an alert that comes and goes with the fault
    holds for few)."""
    state = SweepState()
    first: dict[str, int | None] = {"in_a_row": None, "either": None}
    held = {"in_a_row": 0, "either": 0}
    for index in range(sweeps):
        state = state.after(_report(index, rng.random() < p))
        in_a_row = state.suspect_sweeps >= IN_A_ROW
        flapping = state.suspect_onsets >= ONSETS and not in_a_row
        for key, holds in (("in_a_row", in_a_row), ("either", in_a_row or flapping)):
            held[key] += holds
            if holds and first[key] is None:
                first[key] = index + 1
    return {key: (first[key], held[key]) for key in first}


def summarise(p: float, sweeps: int, nodes: int, seed: int) -> dict[str, Any]:
    rng = random.Random(f"{seed}-{p}-{sweeps}")
    runs = [_node(p, sweeps, rng) for _ in range(nodes)]
    row: dict[str, Any] = {"p_named": p, "sweeps": sweeps, "nodes": nodes}
    for key in ("in_a_row", "either"):
        fired = [(first, held) for first, held in (run[key] for run in runs) if first is not None]
        row[f"{key}_fired"] = round(len(fired) / nodes, 4)
        row[f"{key}_median_sweep"] = statistics.median(f for f, _ in fired) if fired else None
        # The sweeps after the first firing, pooled over the nodes: the first always fires.
        after = sum(sweeps - first for first, _ in fired)
        still = sum(held - 1 for _, held in fired)
        row[f"{key}_held_after_first"] = round(still / after, 3) if after else None
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4000, help="simulated nodes per row")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    # A day of hourly sweeps for faults named in 26 %, 32 % and 50 % of sweeps; a month for
    # healthy nodes named by noise (0.8 %: a handful of CPU-rank nodes at the recordings' own
    # noise; 0.1 %: a large fabric).
    rows = [summarise(p, 24, args.nodes, args.seed) for p in (0.26, 0.32, 0.5)]
    rows += [summarise(p, 720, args.nodes // 2, args.seed) for p in (0.008, 0.001)]
    if args.json:
        print(json.dumps({"seed": args.seed, "rows": rows}))
    else:
        for row in rows:
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
