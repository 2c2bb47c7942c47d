"""How one pair's pods on Kubernetes came out. Pure: what the sweep saw of the pods, their logs
and Kueue's Workload in, the pair's outcome out (the Slurm counterpart is srun_result).

A pair is decided as soon as it can be: measured (or failed) once every pod has ended and its
log is read; preempted once Kueue evicted its JobSet's Workload for another workload, or one of
its pods was preempted, evicted or deleted; busy once its pods have found no node for
BUSY_AFTER_S. At the deadline, what is left is busy (never admitted, or no node), an error (a
container that cannot start) or a timeout (the ranks still running).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from netmon.sweep.kube.pod_ranks import POD_PREFIX
from netmon.sweep.kube.state import Admission, PodView
from netmon.sweep.locate.plan import PairPlan
from netmon.sweep.ranks.rank import EXIT_BUSY
from netmon.sweep.scheduler import PairRun, RunOutcome
from netmon.sweep.slurm import srun_result

# A pod that finds no node this long after it could first: the node is not free (a job took
# it since the sweep listed it), as srun --immediate says on Slurm. Long enough for the last
# round's pods on the node to finish ending.
BUSY_AFTER_S = 20.0
EXIT_DEADLINE = 124  # a rank's watchdog (netmon.sweep.ranks.rank)
# DisruptionTarget reasons that mean someone else wanted the node: a pod of a higher priority,
# or an eviction (a drain). The others (a NoExecute taint, the kubelet) are errors.
PREEMPTED_BY = frozenset({"PreemptionByScheduler", "EvictionByEvictionAPI"})


@dataclass(frozen=True)
class PodEnd:
    """A pod's last line (netmon.sweep.kube.pod_ranks): where it ran and how its ranks ended."""

    node: str
    index: int
    exits: tuple[int, ...]
    detail: str = ""


def pod_end(log: str) -> PodEnd | None:
    for line in reversed(log.splitlines()):
        if not line.startswith(POD_PREFIX):
            continue
        try:
            record = json.loads(line[len(POD_PREFIX) :])
            exits = tuple(int(code) for code in record["exits"])
            return PodEnd(
                str(record["node"]), int(record["index"]), exits, record.get("detail", "")
            )
        except (ValueError, KeyError, TypeError):
            return None
    return None


def last_error(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("NETMON-SWEEP")]
    errors = [line for line in lines if "error" in line.lower()] or lines
    return errors[-1][:200] if errors else "no message"


def judge_logs(plan: PairPlan, logs: Sequence[str]) -> tuple[RunOutcome, str, srun_result.Found]:
    """The outcome of a pair every pod of which ended, from their logs (one per pod)."""
    text = "\n".join(logs)
    found = srun_result.parse(text, plan.rails)
    ends = [pod_end(log) for log in logs]
    if any(end is None for end in ends):
        return "error", f"a pod ended without its report: {last_error(text)}", found
    done = [end for end in ends if end is not None]
    nodes = sorted(end.node for end in done)
    if nodes != sorted(plan.nodes):
        return "error", f"the pods ran on {', '.join(nodes)}, not the pair's nodes", found
    exits = [code for end in done for code in end.exits]
    if found.busbw and found.transport:
        return "transport_mismatch", "; ".join(found.transport)[:200], found
    if found.busbw:
        return "ok", "", found
    if EXIT_BUSY in exits:
        return "busy", "a GPU of the pair was in use", found
    if EXIT_DEADLINE in exits:
        return "timeout", "the ranks reached the pair's deadline", found
    detail = next((end.detail for end in done if end.detail), "")
    return "error", detail or f"rank exits {exits}: {last_error(text)}", found


@dataclass
class PairWatch:
    """One pair while its round runs: what its pods did, until it is decided."""

    index: int
    plan: PairPlan
    jobset: str
    submitted_at: float
    seen: dict[str, PodView] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)
    unschedulable_since: float | None = None
    decided: tuple[RunOutcome, str] | None = None
    found: srun_result.Found = field(default_factory=lambda: srun_result.Found((), None))
    finished_at: float = 0.0

    def decide(self, outcome: RunOutcome, detail: str, now: float) -> None:
        if self.decided is None:
            self.decided, self.finished_at = (outcome, detail), now

    def observe(
        self, pods: Sequence[PodView], now: float, deleted_means_preempted: bool = True
    ) -> None:
        """This poll's pods of the pair, every one of them: a pod seen before and gone now,
        its log unread, was deleted (by a preemption, unless its JobSet had ended)."""
        if self.decided is not None:
            return
        current = {pod.name: pod for pod in pods}
        for pod in pods:
            if pod.disruption is not None:
                where = f"node {pod.node}" if pod.node else "its node"
                outcome: RunOutcome = "preempted" if pod.disruption in PREEMPTED_BY else "error"
                self.decide(outcome, f"{pod.disruption} on {where}", now)
                return
        for name, pod in self.seen.items():
            if deleted_means_preempted and name not in current and name not in self.logs:
                self.decide("preempted", f"pod {name} on {pod.node or '?'} was deleted", now)
                return
        self.seen.update(current)
        waiting = [pod.unschedulable for pod in pods if pod.unschedulable and not pod.node]
        if not waiting:
            self.unschedulable_since = None
        elif self.unschedulable_since is None:
            self.unschedulable_since = now
        elif now - self.unschedulable_since >= BUSY_AFTER_S:
            self.decide("busy", f"no node for a pod: {waiting[0]}"[:200], now)

    def logs_wanted(self) -> list[str]:
        if self.decided is not None:
            return []
        return [name for name, pod in self.seen.items() if pod.ended and name not in self.logs]

    def read(self, name: str, log: str, now: float) -> None:
        """A pod's log; once every index has one, the pair is judged."""
        self.logs[name] = log
        by_index = {
            pod.index: self.logs[pod.name]
            for pod in self.seen.values()
            if pod.index is not None and pod.name in self.logs
        }
        if len(by_index) == len(self.plan.nodes):
            outcome, detail, self.found = judge_logs(self.plan, list(by_index.values()))
            self.decide(outcome, detail, now)

    def evicted(self, admission: Admission, now: float) -> None:
        reason, message = admission.evicted, admission.message
        if reason == "Preempted":
            self.decide("preempted", f"Kueue preempted the round's Workload: {message}", now)
        elif reason == "PodsReadyTimeout":
            self.decide("busy", f"the pods did not start in time: {message}", now)
        elif reason is not None:
            self.decide("error", f"Kueue evicted the round's Workload ({reason}): {message}", now)

    def ended_without(self, message: str, now: float) -> None:
        """The JobSet failed (a Job past its deadline) before this pair ended."""
        outcome: RunOutcome = "timeout" if "deadline" in message.lower() else "error"
        self.decide(outcome, f"the JobSet failed: {message}"[:200], now)

    def expire(self, admitted: bool, waiting_for: str, now: float) -> None:
        """The deadline came with the pair undecided."""
        pods = list(self.seen.values())
        stuck = next((p.unschedulable for p in pods if p.unschedulable and not p.node), None)
        cannot_start = next((p.waiting for p in pods if p.waiting), None)
        if not admitted:
            self.decide("busy", f"not admitted by Kueue in time: {waiting_for}".strip(": "), now)
        elif stuck:
            self.decide("busy", f"no node for a pod: {stuck}"[:200], now)
        elif cannot_start:
            self.decide("error", cannot_start[:200], now)
        elif not pods:
            self.decide("busy", "admitted, but no pod was created in time", now)
        else:
            self.decide("timeout", "the pair did not finish in time", now)

    def run(self) -> PairRun:
        assert self.decided is not None
        outcome, detail = self.decided
        return PairRun(
            plan=self.plan,
            outcome=outcome,
            busbw=self.found.busbw if outcome == "ok" else (),
            detail=detail,
            job=self.jobset,
            submitted_at=self.submitted_at,
            ranks_started_at=self.found.started_at,
            finished_at=self.finished_at,
        )
