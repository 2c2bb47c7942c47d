"""The state file's document: every series' learned window, reference and verdict, and the
hardware the references were learned on. Version 2; a version 1 file (before references) loads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from netmon.baseline.policy import BaselinePolicy
from netmon.baseline.track import Track
from netmon.errors import describe_validation_error

STATE_VERSION = 2
READABLE_VERSIONS = (1, 2)

Key = tuple[str, str, int, str, int]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


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
    reason: Literal["low", "drift"] | None = None


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
            reference=track.reference,
            reason=track.reason if track.degraded else None,  # type: ignore[arg-type]
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
    return list(_tracks(parsed.baselines, policy)), identity


def _tracks(entries: list[_Entry], policy: BaselinePolicy) -> Iterator[tuple[Key, Track]]:
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
        track.reference = entry.reference
        if track.reference is None and len(track.learned) >= policy.window:
            # A version 1 file: the reference starts from the baseline it kept.
            track.reference = track.baseline(policy)
        if track.baseline(policy) is not None:
            track.recent.extend(entry.recent)
            # Version 1 kept no healthy flags (nor a level): a degraded series clears on new
            # healthy results only.
            track.healthy.extend(entry.healthy)
            track.recent_values.extend([None] * len(track.recent))  # not kept
            track.degraded = entry.degraded and policy.judges(key[2])
            track.reason = (entry.reason or "low") if track.degraded else None
        # else: a larger min_samples sends the key back to learning, with no verdict.
        yield key, track
