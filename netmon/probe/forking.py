"""The launcher's side of the rank zygote (netmon.probe.zygote): starting it, opening a session
per probe, forking ranks through it, and deciding when a rank must be spawned as before.

Never imports torch. The zygote is started on first use and again when it died; a start that
fails is not retried for RETRY_AFTER_S, and every probe in between spawns its ranks (counted as
a fallback, "unavailable"). A rank is forked only when everything that differs between its
environment and the zygote's is read after the fork (LATE_PREFIXES), it has no wrapper command,
and it runs on the zygote's interpreter; otherwise it is spawned, and the reason counted. A
zygote that refuses a fork says why (its CUDA driver loaded, a second thread), and the reason is
logged as well as counted ("refused").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

from netmon.probe.processes import process_state
from netmon.probe.zygote import MESSAGE_BYTES, OWN_ENV, send

log = logging.getLogger(__name__)

# Why a probe's ranks were spawned although a zygote was configured (a bounded label).
FALLBACK_REASONS = ("wrapper", "environment", "python", "unavailable", "refused")
START_METHODS = ("fork", "spawn")
START_TIMEOUT_S = 120.0
# How often a start waiting for the zygote's "ready" looks whether it was called off meanwhile
# (close(), or the daemon's stop event).
READY_POLL_S = 0.2
RETRY_AFTER_S = 60.0
CLOSE_GRACE_S = 5.0
# The zygote answers a fork at once and a reap as soon as the killed rank ends: no answer in this
# long means it is stopped or wedged, and it is killed (the next probe starts another).
REPLY_TIMEOUT_S = 30.0

# Variables read only when a rank initialises CUDA, NCCL, gloo or the c10d process group, all of
# which happens after the fork (docs/FACTS.md, "The rank zygote"). Anything else that differs from
# the zygote's environment may have been read by `import torch` already: such a rank is spawned.
LATE_PREFIXES = (
    "NCCL_",
    "CUDA_",
    "GLOO_",
    "TORCH_NCCL_",
    "TORCH_DISTRIBUTED_DEBUG",
    "PYTORCH_CUDA_ALLOC_CONF",
    "OMP_NUM_THREADS",
    "UCX_",
    "FI_",
    "NETMON_",
)


def early_variable(zygote_env: Mapping[str, str], rank_env: Mapping[str, str]) -> str | None:
    """The first variable a rank needs different from the zygote's and may be read too early."""
    names = zygote_env.keys() | rank_env.keys()
    changed = sorted(k for k in names if zygote_env.get(k) != rank_env.get(k))
    return next((k for k in changed if not k.startswith(LATE_PREFIXES)), None)


class ZygoteLost(Exception):
    """The zygote's session ended under a probe: the zygote died or was killed."""


class Session:
    """One probe's channel to the zygote: forks its ranks, hears their exits, reaps them."""

    def __init__(
        self,
        sock: socket.socket,
        on_stuck: Callable[[], None] = lambda: None,
        reply_timeout_s: float = REPLY_TIMEOUT_S,
    ) -> None:
        self.sock = sock
        self.on_stuck = on_stuck
        self.reply_timeout_s = reply_timeout_s
        self.exits: dict[int, int] = {}
        self.reaped: set[int] = set()
        self.cpu_s: dict[int, float] = {}  # a reaped rank's whole CPU time, as wait4 gave it
        self.lost = False
        self._replies: list[dict[str, Any]] = []

    def fork(
        self, env: Mapping[str, str], stdin: int, stdout: int, stderr: int, channel: int
    ) -> int | str:
        """The new rank's PID, or why the zygote refused. `channel` is the writing end of the
        rank's channel to the launcher; the zygote names it in the rank's environment."""
        try:
            send(self.sock, {"op": "fork", "env": dict(env)}, [stdin, stdout, stderr, channel])
        except OSError as exc:
            self.lost = True
            raise ZygoteLost(str(exc)) from None
        reply = self._await(("forked", "refused"))
        if reply["op"] == "refused":
            return str(reply.get("reason", "refused"))
        return int(reply["pid"])

    def exit_status(self, pid: int) -> int | None:
        self._pump(block=False)
        return self.exits.get(pid)

    def reap(self, pid: int) -> None:
        if self.lost or pid in self.reaped:
            return
        try:
            send(self.sock, {"op": "reap", "pid": pid})
        except OSError:
            self.lost = True
        while pid not in self.reaped and not self.lost:
            self._pump(block=True)

    def close(self) -> None:
        self.sock.close()

    def _await(self, ops: tuple[str, ...]) -> dict[str, Any]:
        while True:
            for reply in self._replies:
                if reply["op"] in ops:
                    self._replies.remove(reply)
                    return reply
            if self.lost:
                raise ZygoteLost("the rank zygote closed the session")
            self._pump(block=True)

    def _pump(self, block: bool) -> None:
        """Read what the zygote said: exits and reaps are noted, other replies queued. Blocking,
        it returns after one message; an ended session sets `lost`."""
        while not self.lost:
            self.sock.settimeout(self.reply_timeout_s if block else 0.0)
            try:
                data = self.sock.recv(MESSAGE_BYTES)
            except BlockingIOError:
                return
            except TimeoutError:
                log.warning("rank zygote silent for %.0f s: killing it", self.reply_timeout_s)
                self.lost = True
                self.on_stuck()
                return
            except OSError:
                data = b""
            if not data:
                self.lost = True
                return
            message = json.loads(data)
            op = message.get("op")
            if op == "exit":
                self.exits[int(message["pid"])] = int(message["status"])
            elif op == "reaped":
                self.reaped.add(int(message["pid"]))
                if "cpu_s" in message:
                    self.cpu_s[int(message["pid"])] = float(message["cpu_s"])
            else:
                self._replies.append(message)
            if block:
                return


class ForkedRank:
    """A rank the zygote forked: the zygote is its parent and reaps it when the launcher asks."""

    def __init__(self, session: Session, pid: int, stdin: IO[bytes], channel: IO[bytes]) -> None:
        self.session = session
        self.pid = pid
        self.stdin: IO[bytes] | None = stdin
        self.channel: IO[bytes] | None = channel

    def exit_status(self) -> int | None:
        status = self.session.exit_status(self.pid)
        if status is not None:
            return status
        if self.session.lost:
            # Orphaned: it exits by itself (its parent changed) and init reaps it.
            state = process_state(self.pid)
            return -int(signal.SIGKILL) if state in (None, "Z") else None
        return None

    def cpu_s(self) -> float | None:
        return self.session.cpu_s.get(self.pid)

    def reap(self) -> None:
        self.session.reap(self.pid)
        if self.session.lost:
            deadline = time.monotonic() + CLOSE_GRACE_S
            while process_state(self.pid) not in (None, "Z") and time.monotonic() < deadline:
                time.sleep(0.02)


class Zygote:
    """A process's handle on its rank zygote (one per interpreter that ranks run on)."""

    def __init__(
        self,
        python: str,
        env: Mapping[str, str],
        on_start: Callable[[], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        """`env` is what the zygote starts with: a rank's environment less its own settings.
        Once `cancel` is set (the daemon stopping), a start under way is cut short and no
        session is opened."""
        self.python = python
        self.env = {**env, "CUDA_VISIBLE_DEVICES": ""}  # belt and braces: no GPU to initialise
        self.on_start = on_start
        self.starts = 0
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._failed_at: float | None = None
        self._closed = False
        self._cancel = cancel or threading.Event()
        self.reply_timeout_s = REPLY_TIMEOUT_S
        self._refusals: set[str] = set()  # the reasons this zygote gave, each logged once

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def session(self) -> Session | None:
        """A new session, starting the zygote if needed; None when there is none to be had."""
        with self._lock:
            if self._abandoned():
                return None
            for _attempt in range(2):  # a zygote found dead is started again, once
                if not self._running() and not self._start():
                    return None
                mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                try:
                    assert self._control is not None
                    send(self._control, {"op": "session"}, [theirs.fileno()])
                    return Session(mine, self._kill, self.reply_timeout_s)
                except OSError:
                    mine.close()
                    self._stop()
                finally:
                    theirs.close()
            return None

    def refused(self, reason: str) -> None:
        """Log why the zygote refused a fork: a warning the first time it gives a reason, since
        every probe after it is refused alike (and counted) until it is started again. No lock:
        a start under way holds it for as long as torch takes to import, and a race costs no
        more than a second warning."""
        first = reason not in self._refusals
        self._refusals.add(reason)
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "rank zygote %s refused to fork (%s): ranks spawned",
            self.pid,
            reason,
        )

    def close(self) -> None:
        """Ends the zygote (closing its channel ends it, and every rank it still has). A start
        under way is cut short within READY_POLL_S, not waited for: a daemon told to stop while
        its zygote imports torch stops at once, not when the import is done."""
        self._closed = True  # read by a start under way, which holds the lock
        with self._lock:
            self._stop()

    def _abandoned(self) -> bool:
        return self._closed or self._cancel.is_set()

    def _kill(self) -> None:
        """A stopped or wedged zygote: SIGKILL ends it (its ranks end as their parent goes), and
        the next session starts another. No lock: a session may be waiting on it."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def _running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self._control is not None

    def _start(self) -> bool:
        self._stop()
        if self._failed_at is not None and time.monotonic() - self._failed_at < RETRY_AFTER_S:
            return False
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [self.python, "-m", "netmon.probe.zygote", str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env={**self.env, **OWN_ENV},
                pass_fds=(theirs.fileno(),),
                # Its own session: a terminal's Ctrl-C reaches the launcher, which then stops
                # the ranks in order, not the zygote under it.
                start_new_session=True,
            )
        except OSError as exc:
            mine.close()
            return self._failed(f"cannot start: {exc}")
        finally:
            theirs.close()
        self._control = mine
        ready = self._await_ready()
        if ready is None and self._abandoned():
            self._kill()
            self._stop()
            return False
        if ready is None:
            return self._failed("it did not report ready")
        self._failed_at = None
        self._refusals.clear()
        self.starts += 1
        log.info("rank zygote %s started (torch %s)", ready.get("pid"), ready.get("torch"))
        if self.on_start is not None:
            self.on_start()
        return True

    def _await_ready(self) -> dict[str, Any] | None:
        assert self._control is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        self._control.settimeout(READY_POLL_S)
        try:
            while True:
                try:
                    data = self._control.recv(MESSAGE_BYTES)
                    break
                except TimeoutError:
                    if self._abandoned() or time.monotonic() > deadline:
                        return None
        except OSError:
            return None
        finally:
            self._control.settimeout(None)
        message = json.loads(data) if data else {}
        return message if message.get("op") == "ready" else None

    def _failed(self, why: str) -> bool:
        log.warning("rank zygote unavailable (%s): ranks spawned for %.0f s", why, RETRY_AFTER_S)
        self._failed_at = time.monotonic()
        self._stop()
        return False

    def _stop(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.wait(CLOSE_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
