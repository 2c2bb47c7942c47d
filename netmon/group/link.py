"""The daemon's handle on its store agent (netmon.group.agent): requests with deadlines.

Every call returns or raises GroupError within its timeout plus a small margin, whatever the
agent or the remote member does; a dead agent is restarted on the next call.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import netmon
from netmon.group.auth import AuthError, Sealer, check_fresh
from netmon.group.signing import MemberSigner, MemberVerifier, SignatureError

log = logging.getLogger(__name__)

MARGIN_S = 2.0
START_TIMEOUT_S = 60.0


class GroupError(Exception):
    """A store request that failed or timed out: the member is absent or the key never came."""


class GroupLink:
    def __init__(
        self,
        port: int,
        host: str,
        me: str | None = None,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        *,
        secret: bytes,
        on_refused: Callable[[str, int], None] = lambda reason, count: None,
    ) -> None:
        self.port = port
        self.host = host  # the one address this member's store listens on
        # Requests to this member go to the address its store really listens on, which is not
        # always what its member name resolves to here (127.0.1.1 in a Debian /etc/hosts).
        self.me = me
        self._own_address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.python = python
        self.env = env
        # The group's secret: the agent's store admits only connections that prove they hold
        # it, and the agent's own requests prove it to other members (netmon.group.store).
        self.secret = secret
        self.on_refused = on_refused  # the store's refusals, by reason (netmon.group.store)
        self._lock = threading.Lock()  # guards _pending, _next_id and writes to the agent
        self._start_lock = threading.Lock()  # one (re)start at a time; never held by the reader
        self._pending: dict[int, Future[Any]] = {}
        self._next_id = 1
        self._proc: subprocess.Popen[bytes] | None = None

    # ---- agent lifecycle ----

    def start(self) -> None:
        with self._start_lock:
            self._ensure_started()

    def _ensure_started(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        package_root = str(Path(netmon.__file__).resolve().parent.parent)
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        ready: Future[Any] = Future()
        with self._lock:
            self._pending = {0: ready}
        self._proc = subprocess.Popen(
            [
                self.python,
                "-m",
                "netmon.group.agent",
                "--host",
                self.host,
                "--port",
                str(self.port),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        assert self._proc.stdin is not None
        try:  # on the pipe, never the command line or the environment, where others read
            self._proc.stdin.write(self._keys_line(0))
            self._proc.stdin.flush()
        except OSError:
            pass  # the agent died at once: the reader below reports it
        threading.Thread(
            target=self._read, args=(self._proc,), name="group-agent", daemon=True
        ).start()
        try:
            info = ready.result(timeout=START_TIMEOUT_S)
        except Exception as exc:
            self.stop()
            raise GroupError(
                f"the store agent did not start on {self._own_address}: {exc or 'no answer'}"
            ) from None
        log.info("group store agent pid %s listening on %s", info["pid"], self._own_address)

    def _keys_line(self, request_id: int) -> bytes:
        return (
            json.dumps({"id": request_id, "op": "keys", "secret": self.secret.hex()}) + "\n"
        ).encode()

    def rekey(self, secret: bytes) -> None:
        """A new group secret (a rotated secret file): the running agent takes it at once."""
        self.secret = secret
        if self._proc is not None and self._proc.poll() is None:
            # An agent that died meanwhile is started again with the new secret.
            with contextlib.suppress(GroupError):
                self.call("keys", self.me or self._own_address, secret=secret.hex())

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message.get("refused"), dict):
                for reason, count in message["refused"].items():
                    self.on_refused(str(reason), int(count))
                continue
            with self._lock:
                future = self._pending.pop(int(message.get("id", -1)), None)
            if future is None:
                continue
            if message.get("ok"):
                future.set_result(message.get("value"))
            else:
                future.set_exception(GroupError(str(message.get("error"))))
        # EOF: the agent is gone; every waiter learns it now rather than at its deadline.
        with self._lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(GroupError("the store agent exited"))

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    # ---- requests ----

    def call(self, op: str, member: str, timeout: float = 2.0, **fields: Any) -> Any:
        address = self._own_address if member == self.me else member
        with self._start_lock:
            self._ensure_started()
        with self._lock:
            if self._proc is None or self._proc.stdin is None:
                raise GroupError("the store agent is not running")
            request_id = self._next_id
            self._next_id += 1
            future: Future[Any] = Future()
            self._pending[request_id] = future
            line = (
                json.dumps(
                    {"id": request_id, "op": op, "member": address, "timeout": timeout, **fields}
                )
                + "\n"
            )
            try:
                self._proc.stdin.write(line.encode())
                self._proc.stdin.flush()
            except OSError:
                self._pending.pop(request_id, None)
                raise GroupError("the store agent is not running") from None
        try:
            return future.result(timeout=timeout + MARGIN_S)
        except TimeoutError:
            with self._lock:
                self._pending.pop(request_id, None)
            raise GroupError(f"{op} on {member}: no answer in {timeout + MARGIN_S:.0f} s") from None

    def set(self, member: str, key: str, value: str) -> None:
        self.call("set", member, key=key, value=value)

    def get(self, member: str, key: str, timeout: float) -> str:
        return str(self.call("get", member, timeout, key=key))

    def check(self, member: str, key: str, timeout: float = 1.0) -> bool:
        return bool(self.call("check", member, timeout, key=key))

    def delete(self, member: str, key: str) -> bool:
        return bool(self.call("delete", member, key=key))


class RejectedMessage(GroupError):
    """A value that is not sealed with the group's secret, or not for this key: treated as
    missing by the caller, and reported."""


class SealedLink:
    """Store requests whose values are sealed with the group's secret (netmon.group.auth).

    A value that fails to open raises RejectedMessage, a GroupError, so every caller treats a
    forged or replayed message exactly like a missing one; `on_reject` hears which member's
    message it claimed to be and why it was refused (and, for a result, a reason label).

    With per-member keys (`signer`, `verifier`), results are signed by the member that measured
    them instead (`put_result`, `take_result`): the shared secret lets every member seal in every
    member's name, a member's private key only in its own.
    """

    def __init__(
        self,
        link: GroupLink,
        sealer: Sealer,
        on_reject: Callable[..., None],
        clock: Callable[[], float] = time.time,
        signer: MemberSigner | None = None,
        verifier: MemberVerifier | None = None,
    ) -> None:
        self.link = link
        self.sealer = sealer
        self.on_reject = on_reject
        self.clock = clock
        self.signer = signer
        self.verifier = verifier

    @property
    def address(self) -> str:
        """The address this member's store is bound to, where its ranks can be reached too."""
        return self.link.host

    def put(self, member: str, key: str, body: dict[str, Any]) -> None:
        self.link.set(member, key, self.sealer.seal(key, body))

    def take(
        self,
        member: str,
        key: str,
        timeout: float,
        sender: str,
        fresh: bool = False,
        expect: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The opened value of `key` in `member`'s store, written by `sender`."""
        value = self.link.get(member, key, timeout)
        try:
            body = self.sealer.open(key, value)
            if fresh:
                check_fresh(key, body, self.clock())
            for field, wanted in (expect or {}).items():
                if body.get(field) != wanted:
                    raise AuthError(f"{key}: {field} is {body.get(field)!r}, not {wanted!r}")
        except AuthError as exc:
            self.on_reject(sender, str(exc))
            raise RejectedMessage(str(exc)) from None
        return body

    def put_result(self, member: str, key: str, body: dict[str, Any]) -> None:
        """A result this member measured: signed with its own key where it has one."""
        signer = self.signer
        value = signer.seal(key, body) if signer is not None else self.sealer.seal(key, body)
        self.link.set(member, key, value)

    def take_result(self, member: str, key: str, timeout: float, sender: str) -> dict[str, Any]:
        """A result `sender` measured: with per-member keys, only one `sender`'s key signed."""
        verifier = self.verifier
        if verifier is None:
            return self.take(member, key, timeout, sender)
        value = self.link.get(member, key, timeout)
        try:
            return verifier.open(sender, key, value)
        except SignatureError as exc:
            self.on_reject(sender, str(exc), exc.reason)
            raise RejectedMessage(str(exc)) from None

    def check(self, member: str, key: str, timeout: float = 1.0) -> bool:
        return self.link.check(member, key, timeout)

    def delete(self, member: str, key: str) -> bool:
        return self.link.delete(member, key)
