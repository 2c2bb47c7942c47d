"""What each phase of a run cost its ranks in CPU time: the marks ranks send, their reaper's total.

A rank reads its own CPU time (every thread's: gloo's and NCCL's too) as it enters each phase and
when it is done; whoever reaps it (the rank zygote, or the launcher for a spawned rank) has its
whole time from wait4, its exit included. A phase's cost is the difference between its mark and
the next; `start` runs from the fork (or the exec) to the first phase, `exit` from the last mark
to the reaping. A rank killed before it was done has no `exit`: its last phase runs to its
reaping; one not reaped by us (its zygote lost) has only what it marked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# The `phase` label of netmon_probe_rank_cpu_seconds_total, in the order a run goes through them.
CPU_PHASES = ("start", "rendezvous", "init", "warmup", "measure", "check", "teardown", "exit")


@dataclass
class CpuMarks:
    """One rank's marks: (phase entered, its CPU seconds then), from the fork at 0."""

    marks: list[tuple[str, float]] = field(default_factory=lambda: [("start", 0.0)])
    total_s: float | None = None  # from the reaper, once reaped

    def enter(self, phase: str, cpu_s: float) -> None:
        if phase in CPU_PHASES:
            self.marks.append((phase, cpu_s))

    def by_phase(self) -> dict[str, float]:
        ends = [cpu for _, cpu in self.marks[1:]]
        if self.total_s is not None:
            ends.append(self.total_s)
        spent: dict[str, float] = {}
        for (phase, began), ended in zip(self.marks, ends, strict=False):
            spent[phase] = spent.get(phase, 0.0) + max(0.0, ended - began)
        return spent


def summed(ranks: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Every rank's phases added up, in CPU_PHASES order (a phase no rank reached is left out)."""
    total: dict[str, float] = {}
    for spent in ranks:
        for phase, seconds in spent.items():
            total[phase] = total.get(phase, 0.0) + seconds
    return {phase: round(total[phase], 6) for phase in CPU_PHASES if phase in total}
