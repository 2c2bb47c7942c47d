"""The daemon's baseline book over its life: restored (or not, and why) at start, fitted to
the hardware it runs on, forgotten where an operator asks, saved after each result.

Everything that can go wrong with state is visible: a start without usable state is logged as
such and exported (netmon_baseline_restored 0), a state file that is there but unusable is
counted by reason (netmon_state_errors_total) and set aside, never taken for a first start, a
failed save is counted (netmon_state_write_errors_total), and every forgotten series is logged
and counted by reason (netmon_reference_resets_total).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from netmon import baseline
from netmon.baseline import requests
from netmon.baseline.state import PROBLEM_REASONS, StateProblem, remove_stale_temporaries
from netmon.errors import UsageError

log = logging.getLogger(__name__)

SHOWN = 5  # temporaries named in the log line; the count says how many there were


def clear_interrupted_saves(state_dir: Path, names: Iterable[str]) -> list[Path]:
    """Remove the temporaries that saves of `names` killed midway left in `state_dir` (only
    those: netmon.baseline.state.remove_stale_temporaries), logged; the paths removed."""
    try:
        removed = remove_stale_temporaries(state_dir, names)
    except OSError as exc:
        log.warning("state_dir %s: cannot look for stale temporary files: %s", state_dir, exc)
        return []
    if removed:
        names = sorted(p.name for p in removed)
        more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
        log.warning(
            "state_dir %s: removed %d temporary file(s) left by interrupted saves: %s%s",
            state_dir,
            len(removed),
            " ".join(names[:SHOWN]),
            more,
        )
    return removed


class BaselineKeeper:
    def __init__(
        self,
        book: baseline.BaselineBook,
        state_path: Path | None = None,
        restored: bool = False,
    ) -> None:
        self.book = book
        self.state_path = state_path
        self.restored = restored
        self.write_errors = 0
        # Why the state file found at start could not be used, if it could not: 1 by reason.
        self.problem: StateProblem | None = None
        # The state directory could not be made at start: every save that cannot happen is a
        # failed one (NetmonStateWriteFailing), not a silent no-op.
        self.unusable = False
        self._resets: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        # Probe threads end in parallel: one of them at a time takes requests and saves, so a
        # request is applied once and an older book never lands on disk after a newer one.
        self._io = threading.Lock()
        self._warned: set[str] = set()

    @classmethod
    def open(
        cls,
        state_path: Path | None,
        policy: baseline.BaselinePolicy,
        identity: Mapping[str, tuple[str, ...]],
        refuse_corrupt: bool = False,
        expect: Callable[[baseline.BaselineKey], float | None] | None = None,
    ) -> BaselineKeeper:
        """The book from `state_path` (None: the state directory is unusable), fitted to the
        hardware `identity` and to the operator's pending requests, expecting `expect`'s levels
        of its series (netmon.baseline.expect). With `refuse_corrupt`, a state file that is
        there but unusable is left in place and UsageError raised."""
        if state_path is None:
            log.warning("starting without baseline state: the state directory is unusable")
            keeper = cls(baseline.BaselineBook(policy))
            keeper.unusable = True
        else:
            book, problem = baseline.load(state_path, policy, keep=refuse_corrupt)
            if problem is not None and refuse_corrupt:
                raise UsageError(
                    f"state_on_corrupt is refuse: {problem.message}; move it away to start "
                    "afresh, or set state_on_corrupt: continue"
                )
            restored = problem is None and state_path.exists()
            if problem is not None:
                log.warning(
                    "starting without usable baseline state (%s): %s", problem.reason, problem
                )
            elif not restored:
                log.info("no baseline state at %s: a first start, every series learns", state_path)
            keeper = cls(book, state_path, restored)
            keeper.problem = problem
        if expect is not None:
            # Not part of the state file: what is expected follows this start's GPUs and config.
            keeper.book.expect = expect
        keeper.adopt_identity(identity)
        if keeper.take_requests():
            keeper.save()
        return keeper

    def adopt_identity(self, identity: Mapping[str, tuple[str, ...]]) -> None:
        missing = self.book.missing(identity)
        changed, forgotten = self.book.adopt_identity(identity)
        if changed:
            self._count(forgotten, "hardware")
            log.warning(
                "new hardware (%s): %d series learn their baselines and references afresh",
                "; ".join(f"{part} {' '.join(ids)}" for part, ids in sorted(changed.items())),
                len(forgotten),
            )
            self.save()
        for part, gone in sorted(missing.items()):
            if part not in changed:
                log.warning(
                    "hardware missing since the references were learned (%s: %s): kept, as a "
                    "fault and not new hardware",
                    part,
                    " ".join(gone),
                )

    def take_requests(self) -> list[baseline.BaselineKey]:
        """Apply the operator's pending `netmon rebaseline` requests, oldest first; the keys
        forgotten (the caller saves the book)."""
        if self.state_path is None:
            return []
        with self._io:
            return self._take_requests(self.state_path.parent)

    def _take_requests(self, state_dir: Path) -> list[baseline.BaselineKey]:
        forgotten: list[baseline.BaselineKey] = []
        for request in requests.take(state_dir):
            if isinstance(request, str):
                if request not in self._warned:  # one that cannot even be set aside stays
                    self._warned.add(request)
                    log.warning("%s", request)
                continue
            keys = [k for k in self.book.series() if not request.probes or k[0] in request.probes]
            these = self.book.forget(keys)
            self._count(these, "operator")
            log.warning(
                "rebaseline: %d series forget their baselines and references: %s",
                len(these),
                request.describe(),
            )
            forgotten += these
        return forgotten

    def _count(self, keys: Iterable[baseline.BaselineKey], reason: str) -> None:
        with self._lock:
            for key in keys:
                counted = (key[0], reason)
                self._resets[counted] = self._resets.get(counted, 0) + 1

    def state_errors(self) -> dict[str, int]:
        """Unusable state files found at start, by reason, 0 for every reason."""
        return {
            r: int(self.problem is not None and self.problem.reason == r) for r in PROBLEM_REASONS
        }

    def resets(self, probes: Iterable[str]) -> dict[tuple[str, str], int]:
        """Forgotten series by (probe, reason), 0 for every configured probe's reasons."""
        with self._lock:
            counts = {(p, r): 0 for p in probes for r in baseline.RESET_REASONS}
            return {**counts, **self._resets}

    def save(self) -> None:
        if self.state_path is None:
            if self.unusable:
                with self._lock:
                    self.write_errors += 1
            return
        with self._io:
            try:
                baseline.save(self.state_path, self.book)
            except OSError as exc:
                with self._lock:
                    self.write_errors += 1
                log.warning("cannot save baselines to %s: %s", self.state_path, exc)
