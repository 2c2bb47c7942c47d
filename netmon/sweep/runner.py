"""One sweep, start to end: the nodes from the scheduler, rounds planned and judged by the
localiser, run by the scheduler, until every failed pair is explained, the rounds run out or
the deadline comes; then the history learns and each node's daemon gets its share."""

from __future__ import annotations

import logging
import random
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from netmon.baseline.book import BaselineBook
from netmon.errors import UsageError
from netmon.sweep import report
from netmon.sweep.locate import fabric_file
from netmon.sweep.locate.fabric import Fabric, flat
from netmon.sweep.locate.judge import Rules
from netmon.sweep.locate.localise import Localiser
from netmon.sweep.locate.plan import SweepNode
from netmon.sweep.scheduler import Scheduler, SchedulerError
from netmon.sweep.settings import SweepConfig

log = logging.getLogger(__name__)
# A round is not started with less of the deadline left than this: its pairs could not finish.
MIN_ROUND_S = 15.0
FABRIC_ROUNDS = 6  # sweep.max_rounds's default with a fabric


class CouldNotRun(Exception):
    """The sweep could not run at all (exit 3); the message says why, in one line, and
    `partial` is the report of what it did before it gave up (pairs skipped), if anything."""

    def __init__(self, message: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.partial = partial or {}


def new_sweep_id(now: float | None = None) -> str:
    """Sortable by start time (milliseconds), unique by its random tail."""
    millis = int((time.time() if now is None else now) * 1000)
    return f"{millis:013d}-{secrets.token_hex(3)}"


@dataclass
class Outcome:
    whole: dict[str, Any]
    localiser: Localiser
    finished_at: float
    measured: int = 0
    notes: list[str] = field(default_factory=list)


def rules_of(settings: SweepConfig, policy: Any) -> Rules:
    return Rules(
        policy=policy,
        size=settings.size,
        cohort_ratio=settings.cohort_ratio,
        min_cohort=settings.min_cohort,
        min_busbw=settings.min_busbw,
        spread_k=settings.spread_k,
    )


def _fabric(scheduler: Scheduler, settings: SweepConfig, nodes: list[SweepNode]) -> Fabric | None:
    """The fabric sweep.fabric names: the scheduler's switch tree, or a file; unset, the
    scheduler's switch tree where it keeps one (a sweep without a fabric claims less)."""
    rails = max(n.rails for n in nodes)
    if settings.fabric is None:
        try:
            text = scheduler.topology()
        except SchedulerError:
            return None
        if text is None:
            return None
        try:
            return fabric_file.parse_topology(text, rails, settings.routing)
        except ValueError as exc:
            log.warning("sweep: the scheduler's switches are not used: %s", exc)
            return None
    if settings.fabric == "flat":
        return flat([n.name for n in nodes], rails)
    if settings.fabric == "slurm":
        try:
            text = scheduler.topology()
        except SchedulerError as exc:
            raise CouldNotRun(f"sweep.fabric: slurm: {exc}") from None
        if text is None:
            raise CouldNotRun(
                "sweep.fabric: slurm, but the scheduler lists no switches (configure "
                "TopologyPlugin=topology/tree, or give a fabric file)"
            )
        return fabric_file.parse_topology(text, rails, settings.routing)
    try:
        return fabric_file.load(Path(settings.fabric), rails, settings.routing)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise UsageError(f"sweep.fabric: {exc}") from None


def _max_rounds(settings: SweepConfig, fabric: Fabric | None) -> int:
    """sweep.max_rounds where set; else 4, or 6 with a fabric (uplinks take 3 to 4 rounds)."""
    if fabric is None or "max_rounds" in settings.model_fields_set:
        return settings.max_rounds
    return FABRIC_ROUNDS


def run_sweep(
    scheduler: Scheduler,
    settings: SweepConfig,
    history: BaselineBook,
    *,
    sweep: str,
    partition: str,
    nodelist: str | None,
    rng: random.Random,
) -> Outcome:
    started_at = time.time()
    deadline = started_at + settings.deadline
    try:
        nodes = scheduler.nodes(partition, nodelist)
        others = scheduler.other_sweeps()
    except SchedulerError as exc:
        raise CouldNotRun(str(exc)) from None
    if others:
        raise CouldNotRun(f"another sweep is running: jobs {', '.join(others[:5])}")
    if len(nodes) < 2:
        where = f"of {nodelist} " if nodelist else ""
        raise CouldNotRun(
            f"partition {partition} has {len(nodes)} idle node(s) {where}(a sweep needs 2)"
        )
    fabric = _fabric(scheduler, settings, nodes)
    loc = Localiser(
        nodes,
        rules_of(settings, history.policy),
        history,
        rng,
        max_rounds=_max_rounds(settings, fabric),
        odd=settings.odd,
        confirm_repeats=settings.confirm_repeats,
        fabric=fabric,
        max_nodes_without_fabric=settings.max_nodes_without_fabric,
    )
    notes: list[str] = []
    try:
        _rounds(scheduler, loc, deadline, notes)
    finally:
        scheduler.cleanup()
    loc.learn()
    finished_at = time.time()
    whole = report.whole(sweep, partition, loc, started_at, finished_at)
    if loc.undecided():
        notes.append(f"failed, neither cleared nor named: {', '.join(loc.undecided())}")
    if whole["routing_mismatch"]:
        notes.append(whole["routing_mismatch"])
    whole["notes"] = notes
    if loc.refused is not None:
        raise CouldNotRun(loc.refused, whole)
    measured = sum(1 for pair in loc.judged if pair.passed is not None)
    if not measured:
        first = next((p.run.detail for p in loc.judged if p.run.detail), "no pair ran")
        raise CouldNotRun(f"no pair could be measured: {first}", whole)
    return Outcome(whole, loc, finished_at, measured, notes)


def _rounds(
    scheduler: Scheduler,
    loc: Localiser,
    deadline: float,
    notes: list[str],
) -> None:
    while deadline - time.time() >= MIN_ROUND_S:
        try:
            # Nodes a job took (or an admin drained) since the last round leave the sweep.
            names = [n.name for n in loc.nodes]
            taken = scheduler.taken(names) if loc.rounds else set()
            pairs = loc.next_round([n for n in names if n not in taken])
            if not pairs:
                return
            log.info("sweep: round %d, %d pair(s)", loc.rounds, len(pairs))
            runs = scheduler.run_round(pairs, deadline)
        except SchedulerError as exc:
            log.warning("sweep: stopped after round %d: %s", loc.rounds, exc)
            notes.append(f"stopped after round {loc.rounds}: {exc}")
            return
        for pair in loc.record(runs):
            log.info(
                "sweep: round %d %s: %s %s",
                loc.rounds,
                pair.run.plan.label,
                report.pair_outcome(pair),
                pair.run.detail,
            )
