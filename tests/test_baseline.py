from __future__ import annotations

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


def plain(**fields: object) -> BaselinePolicy:
    """The M-of-N rule alone: no settling after start, no spread margin (tests/test_signal.py
    covers those)."""
    ratio = fields.get("ratio", 0.8)
    floor = min(0.7, ratio) if isinstance(ratio, float) else 0.7
    defaults = {"settle": 0, "spread_k": 0, "floor": floor}
    return BaselinePolicy.model_validate({**defaults, **fields})


def feed(book: BaselineBook, values: Iterable[float], key: BaselineKey = KEY) -> list[Verdict]:
    return [book.observe(key, value) for value in values]


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

    formed = book.observe(KEY, 200.0)
    assert formed == Verdict(
        baseline=100.0, ratio=2.0, degraded=False, healthy_samples=5, low_recent=0
    )


@pytest.mark.parametrize("bad", [0.0, -5.0, math.nan, math.inf, -math.inf])
def test_unusable_results_are_not_learned_while_learning(bad: float) -> None:
    book = BaselineBook(plain())
    feed(book, [100.0, 100.0])
    verdict = book.observe(KEY, bad)
    assert verdict == Verdict(None, None, degraded=False, healthy_samples=2, low_recent=0)


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
    book = learned_book()  # M=3 of N=5
    verdicts = feed(book, [LOW, GOOD, LOW, GOOD, LOW])
    assert [v.degraded for v in verdicts] == [False, False, False, False, True]
    assert [v.low_recent for v in verdicts] == [1, 1, 2, 2, 3]


def test_lows_spread_wider_than_n_do_not_degrade() -> None:
    book = learned_book()
    verdicts = feed(book, [LOW, *[GOOD] * 4, LOW, *[GOOD] * 4, LOW])
    assert not any(v.degraded for v in verdicts)
    assert max(v.low_recent for v in verdicts) == 1


def test_clearing_needs_m_good_results() -> None:
    book = learned_book()
    assert feed(book, [LOW, LOW, LOW])[-1].degraded
    verdicts = feed(book, [GOOD, GOOD, GOOD])
    # Recent flags: LLLG, LLLGG, LLGGG: the third good result is the Mth not-low of the last N.
    assert [v.degraded for v in verdicts] == [True, True, False]
    assert [v.low_recent for v in verdicts] == [3, 3, 2]


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
    book = learned_book()
    low = book.observe(KEY, LOW)
    assert low.healthy_samples == 5  # low while healthy: not learned
    feed(book, [LOW, LOW])
    # Degraded: good-looking and low results alike stay out of the window.
    verdicts = feed(book, [LOW, GOOD * 1.5, LOW, GOOD * 1.5, LOW])
    assert all(v.degraded for v in verdicts)
    assert all(v.healthy_samples == 5 and v.baseline == GOOD for v in verdicts)


def test_the_result_that_clears_a_degradation_is_learned() -> None:
    book = learned_book()
    feed(book, [LOW, LOW, LOW, 120e9, 120e9])
    cleared = book.observe(KEY, 120e9)
    assert not cleared.degraded
    assert cleared.healthy_samples == 6
    assert book.observe(KEY, GOOD).baseline == statistics.median([GOOD] * 5 + [120e9])


def test_baseline_is_the_median_of_the_last_k_learned_results() -> None:
    policy = plain(window=4, min_samples=3, trigger=1, of=1)
    book = BaselineBook(policy)
    # Rising values are never low, so every one is learned; the window keeps the last four.
    feed(book, [10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    verdict = book.observe(KEY, 70.0)
    assert verdict.baseline == 45.0  # median of 30, 40, 50, 60
    assert verdict.ratio == 70.0 / 45.0
    assert verdict.healthy_samples == 4


def test_the_baseline_judged_against_excludes_the_result_itself() -> None:
    book = learned_book(value=100.0)
    verdict = book.observe(KEY, 200.0)
    assert verdict.baseline == 100.0 and verdict.ratio == 2.0
    assert book.observe(KEY, 100.0).baseline == 100.0  # median of 100 x5, 200


def test_keys_are_independent_and_verdicts_is_a_snapshot() -> None:
    book = learned_book()
    feed(book, [LOW] * 3)
    feed(book, [GOOD] * 5, key=OTHER)
    snapshot = book.verdicts()
    feed(book, [GOOD] * 3)
    assert snapshot[KEY].degraded
    assert not snapshot[OTHER].degraded
    assert book.verdict(KEY) == Verdict(GOOD, 1.0, False, 6, 2)


# --- JSON


def test_json_round_trip_restores_state_and_behaviour() -> None:
    policy = plain()
    book = learned_book(policy)
    feed(book, [LOW, LOW, LOW])
    feed(book, [GOOD, 90e9, 110e9], key=OTHER)
    doc = json.loads(json.dumps(book.to_json()))
    restored = BaselineBook.from_json(doc, policy)

    assert restored.to_json() == book.to_json()
    # The latest ratio is not state: after a restart there is no result yet.
    assert restored.verdicts() == {
        KEY: Verdict(GOOD, None, True, 5, 3, reason="low"),
        OTHER: Verdict(None, None, False, 3, 0),
    }
    for value in [GOOD, GOOD, GOOD, LOW]:
        assert restored.observe(KEY, value) == book.observe(KEY, value)


def test_to_json_is_a_versioned_document() -> None:
    book = BaselineBook(plain())
    book.observe(KEY, 5.0)
    assert book.to_json() == {
        "version": 2,
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
                "reference": None,
                "reason": None,
            }
        ],
    }


def test_a_smaller_policy_keeps_the_newest_values_and_flags() -> None:
    book = BaselineBook(plain(window=10, min_samples=2, trigger=4, of=7))
    feed(book, [float(v) for v in range(10, 20)])
    feed(book, [1.0, 1.0, 1.0, 1.0])  # four lows: degraded
    feed(book, [100.0, 100.0])
    smaller = plain(window=3, min_samples=2, trigger=2, of=3)
    restored = BaselineBook.from_json(book.to_json(), smaller)
    doc = restored.to_json()["baselines"]
    assert isinstance(doc, list)
    assert doc[0]["learned"] == [17.0, 18.0, 19.0]
    assert doc[0]["recent"] == [True, False, False]
    # The degraded state is kept as it was: verdicts change only on new results.
    # The reference is the first full window's baseline (window 10: 10 to 19).
    assert restored.verdict(KEY) == Verdict(18.0, None, True, 3, 1, reference=14.5, reason="low")
    assert not restored.observe(KEY, 100.0).degraded  # now 3 not-low of the last 3 >= M=2


def test_a_larger_min_samples_sends_a_key_back_to_learning() -> None:
    book = learned_book()
    feed(book, [LOW, LOW, LOW])
    restored = BaselineBook.from_json(book.to_json(), plain(window=20, min_samples=8))
    assert restored.verdict(KEY) == Verdict(None, None, False, 5, 0)
    verdicts = feed(restored, [LOW, LOW, LOW])  # learning again: learned, no verdict
    assert [v.baseline for v in verdicts] == [None, None, GOOD]
    assert not any(v.degraded for v in verdicts)


def test_a_state_from_before_rank_counts_adopts_the_count_its_probe_ran_with() -> None:
    # Written before baselines were kept per rank count: no "ranks" in the entries.
    doc = {"version": 1, "baselines": [_entry(learned=[GOOD] * 5), _entry(probe="gone")]}
    book = BaselineBook.from_json(doc, plain())
    assert set(book.verdicts()) == {
        ("link", "all_reduce", 8, "NV4", 0),
        ("gone", "all_reduce", 8, "NV4", 0),
    }
    book.adopt_ranks(lambda probe: 8 if probe == "link" else None)
    # An 8-byte result is latency-bound: learned and shown, not judged (tests/test_signal.py).
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
        ({"version": 3, "baselines": []}, "version 3 is not supported"),
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
        b'{"version": 3, "baselines": []}',
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
        "version3",
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
    book, warning = load(path, plain())
    after = int(time.time())

    assert book.verdicts() == {}
    assert warning is not None and "\n" not in warning and len(warning) < 400
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
    _, warning = load(path, plain())
    assert warning is not None and "version 7" in warning


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
    _, warning = load(path, plain())
    assert warning is not None and "larger than 16 bytes" in warning


def test_an_unreadable_path_warns_and_leaves_it_alone(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    path.mkdir()  # reading a directory fails with an OSError on every platform
    book, warning = load(path, plain())
    assert book.verdicts() == {}
    assert warning is not None and warning.startswith("cannot read baseline state")
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
    return plain(
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
    """An independent model of docs/SIGNAL.md's rule with no spread margin (spread_k 0): the
    expected level is the higher of the baseline and the reference; M of N low degrade, the
    recent level under ratio x expected drifts; M of N healthy with the level back clear."""

    def __init__(self, policy: BaselinePolicy) -> None:
        self.policy = policy
        self.learned: deque[float] = deque(maxlen=policy.window)
        self.older: deque[float] = deque(maxlen=2 * policy.window)
        self.low: deque[bool] = deque(maxlen=policy.of)
        self.healthy: deque[bool] = deque(maxlen=policy.of)
        self.level: deque[float] = deque(maxlen=min(policy.level_window, policy.window))
        self.reference: float | None = None
        self.degraded = False

    def baseline(self) -> float | None:
        if len(self.learned) < self.policy.min_samples:
            return None
        return statistics.median(self.learned)

    def spread(self) -> float:
        level = robust.spread(list(self.level)) if len(self.level) >= 5 else 0.0
        return max(robust.spread([*self.older, *self.learned]), level)

    def wander(self) -> float:
        """Two standard errors of the baseline, a median of the window."""
        return 2 * math.sqrt(math.pi / 2) * self.spread() / math.sqrt(len(self.learned))

    def learn(self, value: float) -> None:
        if len(self.learned) == self.policy.window:
            self.older.append(self.learned[0])
        self.learned.append(value)
        baseline = self.baseline()
        if baseline is None:
            return
        if self.reference is None and len(self.learned) == self.policy.window:
            self.reference = baseline  # and it never moves on its own

    def step(self, value: float) -> tuple[float | None, float | None]:
        """The expected level the value is judged against and its ratio to it."""
        policy, usable = self.policy, math.isfinite(value) and value > 0
        baseline = self.baseline()
        self.level.append(value if usable else 0.0)
        if baseline is None:
            if usable:
                self.learn(value)
            return None, None
        # Judged against the reference less its uncertainty; back means the reference itself.
        reference = self.reference
        expected = baseline if reference is None else max(baseline, reference - self.wander() / 2)
        returned = max(baseline, reference or 0.0)
        ratio = value / expected if usable else None
        self.low.append(ratio is None or ratio < policy.ratio)
        healthy = ratio is not None and value >= policy.ratio * expected
        self.healthy.append(healthy)
        full = len(self.level) == self.level.maxlen
        level = statistics.median(self.level) if full else None
        clear = max(policy.ratio * expected, (1 + policy.ratio) / 2 * returned)
        if not self.degraded:
            drift = level is not None and level < policy.ratio * expected
            self.degraded = sum(self.low) >= policy.trigger or drift
        else:
            back = level is not None and level >= clear
            self.degraded = not (sum(self.healthy) >= policy.trigger and back)
        # Not learned while the recent level is under halfway from the drift line to the
        # clearing line.
        steady = level is None or level >= (policy.ratio * expected + clear) / 2
        if healthy and not self.degraded and steady:
            self.learn(value)
        return expected, ratio


@given(policies(), st.lists(st.one_of(positive, positive, unusable), max_size=60))
def test_verdicts_follow_the_rule_exactly(policy: BaselinePolicy, values: list[float]) -> None:
    """The independent model, checked against every verdict."""
    book = BaselineBook(policy)
    model = Model(policy)
    for value in values:
        baseline = model.baseline()
        expected, ratio = model.step(value)
        verdict = book.observe(KEY, value)
        assert verdict.reference == model.reference
        if expected is None:  # learning: the baseline reported is the one just formed, if any
            assert verdict.baseline == model.baseline()
            assert not verdict.degraded and verdict.low_recent == 0
            continue
        assert verdict.baseline == baseline
        assert verdict.expected == expected
        assert verdict.ratio == ratio
        assert verdict.degraded == model.degraded
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
