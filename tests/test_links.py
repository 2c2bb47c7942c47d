"""Suspect pairs and members from pairwise busbw, judged within each path class only."""

from __future__ import annotations

import itertools

from netmon.probe.pairs import (
    PairOutcome,
    best_per_pair,
    load_ceiling,
    not_judged,
    verdict_at_largest,
)
from netmon.probe.spec import ProbeFailure, ProbeOutcome, ProbeSpec, SizeResult
from netmon.probe.verdict import judge_pairs


def _all_pairs(n: int) -> list[tuple[int, int]]:
    return list(itertools.combinations(range(n), 2))


def test_healthy_board_has_no_suspect() -> None:
    busbw = {pair: 100.0 + 3 * i for i, pair in enumerate(_all_pairs(8))}
    verdict = judge_pairs(busbw, dict.fromkeys(busbw, "NV18"))
    assert verdict.suspect_pairs == () and verdict.suspect_members == ()
    assert "all pairs" in verdict.describe()


def test_one_slow_pair_is_named() -> None:
    busbw = dict.fromkeys(_all_pairs(8), 100.0)
    busbw[(3, 6)] = 50.0
    verdict = judge_pairs(busbw, dict.fromkeys(busbw, "NV18"))
    assert verdict.suspect_pairs == ((3, 6),) and verdict.suspect_members == ()
    assert verdict.pairs[(3, 6)].ratio == 0.5
    assert "3-6" in verdict.describe()


def test_a_gpu_whose_pairs_are_all_low_is_the_suspect_not_its_pairs() -> None:
    busbw = {pair: (20.0 if 5 in pair else 100.0) for pair in _all_pairs(8)}
    verdict = judge_pairs(busbw, dict.fromkeys(busbw, "NV18"))
    assert verdict.suspect_members == (5,) and verdict.suspect_pairs == ()


def test_fewer_links_by_design_raise_no_alarm() -> None:
    # A bridged pair (NV4) next to PCIe pairs (NODE): each is judged against its own class.
    paths = {
        (0, 1): "NV4",
        (0, 2): "NODE",
        (1, 2): "NODE",
        (0, 3): "NODE",
        (1, 3): "NODE",
        (2, 3): "NODE",
    }
    busbw = {pair: (100.0 if path == "NV4" else 20.0) for pair, path in paths.items()}
    verdict = judge_pairs(busbw, paths)
    assert verdict.suspect_pairs == () and verdict.suspect_members == ()
    # A class too small to have a meaningful median is not judged.
    assert verdict.pairs[(0, 1)].ratio is None


def test_pair_order_does_not_matter() -> None:
    busbw = {(1, 0): 10.0, (2, 0): 100.0, (2, 1): 100.0, (3, 0): 100.0}
    verdict = judge_pairs(busbw, dict.fromkeys([(0, 1), (0, 2), (1, 2), (0, 3)], "SYS"))
    assert verdict.suspect_pairs == ((0, 1),)


def _outcome(busbw: float | None, foreign: float | None = None) -> ProbeOutcome:
    spec = ProbeSpec(sizes=(1024,), ranks=2)
    if busbw is None:
        failure = ProbeFailure(phase="measure", rank=1, cause="timeout", detail="late")
        return ProbeOutcome(spec=spec, failure=failure, started_at=0.0, wall_s=1.0)
    result = SizeResult(
        op="all_reduce",
        size_bytes=1024,
        count=256,
        dtype="float32",
        chunks=1,
        time_s=1024 / busbw,
        min_s=0,
        p10_s=0,
        p90_s=0,
        max_s=0,
        cv=0,
        samples=1,
        algbw_bytes_per_second=busbw,
        busbw_bytes_per_second=busbw,
        bus_factor=1.0,
        foreign_cpu_share=foreign,
    )
    return ProbeOutcome(spec=spec, results=(result,), started_at=0.0, wall_s=1.0)


def test_best_of_passes_keeps_the_fastest_and_any_failure() -> None:
    passes = [
        PairOutcome((0, 1), "SYS", _outcome(10.0)),
        PairOutcome((0, 1), "SYS", _outcome(30.0)),
        PairOutcome((0, 2), "SYS", _outcome(30.0)),
        PairOutcome((0, 2), "SYS", _outcome(None)),
    ]
    best = {item.pair: item for item in best_per_pair(passes)}
    assert best[(0, 1)].outcome.results[0].busbw_bytes_per_second == 30.0
    assert not best[(0, 2)].outcome.ok


def test_other_work_slows_a_pair_at_most_by_the_core_it_could_take() -> None:
    # 10 % of 2 CPUs is a fifth of one core: the slower rank kept at least 0.8 of its pace.
    assert load_ceiling(80.0, 0.10, 2) == 100.0
    assert load_ceiling(80.0, None, 2) == 80.0
    assert load_ceiling(80.0, 0.5, 2) == float("inf")  # a whole core taken: no bound


def _board(low: float, foreign: float) -> list[PairOutcome]:
    """Six pairs at 100 measured quietly, and (0, 1) at `low` beside other work."""
    quiet = [PairOutcome(pair, "NV18", _outcome(100.0, 0.0)) for pair in _all_pairs(4)[1:]]
    return [PairOutcome((0, 1), "NV18", _outcome(low, foreign)), *quiet]


def test_a_pair_on_cpu_ranks_is_low_only_beyond_what_the_load_measured_with_it_explains() -> None:
    # 0.6 of the median beside 20 % of 2 CPUs: up to 0.6 / (1 - 0.4) = 1.0 had nothing run.
    results = _board(60.0, 0.20)
    verdict = verdict_at_largest(results, 0.7, max_foreign_cpu=0.25, cpus=2)
    assert verdict.suspect_pairs == () and (0, 1) not in verdict.pairs
    assert verdict.pairs[(2, 3)].class_median == 100.0  # the class is judged without it
    [line] = not_judged(results, verdict, 0.25)
    assert line.startswith("pair 0-1 not judged: low in every try") and "20%" in line
    # Without the CPUs' count (GPU ranks) the figure is judged as measured.
    assert verdict_at_largest(results, 0.7, max_foreign_cpu=0.25).suspect_pairs == ((0, 1),)


def test_a_pair_slower_than_its_load_can_explain_is_low() -> None:
    # 0.3 beside 10 % of 2 CPUs: at most 0.3 / 0.8 = 0.375 of the median, a slow link.
    results = _board(30.0, 0.10)
    verdict = verdict_at_largest(results, 0.7, max_foreign_cpu=0.25, cpus=2)
    assert verdict.suspect_pairs == ((0, 1),)
    assert not_judged(results, verdict, 0.25) == []
