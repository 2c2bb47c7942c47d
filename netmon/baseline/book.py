"""Learned busbw baselines and degradation verdicts per result key, and their JSON document.

The daemon feeds every probe result to a BaselineBook and exports its verdicts; netmon.baseline.
state keeps the book in a file across restarts.

A verdict knows each series' own noise (docs/SIGNAL.md): a result is low only when it is under
`ratio` x baseline AND more than `spread_k` robust spreads under it; a result that cannot be
trusted (just after start, other work on the CPU ranks' cores, far noisier than usual) is
inconclusive: neither low nor learned. Latency-bound sizes are judged on their own tolerance,
or not at all by default.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from netmon.bandwidth import parse_size
from netmon.baseline import robust
from netmon.errors import describe_validation_error

STATE_VERSION = 1

# (probe, op, size_bytes, path, ranks): a probe on the idle set keeps one baseline per rank count.
BaselineKey: TypeAlias = tuple[str, str, int, str, int]

# Why a result was neither judged nor learned (netmon_inconclusive_results_total's reasons).
INCONCLUSIVE_REASONS = ("settling", "disturbed", "noisy")


class BaselinePolicy(BaseModel):
    """How a baseline is learned (median of the last K healthy results) and when a link is degraded
    (M of the last N results below R x baseline; M of the last N not low to clear)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    window: int = Field(default=20, ge=1)  # K: the baseline is the median of the last K learned
    min_samples: int = Field(default=5, ge=1)  # healthy results needed before any verdict
    ratio: float = Field(default=0.8, gt=0, le=1, allow_inf_nan=False)  # R: low below R x baseline
    trigger: int = Field(default=3, ge=1)  # M: low results among the last N that degrade
    of: int = Field(default=5, ge=1)  # N: how many recent results the M-of-N rule looks at
    # k: a low result is also more than k robust spreads (1.4826 x MAD) under the baseline.
    spread_k: float = Field(default=3.0, ge=0, allow_inf_nan=False)
    # Sizes under this are latency-bound: a fixed ratio on their busbw reads host jitter as a
    # fault. They are judged with latency_ratio (latency over baseline / latency_ratio is low),
    # or, with latency_ratio unset (the default), learned and shown but never judged.
    latency_bound_below: int = Field(default=1 << 20, ge=0)
    latency_ratio: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    # The first results of each series after the daemon starts are neither learned nor judged:
    # a first run pays cold caches, a new rank zygote, a first CUDA context.
    settle: int = Field(default=2, ge=0)
    # A result measured while other processes used this share of the machine's CPUs or more
    # (netmon.probe.cpushare; judged on CPU ranks only) was disturbed: inconclusive.
    max_foreign_cpu: float = Field(default=0.25, gt=0, le=1, allow_inf_nan=False)
    # A result whose cv is over noisy_cv x the series' usual cv (and over noisy_cv_floor) is
    # inconclusive, unless `trigger` of the last `of` were noisy: noise that lasts (a flapping
    # link is noisy too) is the series' state, and is judged.
    noisy_cv: float = Field(default=3.0, ge=1, allow_inf_nan=False)
    noisy_cv_floor: float = Field(default=0.05, ge=0, allow_inf_nan=False)

    @field_validator("latency_bound_below", mode="before")
    @classmethod
    def _size(cls, value: object) -> object:
        return parse_size(value) if isinstance(value, str) else value

    def latency_bound(self, size_bytes: int) -> bool:
        # The measured size can be a few bytes under the configured one (whole elements per
        # rank: a 1M all_gather on 3 ranks moves 1048572 B); 1 % keeps it on its side.
        return size_bytes * 1.01 < self.latency_bound_below

    def judges(self, size_bytes: int) -> bool:
        return not self.latency_bound(size_bytes) or self.latency_ratio is not None

    def ratio_for(self, size_bytes: int) -> float:
        if self.latency_bound(size_bytes) and self.latency_ratio is not None:
            return self.latency_ratio
        return self.ratio

    @model_validator(mode="after")
    def _consistent(self) -> BaselinePolicy:
        if self.min_samples > self.window:
            raise ValueError(
                f"min_samples ({self.min_samples}) must be <= window ({self.window}), "
                "or the window can never hold enough results for a baseline"
            )
        if self.trigger > self.of:
            raise ValueError(
                f"trigger ({self.trigger}) must be <= of ({self.of}): M of the last N results"
            )
        # With 2M <= N, "M low" and "M not low" can hold at once and the verdict would flip on
        # every result; a strict majority makes the two rules exclusive.
        if 2 * self.trigger <= self.of:
            raise ValueError(
                f"trigger ({self.trigger}) must be more than half of of ({self.of}), "
                "or degrading and clearing could both apply and the verdict would flap"
            )
        return self


@dataclass(frozen=True)
class Verdict:
    """Where one key stands after its latest result.

    `baseline` is the one the latest result was judged against (learning from a result comes
    after judging it, so a result never vouches for itself); on the result that completes learning
    it is the baseline just formed. `ratio` is None with no baseline, for a result that was not a
    positive finite number, and after a restart until the next result.
    """

    baseline: float | None  # bytes/s, None until min_samples healthy results
    ratio: float | None  # latest busbw / baseline
    degraded: bool
    healthy_samples: int  # results in the baseline window, after this one
    low_recent: int  # low results among the last N
    judged: bool = True  # False: a latency-bound size that is learned and shown, never judged
    inconclusive: str | None = None  # why the latest result was neither judged nor learned
    # How it was reached, for the log and the runbook (not part of the verdict's identity):
    # the baseline window's robust spread and the busbw under which a result is low (bytes/s;
    # None before a baseline, and the bound also for a size not judged), the last N judged
    # results (oldest first), and whether this result turned the verdict.
    spread: float | None = field(default=None, compare=False)
    low_bound: float | None = field(default=None, compare=False)
    recent: tuple[float | None, ...] = field(default=(), compare=False)
    changed: bool = field(default=False, compare=False)

    def explain(self) -> str:
        """One line for the log and the runbook: the rule, the baseline, the spread, the values."""
        if self.baseline is None or self.low_bound is None:
            return "no verdict yet" if self.judged else "not judged (latency-bound size)"
        values = " ".join("-" if v is None else _gbps(v) for v in self.recent)
        return (
            f"{self.low_recent} of the last {len(self.recent)} under {_gbps(self.low_bound)} GB/s "
            f"(baseline {_gbps(self.baseline)} GB/s, spread {_gbps(self.spread or 0.0)} GB/s); "
            f"recent GB/s: {values}"
        )


def _gbps(value: float) -> str:
    return f"{value / 1e9:.4g}"


@dataclass
class _Track:
    """One key's mutable state; only BaselineBook touches it, under its lock."""

    learned: deque[float]
    recent: deque[bool]  # True = low
    degraded: bool = False
    learned_cv: deque[float] = field(default_factory=deque)  # the cv of each learned result
    recent_values: deque[float | None] = field(default_factory=deque)  # beside `recent`
    seen: int = 0  # results since this daemon started (settling)
    noisy_recent: deque[bool] = field(default_factory=deque)  # the last N conclusive-or-noisy

    def baseline(self, policy: BaselinePolicy) -> float | None:
        if len(self.learned) < policy.min_samples:
            return None
        return float(statistics.median(self.learned))

    def spread(self) -> float:
        return robust.spread(list(self.learned))

    def usual_cv(self, policy: BaselinePolicy) -> float | None:
        if len(self.learned_cv) < policy.min_samples:
            return None
        return robust.median(list(self.learned_cv))

    def learn(self, busbw: float, cv: float) -> None:
        self.learned.append(busbw)
        self.learned_cv.append(cv)

    def verdict(
        self, policy: BaselinePolicy, size_bytes: int, ratio: float | None = None, **extra: Any
    ) -> Verdict:
        baseline = self.baseline(policy)
        judged = policy.judges(size_bytes)
        spread = self.spread() if baseline is not None else None
        bound = (
            robust.low_bound(baseline, spread or 0.0, policy.ratio_for(size_bytes), policy.spread_k)
            if baseline is not None and judged
            else None
        )
        return Verdict(
            baseline=baseline,
            ratio=ratio,
            degraded=self.degraded,
            healthy_samples=len(self.learned),
            low_recent=sum(self.recent),
            spread=spread,
            low_bound=bound,
            judged=judged,
            recent=tuple(self.recent_values),
            **extra,
        )


def _usable(busbw: float) -> bool:
    return math.isfinite(busbw) and busbw > 0


class BaselineBook:
    """Per-key baselines and verdicts. observe() may run in one thread while verdicts() snapshots
    in another (a scrape)."""

    def __init__(self, policy: BaselinePolicy) -> None:
        self.policy = policy
        self._tracks: dict[BaselineKey, _Track] = {}
        self._verdicts: dict[BaselineKey, Verdict] = {}
        self._lock = threading.Lock()

    def _new_track(self) -> _Track:
        window, of = self.policy.window, self.policy.of
        return _Track(
            deque(maxlen=window),
            deque(maxlen=of),
            learned_cv=deque(maxlen=window),
            recent_values=deque(maxlen=of),
            noisy_recent=deque(maxlen=of),
        )

    def observe(
        self, key: BaselineKey, busbw: float, cv: float = 0.0, foreign_cpu: float | None = None
    ) -> Verdict:
        """Judge one result, then learn from it if it is healthy. `cv` is the result's own
        dispersion, `foreign_cpu` the share of the machine's CPUs other processes used while it
        was measured (None: not known, or not judged on this backend)."""
        with self._lock:
            track = self._tracks.get(key)
            if track is None:
                track = self._tracks[key] = self._new_track()
            # A cv that is not a finite number says nothing about noise (and must not reach the
            # state file, which holds finite numbers only).
            cv = float(cv) if math.isfinite(cv) and cv >= 0 else 0.0
            verdict = self._step(track, key[2], float(busbw), cv, foreign_cpu)
            self._verdicts[key] = verdict
            return verdict

    def _inconclusive(
        self, track: _Track, cv: float, foreign_cpu: float | None, usable: bool
    ) -> str | None:
        policy = self.policy
        if track.seen <= policy.settle:
            return "settling"
        if not usable:  # a zero or broken figure is low, however it was measured
            return None
        if foreign_cpu is not None and foreign_cpu >= policy.max_foreign_cpu:
            # Not capped like noise: other work on the cores is measured, not inferred, and
            # judging under it is how a busy host pages. A host that stays busy shows as a
            # steady rate of these (docs/RUNBOOK.md).
            return "disturbed"
        usual = track.usual_cv(policy)
        noisy = usual is not None and cv > max(policy.noisy_cv_floor, policy.noisy_cv * usual)
        track.noisy_recent.append(noisy)
        # Noise that lasts is the series' state (a flapping link is noisy too): judge it.
        return "noisy" if noisy and sum(track.noisy_recent) < policy.trigger else None

    def _step(
        self, track: _Track, size: int, busbw: float, cv: float, foreign_cpu: float | None
    ) -> Verdict:
        policy = self.policy
        usable = _usable(busbw)
        track.seen += 1
        judged_against = track.baseline(policy)
        ratio = busbw / judged_against if judged_against is not None and usable else None
        reason = self._inconclusive(track, cv, foreign_cpu, usable)
        if reason is not None:
            return track.verdict(policy, size, ratio, inconclusive=reason)
        if judged_against is None:
            # Learning: nothing to compare with, so no low flags and no verdict yet.
            if usable:
                track.learn(busbw, cv)
            formed = track.baseline(policy)
            return track.verdict(policy, size, busbw / formed if formed and usable else None)
        spread = track.spread()
        bound = robust.low_bound(judged_against, spread, policy.ratio_for(size), policy.spread_k)
        low = ratio is None or busbw < bound
        was = track.degraded
        if policy.judges(size):
            self._count(track, low, busbw if usable else None)
            # A degraded link must never become the new normal: learn only results at or over
            # ratio x baseline on a link that is healthy now (the result that clears a
            # degradation counts). A result between the low bound and that line is noise the
            # series may have, not yet a fault, and not learned either: a moderate cut that
            # hides in a wide spread must not pull the baseline down to itself.
            line = policy.ratio_for(size) * judged_against
            if not low and not track.degraded and busbw >= line:
                track.learn(busbw, cv)
        else:
            track.degraded = False  # a verdict from a policy that judged this size
            if usable:  # shown, never paged on: the plain median of its recent results
                track.learn(busbw, cv)
        return replace(
            track.verdict(policy, size, ratio, changed=track.degraded != was),
            baseline=judged_against,
            spread=spread,
            low_bound=bound if policy.judges(size) else None,
        )

    def _count(self, track: _Track, low: bool, value: float | None) -> None:
        """The M-of-N rule, both ways."""
        track.recent.append(low)
        track.recent_values.append(value)
        lows = sum(track.recent)
        if not track.degraded and lows >= self.policy.trigger:
            track.degraded = True
        elif track.degraded and len(track.recent) - lows >= self.policy.trigger:
            track.degraded = False

    def verdict(self, key: BaselineKey) -> Verdict | None:
        with self._lock:
            return self._verdicts.get(key)

    def verdicts(self) -> dict[BaselineKey, Verdict]:
        with self._lock:
            return dict(self._verdicts)

    def adopt_ranks(self, ranks_of: Callable[[str], int | None]) -> None:
        """Give keys restored without a rank count (ranks 0) the count their probe ran with then:
        every probe ran on all its GPUs or CPU ranks before probes could run on the idle set."""
        with self._lock:
            for key in [k for k in self._tracks if k[4] == 0]:
                ranks = ranks_of(key[0])
                new = (key[0], key[1], key[2], key[3], ranks or 0)
                if ranks and new not in self._tracks:
                    self._tracks[new] = self._tracks.pop(key)
                    self._verdicts[new] = self._verdicts.pop(key)

    def to_json(self) -> dict[str, object]:
        with self._lock:
            entries = [
                _Entry(
                    probe=key[0],
                    op=key[1],
                    size_bytes=key[2],
                    path=key[3],
                    ranks=key[4],
                    learned=list(track.learned),
                    learned_cv=list(track.learned_cv),
                    recent=list(track.recent),
                    degraded=track.degraded,
                ).model_dump(mode="json")
                for key, track in sorted(self._tracks.items(), key=lambda item: item[0])
            ]
        return {"version": STATE_VERSION, "baselines": entries}

    @classmethod
    def from_json(cls, doc: object, policy: BaselinePolicy) -> BaselineBook:
        """A book from to_json()'s document, fitted to `policy` (which may have changed since)."""
        if not isinstance(doc, dict):
            raise ValueError(f"baseline state must be a JSON object, not {type(doc).__name__}")
        version = doc.get("version")
        if type(version) is not int or version != STATE_VERSION:
            raise ValueError(
                f"baseline state version {version!r} is not supported (expected {STATE_VERSION})"
            )
        try:
            parsed = _Document.model_validate(doc)
        except ValidationError as exc:
            raise ValueError(f"baseline state: {describe_validation_error(exc)}") from exc
        book = cls(policy)
        for entry in parsed.baselines:
            key = (entry.probe, entry.op, entry.size_bytes, entry.path, entry.ranks)
            if key in book._tracks:
                raise ValueError(f"baseline state lists {key!r} twice")
            track = book._new_track()
            # The deques' maxlen keeps the newest K values and N flags under a smaller policy.
            track.learned.extend(entry.learned)
            # Written before cvs were kept, there are none: the usual cv is learned afresh (only
            # its median is used, so fewer cvs than values need not line up).
            track.learned_cv.extend(entry.learned_cv)
            if track.baseline(policy) is not None:
                track.recent.extend(entry.recent)
                track.recent_values.extend([None] * len(track.recent))  # not kept
                track.degraded = entry.degraded and policy.judges(key[2])
            # else: a larger min_samples sends the key back to learning, with no verdict.
            book._tracks[key] = track
            book._verdicts[key] = track.verdict(policy, key[2])
        return book


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class _Entry(_Strict):
    probe: str
    op: str
    size_bytes: int = Field(ge=0)
    path: str
    # 0: written before baselines were kept per rank count (adopt_ranks says how many it was).
    ranks: int = Field(0, ge=0)
    learned: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]]
    learned_cv: list[Annotated[float, Field(ge=0, allow_inf_nan=False)]] = []
    recent: list[bool]
    degraded: bool


class _Document(_Strict):
    version: int
    baselines: list[_Entry]
