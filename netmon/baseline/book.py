"""Learned busbw baselines and degradation verdicts per result key, and the file that keeps them.

The daemon feeds every probe result to a BaselineBook and exports its verdicts; the book is saved
atomically so that a restart neither forgets a baseline nor silently clears a degraded link.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import statistics
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from netmon.errors import describe_validation_error

STATE_VERSION = 1
# A real book is keys x window floats, a few MB at most; a file far larger is not one of ours,
# and reading it whole could take the daemon's memory with it.
MAX_STATE_BYTES = 64 << 20

# (probe, op, size_bytes, path, ranks): a probe on the idle set keeps one baseline per rank count.
BaselineKey: TypeAlias = tuple[str, str, int, str, int]


class BaselinePolicy(BaseModel):
    """How a baseline is learned (median of the last K healthy results) and when a link is degraded
    (M of the last N results below R x baseline; M of the last N not low to clear)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    window: int = Field(default=20, ge=1)  # K: the baseline is the median of the last K learned
    min_samples: int = Field(default=5, ge=1)  # healthy results needed before any verdict
    ratio: float = Field(default=0.8, gt=0, le=1, allow_inf_nan=False)  # R: low below R x baseline
    trigger: int = Field(default=3, ge=1)  # M: low results among the last N that degrade
    of: int = Field(default=5, ge=1)  # N: how many recent results the M-of-N rule looks at

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


@dataclass
class _Track:
    """One key's mutable state; only BaselineBook touches it, under its lock."""

    learned: deque[float]
    recent: deque[bool]  # True = low
    degraded: bool = False

    def baseline(self, policy: BaselinePolicy) -> float | None:
        if len(self.learned) < policy.min_samples:
            return None
        return float(statistics.median(self.learned))

    def verdict(self, policy: BaselinePolicy, ratio: float | None = None) -> Verdict:
        return Verdict(
            baseline=self.baseline(policy),
            ratio=ratio,
            degraded=self.degraded,
            healthy_samples=len(self.learned),
            low_recent=sum(self.recent),
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
        return _Track(deque(maxlen=self.policy.window), deque(maxlen=self.policy.of))

    def observe(self, key: BaselineKey, busbw: float) -> Verdict:
        with self._lock:
            track = self._tracks.get(key)
            if track is None:
                track = self._tracks[key] = self._new_track()
            verdict = self._step(track, float(busbw))
            self._verdicts[key] = verdict
            return verdict

    def _step(self, track: _Track, busbw: float) -> Verdict:
        policy = self.policy
        usable = _usable(busbw)
        judged_against = track.baseline(policy)
        if judged_against is None:
            # Learning: nothing to compare with, so no low flags and no verdict yet.
            if usable:
                track.learned.append(busbw)
            formed = track.baseline(policy)
            return track.verdict(policy, busbw / formed if formed is not None and usable else None)

        ratio = busbw / judged_against if usable else None
        low = ratio is None or ratio < policy.ratio
        track.recent.append(low)
        lows = sum(track.recent)
        if not track.degraded and lows >= policy.trigger:
            track.degraded = True
        elif track.degraded and len(track.recent) - lows >= policy.trigger:
            track.degraded = False
        # A degraded link must never become the new normal: learn only good results on a link
        # that is healthy now (the result that clears a degradation counts as healthy).
        if not low and not track.degraded:
            track.learned.append(busbw)
        return Verdict(
            baseline=judged_against,
            ratio=ratio,
            degraded=track.degraded,
            healthy_samples=len(track.learned),
            low_recent=lows,
        )

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
            if track.baseline(policy) is not None:
                track.recent.extend(entry.recent)
                track.degraded = entry.degraded
            # else: a larger min_samples sends the key back to learning, with no verdict.
            book._tracks[key] = track
            book._verdicts[key] = track.verdict(policy)
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
    recent: list[bool]
    degraded: bool


class _Document(_Strict):
    version: int
    baselines: list[_Entry]


def save(path: Path, book: BaselineBook) -> None:
    """Write the book so that `path` holds either the old state or the new, never a torn file.

    OSError (a full disk, a read-only directory) propagates; the caller decides how loud to be.
    """
    data = (json.dumps(book.to_json(), allow_nan=False, separators=(",", ":")) + "\n").encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with open(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some filesystems (certain FUSE and network mounts) cannot fsync a directory; the
        # file's own data is already synced, so this only narrows a crash window.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def load(path: Path, policy: BaselinePolicy) -> tuple[BaselineBook, str | None]:
    """The saved book, or an empty one and a one-line warning; never raises over the file.

    A missing file is a first start (no warning). A file that is not a valid state document is
    renamed to "<name>.corrupt-<unix time>" so that the next save cannot destroy the evidence.
    """
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return BaselineBook(policy), None
    except OSError as exc:
        return BaselineBook(policy), (
            f"cannot read baseline state {path} ({_one_line(exc)}); starting with no baselines"
        )
    try:
        if len(raw) > MAX_STATE_BYTES:
            raise ValueError(f"larger than {MAX_STATE_BYTES} bytes")
        return BaselineBook.from_json(json.loads(raw), policy), None
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
        return BaselineBook(policy), _set_aside(path, _one_line(exc))


def _set_aside(path: Path, reason: str) -> str:
    stamp = int(time.time())
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    serial = 1
    while aside.exists():  # two bad files in one second: keep both
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{serial}")
        serial += 1
    try:
        os.replace(path, aside)
    except OSError as exc:
        return (
            f"baseline state {path} is unusable ({reason}) and could not be moved aside "
            f"({_one_line(exc)}); starting with no baselines"
        )
    return f"baseline state {path} is unusable ({reason}); moved to {aside.name}, starting afresh"


def _one_line(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
