"""A run's rank CPU by phase (netmon.probe.rankcpu): the difference between one mark and the next,
the reaper's total closing the last, sizes' phases added up, ranks summed in the phases' order."""

from __future__ import annotations

import pytest

from netmon.probe.rankcpu import CPU_PHASES, CpuMarks, summed


def marks(*entered: tuple[str, float], total: float | None = None) -> CpuMarks:
    rank = CpuMarks(total_s=total)
    for phase, cpu in entered:
        rank.enter(phase, cpu)
    return rank


def test_each_phase_costs_up_to_the_next_mark_and_exit_up_to_the_reapers_total() -> None:
    rank = marks(
        ("rendezvous", 0.010),
        ("init", 0.012),
        ("warmup", 0.020),
        ("measure", 0.030),
        ("warmup", 0.100),  # the second size
        ("measure", 0.110),
        ("teardown", 0.200),
        ("exit", 0.205),  # "done"
        total=0.215,
    )
    spent = rank.by_phase()
    assert spent == pytest.approx(
        {
            "start": 0.010,
            "rendezvous": 0.002,
            "init": 0.008,
            "warmup": 0.020,
            "measure": 0.160,
            "teardown": 0.005,
            "exit": 0.010,
        }
    )
    assert sum(spent.values()) == pytest.approx(0.215)  # every CPU second of the rank, once


def test_a_rank_killed_before_it_was_reaped_by_us_has_no_exit_figure() -> None:
    spent = marks(("rendezvous", 0.01), ("init", 0.02)).by_phase()
    assert spent == pytest.approx({"start": 0.01, "rendezvous": 0.01})
    assert "init" not in spent  # its end is unknown: not guessed


def test_an_unknown_phase_is_not_a_label() -> None:
    assert "spawn" not in marks(("spawn", 0.01), total=0.02).by_phase()


def test_ranks_are_summed_in_the_order_a_run_goes() -> None:
    total = summed([{"measure": 0.2, "start": 0.01}, {"start": 0.02, "exit": 0.005}])
    assert list(total) == [p for p in CPU_PHASES if p in ("start", "measure", "exit")]
    assert total == pytest.approx({"start": 0.03, "measure": 0.2, "exit": 0.005})
