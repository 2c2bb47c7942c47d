"""The daemon's side of cluster sweeps: POST /sweep hands it a sealed report,
netmon.sweep.delivery.inbox decides, and what it accepts is kept in state_dir/sweep.json, so that a
restart keeps the last results, the count of sweeps in a row that named this node and the verdicts
of its recent sweeps, and published for /metrics."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from netmon.baseline import state
from netmon.config import NetmonConfig
from netmon.errors import one_line
from netmon.exposition.snapshot import SweepView
from netmon.group.auth import setting_secret
from netmon.sweep.delivery import inbox
from netmon.sweep.delivery.inbox import InboxError, SweepState
from netmon.sweep.delivery.node_report import SEAL_GROUP
from netmon.sweep.delivery.signing import Opens, load_verifier

log = logging.getLogger(__name__)

STATE_FILE = "sweep.json"
MAX_STATE_BYTES = 1 << 20  # one report (at most 64 KiB) and a count; a larger file is not ours


def node_names(
    hostname: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """The names this node's reports may carry: Slurm names a node by its short host name as a
    rule, so that one, and the full one where it differs; in a pod (whose host name is the
    pod's), the node's name too, which the chart passes in NODE_NAME (spec.nodeName)."""
    full = hostname if hostname is not None else socket.gethostname()
    node = (os.environ if environ is None else environ).get("NODE_NAME", "").strip()
    return tuple(dict.fromkeys(n for n in (full.split(".")[0], full, node) if n))


def secret_path(config: NetmonConfig) -> tuple[Path | None, Path | None]:
    """The files the inbox opens reports with: (sweep.verify_key_file, sweep.secret_file)."""
    if config.sweep is None:
        return None, None
    return config.sweep.verify_key_file, config.sweep.secret_file


def open_inbox(
    config: NetmonConfig, state_dir: Path | None, publish: Callable[[SweepView], None]
) -> SweepInbox | None:
    """The inbox of a daemon with `sweep.verify_key_file` (reports the sweep host signed, only)
    or `sweep.secret_file` (sealed with the shared secret); UsageError when it cannot be used,
    None without either; `state_dir` None: the directory is unusable and nothing is kept."""
    key, secret = secret_path(config)
    opener: bytes | Opens
    if key is not None:
        opener = load_verifier(SEAL_GROUP, key)
    elif secret is not None:
        opener = setting_secret("sweep.secret_file", secret)
    else:
        return None
    kept = state_dir / STATE_FILE if state_dir is not None else None
    return SweepInbox(opener, node_names(), kept, publish)


class SweepInbox:
    """Takes delivered reports one at a time, keeps what they leave, publishes it."""

    def __init__(
        self,
        secret: bytes | Opens,
        names: Sequence[str],
        path: Path | None,
        publish: Callable[[SweepView], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._secret = secret
        self.names = tuple(names)
        self._path = path
        self._publish = publish
        self._clock = clock
        # One delivery at a time: the replay check and the count it moves are one decision.
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(inbox.REPORT_OUTCOMES, 0)
        self._state = load(path) if path is not None else SweepState()
        self._show()
        log.info(
            "sweep: POST /sweep takes reports for node %s (%s)",
            " or ".join(self.names),
            f"kept in {path}" if path is not None else "not kept: state_dir unusable",
        )

    def receive(self, body: bytes) -> tuple[int, str]:
        """POST /sweep: the HTTP status and a one-line answer."""
        with self._lock:
            try:
                report = inbox.accept(
                    _text(body), self._secret, self.names, self._clock(), self._state.last_sweep
                )
            except InboxError as exc:
                self._counts[exc.outcome] += 1
                self._show()
                log.warning("sweep: report refused (%d): %s", exc.status, exc)
                return exc.status, str(exc)
            self._state = self._state.after(report)
            self._counts["accepted"] += 1
            self._save()
            self._show()
            in_a_row = self._state.suspect_sweeps
        named = f"named suspect, {in_a_row} sweep(s) in a row" if report.suspect else "not named"
        log.info(
            "sweep %s: report accepted, %d results, %s", report.sweep, len(report.results), named
        )
        return 204, "accepted"

    def _show(self) -> None:
        state = self._state
        counts = dict(self._counts)
        self._publish(SweepView(state.report, state.suspect_sweeps, state.suspect_onsets, counts))

    def _save(self) -> None:
        if self._path is None:
            return
        document = json.dumps(self._state.to_json(), allow_nan=False, separators=(",", ":"))
        try:
            state.write_atomic(self._path, (document + "\n").encode())
        except OSError as exc:
            log.warning("sweep: cannot save %s (%s): a restart forgets this sweep", self._path, exc)


def _text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise inbox.Malformed("not UTF-8 text") from None


def load(path: Path) -> SweepState:
    """The state saved at `path`, else a fresh one: none saved yet, or (logged) an unreadable
    file, or one that is not a state document, which is set aside and kept."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return SweepState()
    except OSError as exc:
        log.warning("sweep: cannot read %s (%s): starting without sweep results", path, exc)
        return SweepState()
    try:
        if len(raw) > MAX_STATE_BYTES:
            raise ValueError(f"larger than {MAX_STATE_BYTES} bytes")
        return SweepState.from_json(json.loads(raw))
    except (ValueError, RecursionError) as exc:  # ValidationError and UnicodeDecodeError too
        reason = one_line(exc)
    try:
        aside = state.set_aside(path)
    except OSError as exc:
        log.warning(
            "sweep: %s is unusable (%s) and could not be moved aside (%s); the next sweep "
            "replaces it",
            path,
            reason,
            one_line(exc),
        )
    else:
        log.warning("sweep: %s is unusable (%s); moved to %s", path, reason, aside.name)
    return SweepState()
