"""The sweep's report: the whole of it for `netmon sweep --json`, and each node's share for its
daemon (node_report.NodeReport). Pure: the localiser's record in, plain values out."""

from __future__ import annotations

import time
from typing import Any

from netmon.sweep.delivery.node_report import NodeReport, PeerResult
from netmon.sweep.locate.localise import Localiser, Suspect
from netmon.sweep.locate.pair_verdict import JudgedPair


def pair_outcome(pair: JudgedPair) -> str:
    """pass or fail for a measured pair; the skip reason (preempted, busy, ...) otherwise."""
    if pair.passed is None:
        return pair.run.outcome
    return "pass" if pair.passed else "fail"


def _rail(verdict: Any) -> dict[str, Any]:
    return {
        "rail": verdict.rail,
        "busbw": verdict.busbw,
        "expected": verdict.expected,
        "ratio": verdict.ratio,
        "passed": verdict.passed,
        "lines": dict(verdict.lines),
        "failed_by": list(verdict.failed_by),
    }


def pair_entry(pair: JudgedPair) -> dict[str, Any]:
    run = pair.run
    measured = [r.busbw for r in pair.rails]
    return {
        "nodes": list(run.plan.nodes),
        "round": run.plan.round,
        "purpose": run.plan.purpose,
        "outcome": pair_outcome(pair),
        "busbw": min(measured) if measured else None,
        "skip": None if pair.passed is not None else run.outcome,
        "detail": run.detail,
        "job": run.job,
        "overhead_seconds": run.overhead_s,
        "seconds": max(0.0, run.finished_at - run.submitted_at),
        "rails": [_rail(r) for r in pair.rails],
    }


def suspect_entry(suspect: Suspect) -> dict[str, Any]:
    """A node: `node`; a path: `node` and `peer`; an uplink: `uplink` (leaf~spine), `leaf`
    and `spine`, with no `node` (no node's daemon exports it)."""
    entry: dict[str, Any] = {"kind": suspect.kind}
    if suspect.kind == "switch":
        entry |= {"switch": suspect.node, "level": suspect.peer}
    elif suspect.kind == "uplink":
        entry |= {"uplink": str(suspect.uplink), "leaf": suspect.node}
        entry["spine"] = suspect.peer
    else:
        entry["node"] = suspect.node
        if suspect.peer is not None:
            entry["peer"] = suspect.peer
    entry |= {"rails": list(suspect.rails), "round": suspect.round}
    if suspect.ratio is not None:
        entry["ratio"] = round(suspect.ratio, 4)
    return entry


def peer_results(pairs: list[JudgedPair], node: str) -> list[PeerResult]:
    """Every rail of every pair `node` was in, once per peer."""
    results: list[PeerResult] = []
    for pair in pairs:
        nodes = pair.run.plan.nodes
        if node not in nodes:
            continue
        outcome = pair_outcome(pair)
        for peer in (n for n in nodes if n != node):
            if pair.passed is None:
                results.append(
                    PeerResult(
                        peer=peer,
                        rail=0,
                        round=pair.run.plan.round,
                        outcome=outcome,  # type: ignore[arg-type]
                        measured_at=pair.run.finished_at,
                    )
                )
                continue
            results.extend(
                PeerResult(
                    peer=peer,
                    rail=r.rail,
                    round=pair.run.plan.round,
                    outcome="pass" if r.passed else "fail",
                    busbw=r.busbw,
                    expected=r.expected,
                    ratio=r.ratio,
                    measured_at=pair.run.finished_at,
                )
                for r in pair.rails
            )
    return results


def node_reports(sweep: str, loc: Localiser, finished_at: float) -> list[NodeReport]:
    """Each node's share: its results, and whether it was named (a path's named end only)."""
    suspects = [s for s in loc.suspects() if s.kind not in ("uplink", "switch")]
    named = {s.node for s in suspects if s.kind == "node"}
    paths: dict[str, list[str]] = {}
    for s in suspects:
        if s.kind == "path" and s.peer is not None:
            paths.setdefault(s.node, []).append(s.peer)
    pairs_of: dict[str, list[JudgedPair]] = {}  # each node's pairs: linear, at 4,096 nodes too
    for pair in loc.judged:
        for n in pair.run.plan.nodes:
            pairs_of.setdefault(n, []).append(pair)
    return [
        NodeReport(
            sweep=sweep,
            node=node,
            at=time.time(),
            finished_at=finished_at,
            results=tuple(peer_results(pairs_of[node], node)),
            suspect=node in named or node in paths,
            suspect_peers=tuple(paths.get(node, ())),
        )
        for node in sorted(pairs_of)
    ]


def empty(sweep: str, partition: str, started_at: float, finished_at: float) -> dict[str, Any]:
    """The report of a sweep that measured nothing: every key of a full one (KEYS), empty. A
    sweep that could not run adds its `error` (docs/SWEEPS.md, "The JSON report")."""
    return {
        "sweep": sweep,
        "partition": partition,
        "started_at": started_at,
        "finished_at": finished_at,
        "wall_seconds": round(finished_at - started_at, 3),
        "rounds": 0,
        "nodes": [],
        "waiting": [],
        "pairs": [],
        "results": [],
        "skips": [],
        "suspects": [],
        "undecided": [],
        "undecided_uplinks": [],
        "routing_mismatch": None,
        "delivered": {},
        "notes": [],
    }


# Every key of the JSON report, full or empty (the runner adds notes, the command delivered).
KEYS = tuple(empty("", "", 0.0, 0.0))


def whole(
    sweep: str, partition: str, loc: Localiser, started_at: float, finished_at: float
) -> dict[str, Any]:
    pairs = [pair_entry(p) for p in loc.judged]
    results = [
        {"node": report.node, **r.model_dump(mode="json")}
        for report in node_reports(sweep, loc, finished_at)
        for r in report.results
    ]
    return empty(sweep, partition, started_at, finished_at) | {
        "rounds": loc.rounds,
        "nodes": sorted(n.name for n in loc.nodes),
        "waiting": list(loc.waiting),
        "pairs": pairs,
        "results": results,
        "skips": [
            {k: p[k] for k in ("nodes", "round", "skip", "detail")}
            for p in pairs
            if p["skip"] is not None
        ],
        "suspects": [suspect_entry(s) for s in loc.suspects()],
        "undecided": loc.undecided(),
        "undecided_uplinks": [
            str(link) for link in (loc.ledger.undecided() if loc.ledger is not None else [])
        ],
        # Why no uplink was named: the failures across leaves did not fit the routing model.
        "routing_mismatch": loc.ledger.mismatch if loc.ledger is not None else None,
    }
