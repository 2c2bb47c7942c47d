"""Learned busbw baselines, long-term references and degradation verdicts per result key.

The daemon feeds every probe result to a BaselineBook and exports its verdicts; netmon.baseline.
document turns the book into the state file's JSON and back, netmon.baseline.state keeps that
file across restarts.

A verdict knows each series' own noise and its long-term level (docs/SIGNAL.md): a result is
low only when it is under `ratio` x the expected level AND more than `spread_k` robust spreads
under it, never under `floor` x it; a result that cannot be trusted (just after a start, other
work on the CPU ranks' cores, far noisier than usual) is inconclusive: neither low nor learned.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TypeAlias

from netmon.baseline import document, rule
from netmon.baseline.lines import Lines
from netmon.baseline.policy import BaselinePolicy
from netmon.baseline.track import Track, usable
from netmon.baseline.verdict import Verdict

# (probe, op, size_bytes, path, ranks): a probe on the idle set keeps one baseline per rank count.
BaselineKey: TypeAlias = tuple[str, str, int, str, int]

# Why a series was forgotten (netmon_reference_resets_total's reasons): an operator accepted its
# current performance (`netmon rebaseline`), or the hardware under it was replaced.
RESET_REASONS = ("operator", "hardware")

# Paths whose traffic leaves the node: their series also depend on the node's NICs.
CROSS_NODE_PATHS = ("group", "node_pair")


class BaselineBook:
    """Per-key baselines and verdicts. observe() may run in one thread while verdicts() snapshots
    in another (a scrape)."""

    def __init__(
        self,
        policy: BaselinePolicy,
        expect: Callable[[BaselineKey], float | None] | None = None,
    ) -> None:
        self.policy = policy
        # The level a series of this key is expected at before it has learned its own (a
        # site's `expect:` or the shipped table of published figures; bytes/s), or None.
        self.expect = expect or (lambda _key: None)
        self._tracks: dict[BaselineKey, Track] = {}
        self._verdicts: dict[BaselineKey, Verdict] = {}
        self._lock = threading.Lock()
        # What the references were learned on: {"node": [...], "gpus": [...], "nics": [...]}.
        self.identity: dict[str, tuple[str, ...]] = {}

    def observe(
        self,
        key: BaselineKey,
        busbw: float,
        cv: float = 0.0,
        foreign_cpu: float | None = None,
        *,
        at: float | None = None,
        resettle: bool = False,
    ) -> Verdict:
        """Judge one result, then learn from it if it is healthy. `cv` is the result's own
        dispersion, `foreign_cpu` the share of the machine's CPUs other processes used while it
        was measured (None: not known, or not judged on this backend), `at` when it came;
        `resettle`: its probe ran again after a pause, and the series settles again."""
        with self._lock:
            track = self._tracks.get(key)
            if track is None:
                track = self._tracks[key] = Track.new(self.policy)
            if resettle:
                track.seen = 0  # after a pause: cold again
            # A cv that is not a finite number says nothing about noise (and must not reach the
            # state file, which holds finite numbers only).
            cv = float(cv) if math.isfinite(cv) and cv >= 0 else 0.0
            when = time.time() if at is None else at
            verdict = rule.step(
                track, self.policy, key[2], float(busbw), cv, foreign_cpu, when, self.expect(key)
            )
            self._verdicts[key] = verdict
            return verdict

    def lines(self, key: BaselineKey) -> Lines | None:
        """The lines the series' next result would be judged by; None while it learns."""
        with self._lock:
            track = self._tracks.get(key)
            return None if track is None else track.lines(self.policy, key[2])

    def learn_healthy(self, key: BaselineKey, busbw: float, at: float | None = None) -> bool:
        """Learn a result judged elsewhere (a sweep's pair that passed), under the same rule as
        observe(): only a result at or over the series' healthy line is learned."""
        with self._lock:
            track = self._tracks.get(key)
            if track is None:
                track = self._tracks[key] = Track.new(self.policy)
            lines = track.lines(self.policy, key[2])
            if not usable(busbw) or (lines is not None and busbw < lines.healthy):
                return False
            track.learn(float(busbw), 0.0, time.time() if at is None else at, self.policy)
            return True

    def resettle(self) -> None:
        """Every series settles again: the ranks' process (a new rank zygote) is new."""
        with self._lock:
            for track in self._tracks.values():
                track.seen = 0

    def forget(self, keys: Iterable[BaselineKey]) -> list[BaselineKey]:
        """Start the given series afresh: baseline, reference and verdict. The only way a
        reference moves down (an operator's act, or new hardware); returns the keys forgotten."""
        with self._lock:
            forgotten = [key for key in keys if key in self._tracks]
            for key in forgotten:
                self._tracks[key] = Track.new(self.policy)
                self._verdicts[key] = self._tracks[key].verdict(self.policy, key[2])
            return forgotten

    def drop(self, keys: Iterable[BaselineKey]) -> None:
        """Let series go altogether (a shape of the jobs' traffic no longer seen): unlike
        forget(), nothing of them is kept, in memory or in the state file."""
        with self._lock:
            for key in keys:
                self._tracks.pop(key, None)
                self._verdicts.pop(key, None)

    def series(self) -> list[BaselineKey]:
        with self._lock:
            return sorted(self._tracks)

    def adopt_identity(
        self, current: Mapping[str, tuple[str, ...]]
    ) -> tuple[dict[str, list[str]], list[BaselineKey]]:
        """Compare the hardware the references were learned on with `current` and forget the
        series that depend on a part that was replaced: every series for the node or a GPU,
        the series that leave the node for a NIC. A replacement is an id gone AND a new one
        come; an id that is only gone (a GPU off the bus, a NIC whose driver failed) is a
        fault, not new hardware, and must not wipe the references that would show it: the
        stored identity keeps it. Returns {part: [ids gone, ids new]} of the replaced parts and
        the keys forgotten; a part not known before (or not readable now) is adopted as it is."""
        replaced: dict[str, list[str]] = {}
        adopted = dict(self.identity)
        for part, ids in current.items():
            known = set(self.identity.get(part, ()))
            gone, new = known - set(ids), set(ids) - known
            if known and gone and new:
                replaced[part] = sorted(gone) + sorted(new)
                adopted[part] = tuple(sorted(ids))
            elif ids:
                adopted[part] = tuple(sorted(known | set(ids)))  # an added part, or a gap
        forgotten: list[BaselineKey] = []
        if replaced:
            cross_only = set(replaced) == {"nics"}
            forgotten = self.forget(
                k for k in self.series() if not cross_only or k[3] in CROSS_NODE_PATHS
            )
        self.identity = adopted
        return replaced, forgotten

    def missing(self, current: Mapping[str, tuple[str, ...]]) -> dict[str, list[str]]:
        """Known ids that `current` lacks while nothing replaced them: parts gone missing."""
        found = {
            part: sorted(set(self.identity.get(part, ())) - set(ids))
            for part, ids in current.items()
            if ids
        }
        return {part: gone for part, gone in found.items() if gone}

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
            return document.dump(self._tracks, self.identity)

    @classmethod
    def from_json(cls, doc: object, policy: BaselinePolicy) -> BaselineBook:
        """A book from to_json()'s document, fitted to `policy` (which may have changed since)."""
        book = cls(policy)
        tracks, book.identity = document.load(doc, policy)
        for key, track in tracks:
            if key in book._tracks:
                raise ValueError(f"baseline state lists {key!r} twice")
            book._tracks[key] = track
            book._verdicts[key] = track.verdict(policy, key[2])
        return book
