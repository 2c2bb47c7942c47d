"""The state file's document: every series' learned window, reference and verdict, and the
hardware the references were learned on. Version 3; a version 2 file (a reference from the
first window) and a version 1 file (before references) load.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from netmon.baseline import robust
from netmon.baseline.hours import Hours
from netmon.baseline.policy import BaselinePolicy
from netmon.baseline.reference import Reference
from netmon.baseline.track import BAD, BETWEEN, HEALTHY, Track
from netmon.errors import describe_validation_error

STATE_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
Reason = Literal["flapping", "low", "drift", "decline"]

Key = tuple[str, str, int, str, int]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class _Hours(_Strict):
    # JSON has no tuples: each (hour, median) is read from a two-item list.
    done: list[Annotated[tuple[int, Positive], Field(strict=False)]] = []
    hour: int | None = None
    sample: list[Positive] = []
    stride: int = Field(1, ge=1)
    skipped: int = Field(0, ge=0)

    @classmethod
    def of(cls, hours: Hours) -> _Hours:
        return cls(
            done=list(hours.done),
            hour=hours.hour,
            sample=list(hours.sample),
            stride=hours.stride,
            skipped=hours.skipped,
        )

    def hours(self) -> Hours:
        return Hours(list(self.done), self.hour, list(self.sample), self.stride, self.skipped)


class _Entry(_Strict):
    probe: str
    op: str
    size_bytes: int = Field(ge=0)
    path: str
    # 0: written before baselines were kept per rank count (adopt_ranks says how many it was).
    ranks: int = Field(0, ge=0)
    learned: list[Positive]
    learned_cv: list[NonNegative] = []
    older: list[Positive] = []  # version 2
    recent: list[bool]
    degraded: bool
    # Version 2: absent in a version 1 file.
    healthy: list[bool] = []
    level: list[NonNegative] = []
    reference: Positive | None = None
    reason: Reason | None = None
    # Version 3: the long level's results, the flapping rule's flags, the reference while it
    # learns (its hour medians, the hour under way and its sample) or once fixed (its spread),
    # the accepted level, every condition that holds, and since when.
    long: list[NonNegative] = []
    flaps: str = Field("", pattern=f"^[{BAD[0]}{BAD[1]}{HEALTHY}{BETWEEN}]*$")
    reference_mature: bool = False
    reference_spread: NonNegative = 0.0
    reference_low: Positive | None = None
    reference_hours: _Hours | None = None  # while it learns
    trend: _Hours | None = None
    accepted: Positive | None = None
    conditions: list[Reason] = []
    tolerated: int = Field(0, ge=0)
    degraded_since: float | None = Field(None, allow_inf_nan=False)
    since: int = Field(0, ge=0)
    below: int = Field(0, ge=0)
    # Later in version 3 (absent in older files: a fault not yet held, no rate known yet).
    held: bool = False
    seed: Positive | None = None  # the level a young series' first results showed (a cut found)
    rate_bad: NonNegative = 0.0
    rate_count: NonNegative = 0.0


class _Document(_Strict):
    version: int
    baselines: list[_Entry]
    identity: dict[str, list[str]] = {}


def dump(tracks: Mapping[Key, Track], identity: Mapping[str, tuple[str, ...]]) -> dict[str, object]:
    entries = [
        _Entry(
            probe=key[0],
            op=key[1],
            size_bytes=key[2],
            path=key[3],
            ranks=key[4],
            learned=list(track.learned),
            learned_cv=list(track.learned_cv),
            older=list(track.older),
            recent=list(track.recent),
            degraded=track.degraded,
            healthy=list(track.healthy),
            level=list(track.level),
            reference=track.reference.value(),
            reason=track.reason,  # type: ignore[arg-type]
            long=list(track.long),
            flaps="".join(track.flaps),
            reference_mature=track.reference.mature,
            reference_spread=track.reference.spread,
            reference_low=track.reference.low,
            reference_hours=_Hours.of(track.reference.hours),
            trend=_Hours.of(track.trend),
            accepted=track.accepted,
            conditions=sorted(track.conditions),  # type: ignore[arg-type]
            tolerated=track.tolerated,
            degraded_since=track.degraded_since,
            since=track.since,
            below=track.below,
            held=track.held,
            seed=track.seed,
            rate_bad=track.rate_bad,
            rate_count=track.rate_count,
        ).model_dump(mode="json")
        for key, track in sorted(tracks.items(), key=lambda item: item[0])
    ]
    return {
        "version": STATE_VERSION,
        "identity": {part: list(ids) for part, ids in sorted(identity.items())},
        "baselines": entries,
    }


def load(
    doc: object, policy: BaselinePolicy
) -> tuple[list[tuple[Key, Track]], dict[str, tuple[str, ...]]]:
    """The tracks and the identity of dump()'s document, fitted to `policy`; ValueError with
    one line naming what is wrong otherwise."""
    if not isinstance(doc, dict):
        raise ValueError(f"baseline state must be a JSON object, not {type(doc).__name__}")
    version = doc.get("version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise ValueError(
            f"baseline state version {version!r} is not supported (expected one of "
            f"{', '.join(map(str, READABLE_VERSIONS))})"
        )
    try:
        parsed = _Document.model_validate(doc)
    except ValidationError as exc:
        raise ValueError(f"baseline state: {describe_validation_error(exc)}") from exc
    identity = {part: tuple(ids) for part, ids in parsed.identity.items()}
    return list(_tracks(parsed.baselines, policy, parsed.version)), identity


def _tracks(
    entries: list[_Entry], policy: BaselinePolicy, version: int
) -> Iterator[tuple[Key, Track]]:
    for entry in entries:
        key = (entry.probe, entry.op, entry.size_bytes, entry.path, entry.ranks)
        track = Track.new(policy)
        # The deques' maxlen keeps the newest values and flags under a smaller policy.
        # Values a smaller window lets go are still learned values: kept for the spread.
        track.older.extend(
            [*entry.older, *entry.learned[: max(len(entry.learned) - policy.window, 0)]]
        )
        track.learned.extend(entry.learned)
        # Written before cvs were kept, there are none: the usual cv is learned afresh (only
        # its median is used, so fewer cvs than values need not line up).
        track.learned_cv.extend(entry.learned_cv)
        track.level.extend(entry.level)
        track.long.extend(entry.long)
        track.flaps.extend(entry.flaps)
        track.reference = _reference(entry, version)
        if track.reference.value() is None and len(track.learned) >= policy.window:
            # A version 1 file: the reference starts from the baseline it kept.
            track.reference = Reference.seeded(robust.median(track.learned), time.time())
        track.accepted = entry.accepted
        track.below = entry.below
        track.rate_bad, track.rate_count = min(entry.rate_bad, entry.rate_count), entry.rate_count
        if entry.trend is not None:
            track.trend = entry.trend.hours()
        # A young series found cut keeps its seed, and so its verdict, however few it learned.
        track.seed = entry.seed
        if track.baseline(policy) is not None or track.seed is not None:
            track.recent.extend(entry.recent)
            # Version 1 kept no healthy flags (nor a level): a degraded series clears on new
            # healthy results only.
            track.healthy.extend(entry.healthy)
            track.recent_values.extend([None] * len(track.recent))  # not kept
            if policy.judges(key[2]):
                track.conditions = _conditions(entry, version)
                track.tolerated = entry.tolerated
                # A file from before the time was kept: degraded since this start, at least.
                since = entry.degraded_since if entry.degraded_since is not None else time.time()
                track.degraded_since = since if track.conditions else None
                # Version 2 did not count: its degraded series count from the restart.
                track.since = entry.since
                track.held = entry.held
        # else: a larger min_samples sends the key back to learning, with no verdict.
        yield key, track


def _reference(entry: _Entry, version: int) -> Reference:
    if version < 3:
        # A reference of the first window (version 2): where its hours begin.
        return (
            Reference()
            if entry.reference is None
            else Reference.seeded(entry.reference, time.time())
        )
    hours = entry.reference_hours.hours() if entry.reference_hours else Hours()
    if entry.reference_mature and entry.reference is not None:
        low = entry.reference_low or entry.reference
        return Reference(hours, level=entry.reference, spread=entry.reference_spread, low=low)
    return Reference(hours)


def _conditions(entry: _Entry, version: int) -> set[str]:
    if version >= 3:
        return set(entry.conditions)
    return {entry.reason or "low"} if entry.degraded else set()
