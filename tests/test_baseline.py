from __future__ import annotations

import itertools
import json
import math
import statistics
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from netmon.baseline import (
    BaselineBook,
    BaselineKey,
    BaselinePolicy,
    Verdict,
    load,
    robust,
    save,
)

KEY: BaselineKey = ("link", "all_reduce", 1 << 20, "NV4", 2)
OTHER: BaselineKey = ("node", "all_gather", 64 << 20, "SYS", 8)
GOOD = 100e9
LOW = 50e9  # ratio 0.5 < 0.8


def centre(values: list[float]) -> float:
    """The baseline of `values` as the rule takes it: their mean without the lowest and the
    highest tenth, and at least one of each (at least one value kept)."""
    ordered = sorted(values)
    cut = min(max(len(ordered) // 10, 1), (len(ordered) - 1) // 2)
    kept = ordered[cut : len(ordered) - cut]
    return math.fsum(kept) / len(kept)


def plain(**fields: object) -> BaselinePolicy:
    """The M-of-N rule alone: no settling after start, no spread margin (tests/test_signal.py
    covers those)."""
    ratio = fields.get("ratio", 0.8)
    floor = min(0.7, ratio) if isinstance(ratio, float) else 0.7
    defaults = {"settle": 0, "spread_k": 0, "floor": floor}
    return BaselinePolicy.model_validate({**defaults, **fields})


# Results one second apart from an hour's start: every test's results fall in one hour, so the
# reference stays young (the median of what was learned) unless a test says otherwise.
T0 = 1_767_225_600.0
CLOCK = itertools.count()


def feed(book: BaselineBook, values: Iterable[float], key: BaselineKey = KEY) -> list[Verdict]:
    return [book.observe(key, value, at=T0 + next(CLOCK) % 3000) for value in values]


def core(verdict: Verdict | None) -> tuple[object, ...]:
    """What a verdict says, without when it was judged."""
    assert verdict is not None
    return (
        verdict.baseline,
        verdict.ratio,
        verdict.degraded,
        verdict.healthy_samples,
        verdict.low_recent,
        verdict.reason,
    )


def mature(**fields: object) -> BaselinePolicy:
    """plain(), with a baseline window of min_samples (5): the first results that form the
    baseline are a whole window, so the series is past its young phase (where every usable
    result is learned at once) from then on."""
    return plain(**{"window": 5, "min_samples": 5, **fields})


def learned_book(policy: BaselinePolicy | None = None, value: float = GOOD) -> BaselineBook:
    """A book whose KEY has just formed its baseline at `value`."""
    policy = policy or plain()
    book = BaselineBook(policy)
    feed(book, [value] * policy.min_samples)
    return book


# --- learning


def test_no_verdict_until_min_samples_and_every_result_is_learned() -> None:
    book = BaselineBook(plain())
    verdicts = feed(book, [100.0, 10.0, 100.0, 100.0])  # a low-looking value is learned too
    assert [v.baseline for v in verdicts] == [None] * 4
    assert [v.healthy_samples for v in verdicts] == [1, 2, 3, 4]
    assert not any(v.degraded for v in verdicts)
    assert all(v.ratio is None and v.low_recent == 0 for v in verdicts)

    (formed,) = feed(book, [200.0])
    # The baseline is the trimmed mean of what was learned (the 10 is learned while young, and
    # left out with the 200 as the lowest and the highest).
    middle = centre([100.0, 10.0, 100.0, 100.0, 200.0])
    assert middle == 100.0
    assert core(formed) == (middle, 200.0 / middle, False, 5, 0, None)
    # A young reference: the median of what was learned in the hour so far.
    assert formed.reference == 100.0 and not formed.reference_mature


@pytest.mark.parametrize("bad", [0.0, -5.0, math.nan, math.inf, -math.inf])
def test_unusable_results_are_not_learned_while_learning(bad: float) -> None:
    book = BaselineBook(plain())
    feed(book, [100.0, 100.0])
    (verdict,) = feed(book, [bad])
    assert core(verdict) == (None, None, False, 2, 0, None)


def test_unknown_key_has_no_verdict() -> None:
    book = learned_book()
    assert book.verdict(OTHER) is None
    assert set(book.verdicts()) == {KEY}


# --- degrading and clearing


def test_a_single_noisy_low_result_does_not_degrade() -> None:
    book = learned_book()
    verdicts = feed(book, [LOW, GOOD, GOOD, GOOD, GOOD, GOOD])
    assert verdicts[0].ratio == 0.5
    assert verdicts[0].low_recent == 1
    assert not any(v.degraded for v in verdicts)


def test_m_of_n_low_degrades_on_the_mth_low_result() -> None:
    # M=3 of N=5. Once the recent level (the median of the last 5 here: the window) exists, M
    # low turn only with it under its line too, which the Mth low takes it to (3 of 5 LOW).
    book = learned_book(mature())
    verdicts = feed(book, [LOW, GOOD, LOW, GOOD, LOW])
    assert [v.degraded for v in verdicts] == [False, False, False, False, True]
    assert [v.low_recent for v in verdicts] == [1, 1, 2, 2, 3]


def test_lows_spread_wider_than_n_do_not_degrade() -> None:
    book = learned_book()
    verdicts = feed(book, [LOW, *[GOOD] * 4, LOW, *[GOOD] * 4, LOW])
    assert not any(v.degraded for v in verdicts)
    assert max(v.low_recent for v in verdicts) == 1


def test_a_turn_the_next_results_do_not_bear_out_clears_after_n_of_them() -> None:
    policy = plain()
    book = learned_book(policy)
    assert feed(book, [LOW, LOW, LOW])[-1].degraded
    # Back at once (not held): M of the last N healthy after three, and the median of the N
    # results since the turn back over the clearing line after N.
    verdicts = feed(book, [GOOD] * policy.of)
    assert [v.degraded for v in verdicts] == [True] * (policy.of - 1) + [False]
    assert [v.low_recent for v in verdicts][:3] == [3, 3, 2]


def test_clearing_a_held_fault_needs_a_window_of_results_since_it_turned() -> None:
    policy = plain()
    book = learned_book(policy)
    # Held: the first N results since the turn have their median under the clearing line.
    held = [LOW] * policy.of
    assert feed(book, [LOW, LOW, LOW, *held])[-1].degraded
    # From then on the median of the results since the turn counts once there is a baseline
    # window (20) of them (the level window, 9, is shorter): results from before the fault
    # prove nothing, and a burst of good ones inside a held cut is not a repair.
    needed = max(policy.level_size, min(policy.window, policy.clear_window))
    verdicts = feed(book, [GOOD] * (needed - len(held)))
    assert [v.degraded for v in verdicts] == [True] * (needed - len(held) - 1) + [False]


def test_one_good_result_among_lows_does_not_clear() -> None:
    book = learned_book()
    verdicts = feed(book, [LOW, LOW, LOW, GOOD, LOW, GOOD, LOW])
    assert [v.degraded for v in verdicts] == [False, False, True, True, True, True, True]


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_unusable_results_count_as_low_once_a_baseline_exists(bad: float) -> None:
    book = learned_book()
    verdicts = feed(book, [bad, bad, bad])
    assert [v.degraded for v in verdicts] == [False, False, True]
    assert all(v.ratio is None and v.baseline == GOOD for v in verdicts)
    assert verdicts[-1].healthy_samples == 5


def test_threshold_is_strictly_below_ratio_times_baseline() -> None:
    book = learned_book(value=100.0)
    verdicts = feed(book, [80.0, 80.0, 80.0])  # exactly R x baseline is not low
    assert [v.low_recent for v in verdicts] == [0, 0, 0]


# --- what is learned


def test_low_and_degraded_results_are_never_learned() -> None:
    book = learned_book(mature())  # past young, where every usable result is learned at once
    (low,) = feed(book, [LOW])
    assert low.healthy_samples == 5  # low while healthy: not learned
    feed(book, [LOW, LOW])
    # Degraded: good-looking and low results alike stay out of the window.
    verdicts = feed(book, [LOW, GOOD * 1.5, LOW, GOOD * 1.5, LOW])
    assert all(v.degraded for v in verdicts)
    assert all(v.healthy_samples == 5 and v.baseline == GOOD for v in verdicts)


def test_the_result_that_clears_a_degradation_is_learned() -> None:
    # Past young, and learned as soon as it is judged (learn_delay 0): the clearing result is
    # learned, none of the results before it (the series was degraded then).
    policy = mature(learn_delay=0)
    book = learned_book(policy)
    feed(book, [LOW, LOW, LOW, *[120e9] * (policy.of - 1)])
    (cleared,) = feed(book, [120e9])
    assert not cleared.degraded
    # The window (5) holds four GOOD and the clearing result; the first GOOD is older.
    assert cleared.healthy_samples == 5
    learned = [GOOD] * 5 + [120e9]
    assert feed(book, [GOOD])[0].baseline == centre(learned)


def test_baseline_is_the_mean_of_the_last_6k_learned_results() -> None:
    policy = plain(window=4, min_samples=3, trigger=1, of=1, learn_delay=0)
    book = BaselineBook(policy)
    # Rising values are never low and the recent level runs over the band's top, so every one
    # is learned (at once: learn_delay 0); the baseline is the mean of the newest 6 x K.
    values = [10.0 * n for n in range(1, 29)]
    feed(book, values)
    (verdict,) = feed(book, [290.0])
    newest = values[-6 * policy.window :]
    assert verdict.baseline == math.fsum(newest) / len(newest)  # 50 to 280: 165
    assert verdict.ratio == 290.0 / verdict.baseline
    assert verdict.healthy_samples == 4


def test_the_baseline_judged_against_excludes_the_result_itself() -> None:
    book = learned_book(value=100.0)
    (verdict,) = feed(book, [120.0])
    assert verdict.baseline == 100.0 and verdict.ratio == 1.2
    # Young (fewer than a window learned): the 120, at the band's ceiling (2 x 100 - the low
    # line, 80), is learned at once, and counts next time (as the highest, left out until a
    # second one comes).
    (verdict,) = feed(book, [120.0])
    assert verdict.baseline == centre([100.0] * 5 + [120.0]) == 100.0
    learned = [100.0] * 5 + [120.0] * 2
    baseline = centre(learned)  # 520 / 5
    (verdict,) = feed(book, [200.0])
    assert verdict.baseline == baseline == 104.0 and verdict.ratio == 200.0 / baseline
    assert verdict.healthy_samples == len(learned)
    # Over the ceiling (2 x 104 - 0.8 x 104 = 124.8), and no recent level yet: judged, never
    # learned, even while young.
    assert feed(book, [100.0])[0].baseline == baseline


def test_keys_are_independent_and_verdicts_is_a_snapshot() -> None:
    policy = mature()
    book = learned_book(policy)
    feed(book, [LOW] * 3)
    feed(book, [GOOD] * 5, key=OTHER)
    snapshot = book.verdicts()
    feed(book, [GOOD] * 20)
    assert snapshot[KEY].degraded
    assert not snapshot[OTHER].degraded
    # Cleared, and every learned result GOOD (the lows never were): a full window of them.
    assert core(book.verdict(KEY)) == (GOOD, 1.0, False, policy.window, 0, None)


def test_a_series_born_cut_is_judged_against_its_first_results_and_never_learns_the_cut() -> None:
    policy = plain()
    book = BaselineBook(policy)
    before, cut = [GOOD, 1.02 * GOOD, 0.98 * GOOD], 0.7 * GOOD  # a 30 % cut from result 4
    # Young: until min_samples are learned every usable result is (the cut's first two too);
    # every young result goes to the young check, which finds the change once YOUNG_AFTER
    # (10) of them stand under (1 + 3 x ratio) / 4 of the results before it, none reaching them.
    verdicts = feed(book, [*before, *[cut] * 10])
    # (The rolling rule may turn it sooner, against the baseline the first two cut results
    # pulled down: 88 here, the cut at 0.8 x it; the young check then puts the level back.)
    found = verdicts[-1]
    assert found.degraded and found.reason == "low"
    # Everything learned is forgotten: the series is judged against the level the three
    # before showed (their midmean, its seed) alone.
    assert found.healthy_samples == 0
    # Held: a day of the cut is never learned, and never clears.
    verdicts = feed(book, [cut] * 200)
    assert all(v.expected == robust.midmean(before) for v in verdicts)
    assert all(v.degraded and v.healthy_samples == 0 for v in verdicts)
    # Back at the level before: the fault held, so it clears once the median of the last
    # clear_window results since the turn is back: on the majority of them.
    back = feed(book, [GOOD] * (policy.clear_window // 2 + 1))
    assert all(v.degraded for v in back[:-1]) and not back[-1].degraded
    # Cleared, still young: learned again from here, at once.
    assert feed(book, [GOOD])[0].healthy_samples == 2  # the clearing result and this one


def test_a_series_cut_after_it_settled_is_judged_against_its_settling_results() -> None:
    # The settling results are neither learned nor judged, but a cold first run is slower,
    # never faster: settling results over every learned one say the link was cut after them.
    policy = plain(settle=2)
    book = BaselineBook(policy)
    settling, cut = [GOOD, 0.96 * GOOD], 0.7 * GOOD
    verdicts = feed(book, [*settling, *[cut] * 10])
    assert not any(v.degraded for v in verdicts[:-1])
    assert verdicts[-1].degraded and verdicts[-1].reason == "low"
    (next_,) = feed(book, [cut])
    # Everything learned came after the cut, and is forgotten.
    assert next_.expected == statistics.median(settling) and next_.healthy_samples == 0


def test_a_young_series_on_two_levels_is_not_a_cut() -> None:
    # Three results on the upper level, then both at random (NCCL switching algorithms): the
    # lower level's results are learned, and no cut is found.
    book = BaselineBook(plain())
    levels = [GOOD, GOOD, GOOD, *[0.8 * GOOD, GOOD] * 10]
    verdicts = feed(book, levels)
    assert not any(v.degraded for v in verdicts)
    assert verdicts[-1].healthy_samples == plain().window


# --- JSON


def test_json_round_trip_restores_state_and_behaviour() -> None:
    policy = mature()  # the lows are not learned: judged against the GOOD window
    book = learned_book(policy)
    feed(book, [LOW, LOW, LOW])
    feed(book, [GOOD, 90e9, 110e9], key=OTHER)
    doc = json.loads(json.dumps(book.to_json()))
    restored = BaselineBook.from_json(doc, policy)

    assert restored.to_json() == book.to_json()
    # The latest ratio is not state: after a restart there is no result yet.
    assert {key: core(v) for key, v in restored.verdicts().items()} == {
        KEY: (GOOD, None, True, 5, 3, "low"),
        OTHER: (None, None, False, 3, 0, None),
    }
    for value in [GOOD, GOOD, GOOD, LOW, *[GOOD] * 20]:
        at = T0 + next(CLOCK) % 3000
        assert restored.observe(KEY, value, at=at) == book.observe(KEY, value, at=at)
    assert restored.to_json() == book.to_json()


def test_to_json_is_a_versioned_document() -> None:
    book = BaselineBook(plain())
    book.observe(KEY, 5.0, at=T0)
    hour = {"done": [], "hour": int(T0 // 3600), "sample": [5.0], "stride": 1, "skipped": 0}
    assert book.to_json() == {
        "version": 3,
        "identity": {},
        "baselines": [
            {
                "probe": "link",
                "op": "all_reduce",
                "size_bytes": 1 << 20,
                "path": "NV4",
                "ranks": 2,
                "learned": [5.0],
                "learned_cv": [0.0],
                "older": [],
                "recent": [],
                "degraded": False,
                "healthy": [],
                "level": [5.0],
                "reference": 5.0,
                "reason": None,
                "long": [5.0],
                "flaps": "",
                "reference_mature": False,
                "reference_spread": 0.0,
                "reference_low": None,
                "reference_hours": hour,
                "trend": hour,
                "accepted": None,
                "conditions": [],
                "tolerated": 0,
                "degraded_since": None,
                "since": 0,
                "below": 0,
                "held": False,
                "seed": None,
                "rate_bad": 0.0,
                "rate_count": 0.0,
            }
        ],
    }


def test_a_smaller_policy_keeps_the_newest_values_and_flags() -> None:
    book = BaselineBook(plain(window=10, min_samples=2, trigger=4, of=7))
    # All within the band of the young series (its ceiling 1.2 x a baseline of 100 at least),
    # so all ten are learned: a window, past young, so the lows are not learned.
    feed(book, [float(v) for v in range(100, 110)])
    # Five lows: four of the last seven, and the recent level (the median of 9) under its line.
    feed(book, [1.0, 1.0, 1.0, 1.0, 1.0])
    feed(book, [100.0, 100.0])
    smaller = plain(window=3, min_samples=2, trigger=2, of=3)
    restored = BaselineBook.from_json(book.to_json(), smaller)
    doc = restored.to_json()["baselines"]
    assert isinstance(doc, list)
    assert doc[0]["learned"] == [107.0, 108.0, 109.0]
    assert doc[0]["recent"] == [True, False, False]
    # The degraded state is kept as it was: verdicts change only on new results.
    # The young reference is the midmean of what was learned (100 to 109). The baseline is the
    # mean of the newest 6 x 3 learned: the window's 3 and the 7 older, all kept (room for 15),
    # without the highest and the lowest (101 to 108).
    baseline = math.fsum(range(101, 109)) / 8
    assert core(restored.verdict(KEY)) == (baseline, None, True, 3, 1, "low")
    assert restored.verdict(KEY).reference == robust.midmean(range(100, 110))  # type: ignore[union-attr]
    # Now 3 not-low of the last 3 >= M=2, and three results since the fault, all back.
    assert not feed(restored, [100.0])[0].degraded


def test_a_larger_min_samples_sends_a_key_back_to_learning() -> None:
    book = learned_book(mature())  # past young: the lows are not learned
    feed(book, [LOW, LOW, LOW])
    restored = BaselineBook.from_json(book.to_json(), plain(window=20, min_samples=8))
    assert core(restored.verdict(KEY)) == (None, None, False, 5, 0, None)
    verdicts = feed(restored, [LOW, LOW, LOW])  # learning again: learned, no verdict
    learned = [GOOD] * 5 + [LOW] * 3
    assert [v.baseline for v in verdicts] == [None, None, centre(learned)]
    assert not any(v.degraded for v in verdicts)


def test_a_state_from_before_rank_counts_adopts_the_count_its_probe_ran_with() -> None:
    # Written before baselines were kept per rank count: no "ranks" in the entries.
    doc = {"version": 1, "baselines": [_entry(learned=[GOOD] * 5), _entry(probe="gone")]}
    book = BaselineBook.from_json(doc, plain(latency_ratio=None))
    assert set(book.verdicts()) == {
        ("link", "all_reduce", 8, "NV4", 0),
        ("gone", "all_reduce", 8, "NV4", 0),
    }
    book.adopt_ranks(lambda probe: 8 if probe == "link" else None)
    # An 8-byte result is latency-bound: with latency_ratio null learned and shown, not judged.
    assert book.verdict(("link", "all_reduce", 8, "NV4", 8)) == Verdict(
        GOOD, None, False, 5, 0, judged=False
    )
    # A probe no longer configured keeps its old key: it never matches, and nothing is guessed.
    assert ("gone", "all_reduce", 8, "NV4", 0) in book.verdicts()
    assert book.observe(("link", "all_reduce", 8, "NV4", 8), GOOD).ratio == 1.0


def _entry(**changes: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "probe": "link",
        "op": "all_reduce",
        "size_bytes": 8,
        "path": "NV4",
        "learned": [1.0],
        "recent": [],
        "degraded": False,
    }
    entry.update(changes)
    return entry


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "JSON object"),
        ("state", "JSON object"),
        ({}, "version None"),
        ({"version": 4, "baselines": []}, "version 4 is not supported"),
        ({"version": "1", "baselines": []}, "version '1'"),
        ({"version": True, "baselines": []}, "version True"),
        ({"version": 1}, "baselines"),
        ({"version": 1, "baselines": {}}, "baselines"),
        ({"version": 1, "baselines": [], "extra": 1}, "extra"),
        ({"version": 1, "baselines": [_entry(learned=[-1.0])]}, "learned"),
        ({"version": 1, "baselines": [_entry(learned=[math.nan])]}, "learned"),
        ({"version": 1, "baselines": [_entry(learned=["1"])]}, "learned"),
        ({"version": 1, "baselines": [_entry(recent=[1])]}, "recent"),
        ({"version": 1, "baselines": [_entry(size_bytes="8")]}, "size_bytes"),
        ({"version": 1, "baselines": [_entry(size_bytes=-8)]}, "size_bytes"),
        ({"version": 1, "baselines": [_entry(degraded=None)]}, "degraded"),
        ({"version": 1, "baselines": [_entry(colour="red")]}, "colour"),
        ({"version": 1, "baselines": [_entry(), _entry()]}, "twice"),
    ],
)
def test_malformed_documents_raise_value_error(doc: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BaselineBook.from_json(doc, plain())


# --- files


def test_save_then_load_and_no_temporary_files_are_left(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    book = learned_book()
    feed(book, [LOW, LOW, LOW])
    save(path, book)
    feed(book, [GOOD] * 3)
    save(path, book)  # replaces the first
    assert [p.name for p in tmp_path.iterdir()] == ["baselines.json"]

    loaded, warning = load(path, plain())
    assert warning is None
    assert loaded.to_json() == book.to_json()


def test_save_into_a_missing_directory_raises_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        save(tmp_path / "nowhere" / "baselines.json", learned_book())
    assert list(tmp_path.iterdir()) == []


def test_a_missing_file_is_a_first_start(tmp_path: Path) -> None:
    book, warning = load(tmp_path / "baselines.json", plain())
    assert warning is None
    assert book.verdicts() == {}


def _valid_state() -> bytes:
    book = learned_book()
    return json.dumps(book.to_json()).encode()


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{",
        _valid_state()[:-7],  # truncated mid-write (what atomic saves prevent, but disks lie)
        b"\x00\xff\xfe garbage \x89PNG",
        b"null",
        b"[1, 2, 3]",
        b'{"version": 4, "baselines": []}',
        b'{"version": 1, "baselines": [{"probe": "x"}]}',
        b'{"version": 1, "baselines": NaN}',
        b"[" * 100_000 + b"]" * 100_000,  # deep enough to overflow the parser's recursion
        b"1" * 10_000,  # more digits than int() converts
    ],
    ids=[
        "empty",
        "brace",
        "truncated",
        "binary",
        "null",
        "list",
        "version4",
        "partial-entry",
        "nan",
        "deep",
        "huge-int",
    ],
)
def test_corrupt_files_are_set_aside_with_a_warning(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "baselines.json"
    path.write_bytes(content)
    before = int(time.time())
    book, problem = load(path, plain())
    after = int(time.time())

    assert book.verdicts() == {}
    # A document of a version this netmon does not read is told apart (an upgrade rolled back).
    expected = "version" if content.startswith(b'{"version": 4') else "corrupt"
    assert problem is not None and problem.reason == expected
    warning = problem.message
    assert "\n" not in warning and len(warning) < 400
    assert str(path) in warning
    assert not path.exists()
    (aside,) = tmp_path.iterdir()
    assert aside.name.startswith("baselines.json.corrupt-")
    assert before <= int(aside.name.rsplit("-", 1)[1]) <= after
    assert aside.name in warning
    assert aside.read_bytes() == content  # the evidence is kept


def test_a_wrong_version_is_set_aside_naming_the_version(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    path.write_text('{"version": 7, "baselines": []}')
    _, problem = load(path, plain())
    assert problem is not None and problem.reason == "version" and "version 7" in problem.message


def test_two_corrupt_files_in_a_row_are_both_kept(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    for content in (b"first", b"second"):
        path.write_bytes(content)
        _, warning = load(path, plain())
        assert warning is not None
    kept = sorted(p.read_bytes() for p in tmp_path.iterdir())
    assert kept == [b"first", b"second"]


def test_an_oversized_file_is_set_aside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("netmon.baseline.state.MAX_STATE_BYTES", 16)
    path = tmp_path / "baselines.json"
    path.write_text('{"version": 1, "baselines": []}')
    _, problem = load(path, plain())
    assert problem is not None and "larger than 16 bytes" in problem.message


def test_an_unreadable_path_warns_and_leaves_it_alone(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    path.mkdir()  # reading a directory fails with an OSError on every platform
    book, problem = load(path, plain())
    assert book.verdicts() == {}
    assert problem is not None and problem.reason == "unreadable"
    assert problem.message.startswith("cannot read baseline state")
    assert path.is_dir()


def test_a_file_from_a_smaller_policy_loads_under_a_larger_one(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    save(path, learned_book(plain(window=5, min_samples=5)))
    book, warning = load(path, plain(window=50, min_samples=5))
    assert warning is None
    assert book.observe(KEY, GOOD).healthy_samples == 6


# --- policy


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"trigger": 6, "of": 5}, r"trigger \(6\) must be <= of \(5\)"),
        ({"trigger": 2, "of": 4}, r"more than half of of \(4\)"),
        ({"trigger": 0}, "greater than or equal to 1"),
        ({"of": 0}, "greater than or equal to 1"),
        ({"ratio": 0.0}, "greater than 0"),
        ({"ratio": -0.5}, "greater than 0"),
        ({"ratio": 1.5}, "less than or equal to 1"),
        ({"ratio": math.nan}, "finite number"),
        ({"window": 0, "min_samples": 0}, "greater than or equal to 1"),
        ({"window": 3, "min_samples": 5}, r"min_samples \(5\) must be <= window \(3\)"),
        ({"windows": 20}, "Extra inputs are not permitted"),
    ],
)
def test_policy_rejects_inconsistent_settings(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BaselinePolicy.model_validate(fields)


def test_policy_defaults_and_edges() -> None:
    assert BaselinePolicy() == BaselinePolicy(window=20, min_samples=5, ratio=0.8, trigger=3, of=5)
    BaselinePolicy(window=1, min_samples=1, ratio=1.0, trigger=1, of=1)


def test_policy_is_frozen() -> None:
    policy = plain()
    with pytest.raises(ValidationError):
        policy.window = 3  # type: ignore[misc]


# --- properties


@st.composite
def policies(draw: st.DrawFn) -> BaselinePolicy:
    window = draw(st.integers(1, 8))
    of = draw(st.integers(1, 6))
    flap_window = draw(st.integers(4, 10))
    return plain(
        flap_window=flap_window,
        flap_trigger=draw(st.integers(2, flap_window // 2)),
        clear_window=draw(st.integers(1, 12)),
        learn_delay=draw(st.sampled_from([0, 1, 3, 20])),
        # The default alpha needs more bad results than a window of 10 holds with as many
        # healthy; a looser one lets flapping turn here.
        flap_alpha=draw(st.sampled_from([1e-7, 0.01, 0.5])),
        window=window,
        min_samples=draw(st.integers(1, window)),
        level_window=draw(st.integers(1, 9)),
        ratio=draw(st.sampled_from([0.5, 0.8, 0.95, 1.0])),
        trigger=draw(st.integers(of // 2 + 1, of)),
        of=of,
    )


# Mostly a few levels around one baseline, so degrading and clearing both happen often.
positive = st.one_of(
    st.sampled_from([10.0, 50.0, 79.0, 80.0, 100.0, 120.0]),
    st.floats(min_value=1e-9, max_value=1e15),
)
unusable = st.sampled_from([0.0, -1.0, math.nan, math.inf, -math.inf])


class Model:
    """An independent model of docs/SIGNAL.md's rule with no spread margin (spread_k 0) and no
    noise (cv 0), for results within one hour and fewer than long_window of them: the reference
    stays young (the midmean of what was learned; its floor the same), the long level never
    forms (no decline), and no loss is accepted (steady needs three hours).

    The baseline is the mean of the last up to 6 x window learned results; the expected level
    the higher of it and the reference's floor less the baseline's uncertainty. The band's
    ceiling is 2 x expected - the low line (anything is under it while the recent level runs
    over it). While young (fewer than a window learned) every usable result of a healthy series
    under the ceiling is learned at once, low ones too; after, a result within the symmetric
    band (not low, under the ceiling) waits learn_delay results and is learned if the series is
    healthy and steady then. M of N low turn `low` with the recent level's floored mean under
    its line, or its median with the mean of its newest N under halfway from that line to the
    clearing line (each taken as the expected level at most), or alone while there is no
    level; the level alone turns `drift`. Both clear on M of N healthy with the recent level
    and the results since the turn back over the clearing line: `of` of them, or a baseline
    window once the fault held.
    `flapping` needs as many bad results as the series' own rate makes unlikely
    (robust.binomial_needed: the binomial tail is the library's own, not modelled here); a
    flag counts toward that rate when it leaves the flapping window, if the series is not
    degraded then.

    Not modelled: the young check for a cut (rule._check_young). It needs 3 + 10 learned results
    within the young phase, and policies() draws windows of at most 8; no result settles
    (settle 0), so the settling check has nothing either. The examples above
    (test_a_series_born_cut_...) cover it."""

    def __init__(self, policy: BaselinePolicy) -> None:
        self.policy = policy
        self.learned: deque[float] = deque(maxlen=policy.window)
        self.older: deque[float] = deque(maxlen=5 * policy.window)
        self.low: deque[bool] = deque(maxlen=policy.of)
        self.healthy: deque[bool] = deque(maxlen=policy.of)
        self.level: deque[float] = deque(maxlen=min(policy.level_window, policy.window))
        self.long: deque[float] = deque(maxlen=policy.long_window)
        self.flaps: deque[bool | None] = deque(maxlen=policy.flap_window)  # low, healthy: None
        self.pending: deque[float] = deque()
        self.everything_learned: list[float] = []
        self.conditions: set[str] = set()
        self.since = 0
        self.held = False
        self.rate_bad = 0.0
        self.rate_count = 0.0

    @property
    def degraded(self) -> bool:
        return bool(self.conditions)

    @property
    def reason(self) -> str | None:
        order = ("flapping", "low", "drift", "decline")
        return next((r for r in order if r in self.conditions), None)

    def reference(self) -> float | None:
        return robust.midmean(self.everything_learned) if self.everything_learned else None

    def baseline(self) -> float | None:
        if len(self.learned) < self.policy.min_samples:
            return None
        return centre([*self.older, *self.learned])

    def young(self) -> bool:
        return len(self.older) + len(self.learned) < self.policy.window

    def wander(self) -> float:
        """Two standard errors of the baseline's centre."""
        spread = robust.spread([*self.older, *self.learned])
        return 2 * robust.MEDIAN_SE * spread / math.sqrt(len(self.learned))

    def learn(self, value: float) -> None:
        if len(self.learned) == self.policy.window:
            self.older.append(self.learned[0])
        self.learned.append(value)
        self.everything_learned.append(value)

    def since_level(self, needed: int) -> float | None:
        """The median of the results since the turn (at most clear_window, or `needed` where
        that is more), once `needed`."""
        count = min(self.since, max(self.policy.clear_window, needed), len(self.long))
        return statistics.median(list(self.long)[-count:]) if count >= needed else None

    def back(self, level: float | None, line: float) -> bool:
        """The recent level and the results since the turn over `line`: `of` of them, or once
        the fault held, a baseline window (and a level window) of them."""
        policy = self.policy
        needed = policy.of
        if self.held:
            needed = max(self.level.maxlen or 0, min(policy.window, policy.clear_window))
        since = self.since_level(needed)
        return level is not None and since is not None and level >= line and since >= line

    def count(self, flag: bool | None) -> None:
        """A flag into the flapping window; the one it lets go (once full) into the series' own
        rate of bad results, decayed, while the series is not degraded."""
        full = len(self.flaps) == self.flaps.maxlen
        leaving = self.flaps[0] if full else None
        self.flaps.append(flag)
        if self.degraded or not full:
            return
        keep = 1 - 1 / self.policy.flap_rate_results
        self.rate_bad = self.rate_bad * keep + (leaving is True)
        self.rate_count = self.rate_count * keep + 1

    def bad_needed(self) -> int:
        policy = self.policy
        weight = self.rate_count + policy.flap_prior
        rate = (self.rate_bad + policy.flap_base_rate * policy.flap_prior) / weight
        rate = min(rate + 2 * math.sqrt(rate * (1 - rate) / weight), 0.5)
        needed = robust.binomial_needed(policy.flap_window, rate, policy.flap_alpha)
        return max(policy.flap_trigger, needed)

    def flapping(self, level_ok: bool) -> None:
        """No noisy results here (cv 0): every bad result is a low one."""
        flags = list(self.flaps)
        bad, good = flags.count(True), flags.count(False)
        trigger = self.policy.flap_trigger
        if "flapping" not in self.conditions:
            older = flags[: len(flags) // 2].count(True)
            newest = flags[-max(len(flags) // 4, 1) :]
            if (
                bad >= self.bad_needed()
                and good >= trigger
                and bad >= trigger / 2
                and min(older, bad - older) >= trigger / 2
                and True in newest
                and level_ok
            ):
                self.conditions.add("flapping")
        elif bad <= 1 or good == 0 or not level_ok:
            self.conditions.discard("flapping")

    def turn(self, level: float | None, expected: float, line: float, clear: float) -> None:
        policy = self.policy
        if not self.conditions & {"low", "drift"}:
            low = sum(self.low) >= policy.trigger
            if level is None:
                if low:
                    self.conditions.add("low")
            else:
                floor = min(policy.floor, policy.ratio) * expected
                floored = math.fsum(max(v, floor) for v in self.level) / len(self.level)
                newest = [min(v, expected) for v in list(self.level)[-policy.of :]]
                agrees = math.fsum(newest) / len(newest) < (line + clear) / 2
                if floored < line or (level < line and agrees):
                    self.conditions.add("low" if low else "drift")
        elif sum(self.healthy) >= policy.trigger and self.back(level, clear):
            self.conditions -= {"low", "drift"}
        self.flapping(level is not None and level >= clear)

    def step(self, value: float) -> tuple[float | None, float | None]:
        """The expected level the value is judged against and its ratio to it."""
        policy, usable = self.policy, math.isfinite(value) and value > 0
        baseline = self.baseline()
        self.level.append(value if usable else 0.0)
        self.long.append(value if usable else 0.0)
        if baseline is None:
            if usable:
                self.learn(value)
            return None, None
        floor = self.reference()
        assert floor is not None  # a baseline was learned, and the reference with it
        expected = max(baseline, floor - self.wander() / 2)
        ratio = value / expected if usable else None
        line = policy.ratio * expected  # the low, healthy and level lines alike (spread_k 0)
        low = not usable or value < line
        healthy = usable and value >= line
        self.low.append(low)
        self.healthy.append(healthy)
        self.count(True if low else False if healthy else None)
        full = len(self.level) == self.level.maxlen
        level = statistics.median(self.level) if full else None
        clear = max(line, (1 + policy.ratio) / 2 * expected)
        was = self.degraded
        if was:
            self.since += 1
            held = self.since_level(policy.of)
            self.held = self.held or (held is not None and held < clear)
        self.turn(level, expected, line, clear)
        if self.degraded and not was:
            # Held from the turn where the level is over the floor (a cut settles there).
            floor = min(policy.floor, policy.ratio) * expected
            turned = bool(self.conditions & {"low", "drift"})
            self.since = 0
            self.held = turned and level is not None and level >= floor
        # Not learned while the recent level is under halfway from the drift line to the
        # clearing line.
        steady = level is None or level >= (line + clear) / 2
        ceiling = 2 * expected - line
        within = value <= ceiling or (level is not None and level >= ceiling)
        if self.young():
            if usable and not low and not self.degraded and within:
                self.learn(value)
        elif not low and not self.degraded and within:
            self.pending.append(value)
        if self.degraded:
            self.pending.clear()
        while len(self.pending) > policy.learn_delay:
            waited = self.pending.popleft()
            if steady:
                self.learn(waited)
        return expected, ratio


@given(policies(), st.lists(st.one_of(positive, positive, unusable), max_size=60))
def test_verdicts_follow_the_rule_exactly(policy: BaselinePolicy, values: list[float]) -> None:
    """The independent model, checked against every verdict."""
    book = BaselineBook(policy)
    model = Model(policy)
    for value in values:
        baseline = model.baseline()
        expected, ratio = model.step(value)
        verdict = feed(book, [value])[0]
        assert verdict.reference == model.reference()
        # The series' own rate of bad results: only flags the flapping window let go count.
        states = book.to_json()["baselines"]
        assert isinstance(states, list) and len(states) == 1
        assert (states[0]["rate_bad"], states[0]["rate_count"]) == (
            model.rate_bad,
            model.rate_count,
        )
        if expected is None:  # learning: the baseline reported is the one just formed, if any
            assert verdict.baseline == model.baseline()
            assert not verdict.degraded and verdict.low_recent == 0
            continue
        assert verdict.baseline == baseline
        assert verdict.expected == expected
        assert verdict.ratio == ratio
        assert verdict.degraded == model.degraded
        assert verdict.reason == model.reason
        assert verdict.low_recent == sum(model.low)
        assert verdict.healthy_samples == len(model.learned)


@given(policies(), st.lists(st.tuples(st.booleans(), positive), max_size=40))
def test_json_round_trip_of_any_history(
    policy: BaselinePolicy, history: list[tuple[bool, float]]
) -> None:
    book = BaselineBook(policy)
    for other, value in history:
        book.observe(OTHER if other else KEY, value)
    text = json.dumps(book.to_json(), allow_nan=False)
    restored = BaselineBook.from_json(json.loads(text), policy)
    assert restored.to_json() == book.to_json()
    for key, verdict in book.verdicts().items():
        again = restored.verdict(key)
        assert again is not None
        assert (again.degraded, again.healthy_samples, again.low_recent) == (
            verdict.degraded,
            verdict.healthy_samples,
            verdict.low_recent,
        )


def test_a_missing_part_is_a_fault_and_only_a_replaced_one_forgets() -> None:
    book = learned_book()
    feed(book, [GOOD] * 5, key=("nodes", "all_reduce", 1 << 20, "group", 2))
    gpus = ("GPU-a", "GPU-b")
    assert book.adopt_identity({"gpus": gpus, "nics": ("guid-1",)}) == ({}, [])
    # A GPU off the bus: a fault the references must show, not new hardware.
    assert book.adopt_identity({"gpus": ("GPU-a",)}) == ({}, [])
    assert book.missing({"gpus": ("GPU-a",)}) == {"gpus": ["GPU-b"]}
    assert book.identity["gpus"] == gpus
    assert book.verdict(KEY) is not None and book.verdict(KEY).baseline == GOOD  # type: ignore[union-attr]
    # A NIC added is adopted; a NIC replaced forgets only the series that leave the node.
    assert book.adopt_identity({"nics": ("guid-1", "guid-2")}) == ({}, [])
    changed, forgotten = book.adopt_identity({"nics": ("guid-1", "guid-3")})
    assert changed == {"nics": ["guid-2", "guid-3"]}
    assert forgotten == [("nodes", "all_reduce", 1 << 20, "group", 2)]
    # A GPU replaced: every series learns afresh.
    changed, forgotten = book.adopt_identity({"gpus": ("GPU-a", "GPU-c")})
    assert changed == {"gpus": ["GPU-b", "GPU-c"]} and KEY in forgotten
    assert book.verdict(KEY) == Verdict(None, None, False, 0, 0)
