"""The member port's key-value store: netmon's own, small, bounded, and closed to strangers.

torch's TCPStore stored whatever reached it (8 MiB a value, no total, no idle deadline), so anyone
on the node network could fill a member's memory or its file descriptors. This store speaks
length-prefixed JSON frames and takes nothing but a handshake until the peer has proved it holds
the group's secret (an HMAC over a fresh nonce of each side, so a recorded handshake is worth
nothing). Every limit is a constant here, sized from what netmon's own values need (plans,
readiness, results, hellos: JSON of a few hundred bytes; a go of a large group a few KiB):

- a frame before the handshake is at most PRE_AUTH_FRAME bytes, and the handshake must end within
  HANDSHAKE_S; a larger frame or a late one closes the connection;
- a value is at most MAX_VALUE bytes, the store at most MAX_TOTAL, and what one source address
  wrote at most MAX_PER_ADDRESS;
- connections waiting for their handshake are capped per source address and in all: a new one
  evicts the oldest waiting, so a crowd of idle sockets cannot keep a member out;
- an authenticated connection idle for IDLE_S is closed (a get that waits is not idle).

The server runs on one thread with `selectors`; the client is blocking, one per request.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import selectors
import socket
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PROTOCOL = "netmon-store-v1"
PRE_AUTH_FRAME = 512
MAX_VALUE = 256 * 1024
MAX_FRAME = MAX_VALUE + 4096  # a value and its key and op
MAX_TOTAL = 16 * 1024 * 1024
MAX_PER_ADDRESS = 8 * 1024 * 1024
HANDSHAKE_S = 5.0
IDLE_S = 30.0
MAX_WAIT_S = 600.0
WAIT_MARGIN_S = 0.3  # more than the server loop's tick (0.25 s)
PENDING_PER_ADDRESS = 16  # connections of one address waiting for their handshake
PENDING_TOTAL = 256
AUTHENTICATED_TOTAL = 128  # a member's agent opens one per request, 16 at a time
MAX_OUTBOX = 4 * MAX_FRAME  # answers not yet read by their client
_LENGTH = struct.Struct(">I")
_CHUNK = 64 * 1024

# Why a connection was closed or a request refused: the counter's reason label (bounded).
REASONS = (
    "bad_handshake",  # no handshake, not one, or a MAC that is not the group's secret's
    "handshake_timeout",
    "oversize",  # a frame larger than its limit
    "bad_frame",  # not a JSON object
    "evicted",  # the oldest connection still waiting for its handshake, to make room
    "busy",  # every authenticated slot taken
    "idle",
    "value_too_large",
    "store_full",
    "address_full",
)


class StoreError(Exception):
    """A request the store refused, or a store that did not answer in time."""


def _mac(secret: bytes, role: str, first: bytes, second: bytes) -> str:
    message = b"\0".join((PROTOCOL.encode(), role.encode(), first, second))
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def frame(body: dict[str, Any]) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    return _LENGTH.pack(len(payload)) + payload


def split_frames(buffer: bytearray, limit: int) -> list[dict[str, Any]] | None:
    """The complete frames at the start of `buffer` (removed from it); None when one is larger
    than `limit` or not a JSON object: the peer is not speaking this protocol."""
    frames = []
    while len(buffer) >= _LENGTH.size:
        (length,) = _LENGTH.unpack_from(buffer)
        if length > limit:
            return None
        if len(buffer) < _LENGTH.size + length:
            break
        payload = bytes(buffer[_LENGTH.size : _LENGTH.size + length])
        del buffer[: _LENGTH.size + length]
        try:
            body = json.loads(payload)
        except ValueError:
            return None
        if not isinstance(body, dict):
            return None
        frames.append(body)
    return frames


@dataclass
class _Conn:
    sock: socket.socket
    address: str
    opened: float
    nonce: bytes
    authenticated: bool = False
    last: float = 0.0
    inbox: bytearray = field(default_factory=bytearray)
    outbox: bytearray = field(default_factory=bytearray)
    waiting: tuple[str, float] | None = None  # a get's key and deadline


@dataclass
class _Value:
    text: str
    writer: str

    @property
    def size(self) -> int:
        return len(self.text.encode())


class StoreServer:
    """The member port's store, on a listening socket; `serve_forever` on its own thread."""

    def __init__(
        self,
        listener: socket.socket,
        secret: bytes,
        on_refused: Callable[[str], None] = lambda reason: None,
        max_connections: int = PENDING_TOTAL + AUTHENTICATED_TOTAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.listener = listener
        self.secret = secret
        self.on_refused = on_refused
        self.clock = clock
        self.pending_total = min(PENDING_TOTAL, max(8, max_connections - AUTHENTICATED_TOTAL))
        self.authenticated_total = min(AUTHENTICATED_TOTAL, max(8, max_connections // 2))
        self.values: dict[str, _Value] = {}
        self.bytes_of: Counter[str] = Counter()
        self.pending: deque[_Conn] = deque()  # oldest first
        self.conns: dict[int, _Conn] = {}
        self.waiters: dict[str, list[_Conn]] = {}
        self._selector = selectors.DefaultSelector()
        self._stopping = threading.Event()
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, None)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_of.values())

    def stop(self) -> None:
        self._stopping.set()

    def serve_forever(self) -> None:
        while not self._stopping.is_set():
            for key, mask in self._selector.select(timeout=0.25):
                if key.data is None:
                    self._accept()
                    continue
                conn: _Conn = key.data
                if conn.sock.fileno() < 0:
                    continue
                try:
                    if mask & selectors.EVENT_READ:
                        self._receive(conn)
                    if mask & selectors.EVENT_WRITE and conn.sock.fileno() >= 0:
                        self._flush(conn)
                except Exception:  # one peer's nonsense never stops the store for the rest
                    if conn.sock.fileno() >= 0:
                        self._close(conn, "bad_frame")
            self._expire(self.clock())

    # ---- connections ----

    def _accept(self) -> None:
        for _ in range(64):  # a burst at a time, so established connections get their turn
            try:
                sock, peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors: the oldest stranger makes room
                self._evict_oldest(None)
                return
            sock.setblocking(False)
            address = str(peer[0])
            if sum(1 for c in self.pending if c.address == address) >= PENDING_PER_ADDRESS:
                self._evict_oldest(address)
            elif len(self.pending) >= self.pending_total:
                self._evict_oldest(None)
            now = self.clock()
            conn = _Conn(sock, address, now, os.urandom(16), last=now)
            self.conns[sock.fileno()] = conn
            self.pending.append(conn)
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._send(conn, {"v": PROTOCOL, "nonce": conn.nonce.hex()})

    def _evict_oldest(self, address: str | None) -> None:
        for conn in self.pending:
            if address is None or conn.address == address:
                self._close(conn, "evicted")
                return

    def _close(self, conn: _Conn, reason: str | None = None) -> None:
        if reason is not None:
            self.on_refused(reason)
        if conn in self.pending:
            self.pending.remove(conn)
        if conn.waiting is not None:
            waiters = self.waiters.get(conn.waiting[0], [])
            if conn in waiters:
                waiters.remove(conn)
            conn.waiting = None
        self.conns.pop(conn.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        conn.sock.close()

    def _receive(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        conn.inbox += data
        conn.last = self.clock()
        limit = MAX_FRAME if conn.authenticated else PRE_AUTH_FRAME
        if len(conn.inbox) >= _LENGTH.size and _LENGTH.unpack_from(conn.inbox)[0] > limit:
            self._close(conn, "oversize")  # before another byte of it is read
            return
        frames = split_frames(conn.inbox, limit)
        if frames is None:
            self._close(conn, "bad_frame")
            return
        for body in frames:
            if conn.sock.fileno() < 0:
                return
            if conn.authenticated:
                self._request(conn, body)
            else:
                self._handshake(conn, body)
        if conn.sock.fileno() >= 0 and len(conn.outbox) > MAX_OUTBOX:
            self._close(conn, "oversize")  # asks faster than it reads its answers

    def _handshake(self, conn: _Conn, body: dict[str, Any]) -> None:
        theirs = body.get("nonce")
        mac = body.get("mac")
        try:
            nonce = bytes.fromhex(str(theirs))
        except ValueError:
            nonce = b""
        expected = _mac(self.secret, "client", conn.nonce, nonce)
        if len(nonce) != 16 or not isinstance(mac, str) or not hmac.compare_digest(mac, expected):
            self._close(conn, "bad_handshake")
            return
        if sum(1 for c in self.conns.values() if c.authenticated) >= self.authenticated_total:
            self._close(conn, "busy")
            return
        self.pending.remove(conn)
        conn.authenticated = True
        self._send(conn, {"ok": True, "mac": _mac(self.secret, "server", nonce, conn.nonce)})

    def _expire(self, now: float) -> None:
        while self.pending and now - self.pending[0].opened > HANDSHAKE_S:
            self._close(self.pending[0], "handshake_timeout")
        for conn in [c for c in self.conns.values() if c.authenticated]:
            if conn.waiting is not None:
                if now >= conn.waiting[1]:
                    key = conn.waiting[0]
                    self.waiters[key].remove(conn)
                    conn.waiting = None
                    conn.last = now
                    self._send(conn, {"ok": False, "error": f"{key}: not set in time"})
            elif now - conn.last > IDLE_S:
                self._close(conn, "idle")

    def _send(self, conn: _Conn, body: dict[str, Any]) -> None:
        conn.outbox += frame(body)
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbox)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return
        del conn.outbox[:sent]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbox else 0)
        self._selector.modify(conn.sock, events, conn)

    # ---- requests ----

    def _request(self, conn: _Conn, body: dict[str, Any]) -> None:
        op, key = body.get("op"), str(body.get("key", ""))
        if op == "set":
            self._send(conn, self._set(conn.address, key, str(body.get("value", ""))))
        elif op == "get":
            found = self.values.get(key)
            wait = min(float(body.get("wait", 0) or 0), MAX_WAIT_S)
            if found is not None:
                self._send(conn, {"ok": True, "value": found.text})
            elif wait <= 0:
                self._send(conn, {"ok": False, "error": f"{key}: not set"})
            elif conn.waiting is None:  # one wait per connection, as the client asks
                conn.waiting = (key, self.clock() + wait)
                self.waiters.setdefault(key, []).append(conn)
        elif op == "check":
            self._send(conn, {"ok": True, "value": key in self.values})
        elif op == "delete":
            gone = self.values.pop(key, None)
            if gone is not None:
                self.bytes_of[gone.writer] -= gone.size
            self._send(conn, {"ok": True, "value": gone is not None})
        elif op == "count":
            self._send(conn, {"ok": True, "value": len(self.values)})
        else:
            self._send(conn, {"ok": False, "error": f"unknown op {op!r}"})

    def _set(self, writer: str, key: str, text: str) -> dict[str, Any]:
        new = _Value(text, writer)
        if new.size + len(key) > MAX_VALUE:
            self.on_refused("value_too_large")
            return {"ok": False, "error": f"{key}: value larger than {MAX_VALUE} bytes"}
        old = self.values.get(key)
        freed = old.size if old is not None else 0
        if self.total_bytes - freed + new.size > MAX_TOTAL:
            self.on_refused("store_full")
            return {"ok": False, "error": f"the store holds its limit of {MAX_TOTAL} bytes"}
        mine = self.bytes_of[writer] - (freed if old is not None and old.writer == writer else 0)
        if mine + new.size > MAX_PER_ADDRESS:
            self.on_refused("address_full")
            return {"ok": False, "error": f"{writer} wrote its limit of {MAX_PER_ADDRESS} bytes"}
        if old is not None:
            self.bytes_of[old.writer] -= old.size
        self.values[key] = new
        self.bytes_of[writer] += new.size
        for waiter in self.waiters.pop(key, []):
            waiter.waiting = None
            waiter.last = self.clock()
            self._send(waiter, {"ok": True, "value": text})
        return {"ok": True, "value": True}


class StoreClient:
    """One authenticated connection to a member's store (blocking, with a deadline)."""

    def __init__(self, host: str, port: int, secret: bytes, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.sock = socket.create_connection((host, port), timeout=max(0.05, timeout))
        self.buffer = bytearray()
        try:
            hello = self._read(PRE_AUTH_FRAME)
            theirs = bytes.fromhex(str(hello.get("nonce", "")))
            mine = os.urandom(16)
            self._write({"nonce": mine.hex(), "mac": _mac(secret, "client", theirs, mine)})
            answer = self._read(PRE_AUTH_FRAME)
            expected = _mac(secret, "server", mine, theirs)
            if not hmac.compare_digest(str(answer.get("mac", "")), expected):
                raise StoreError(f"{host}:{port} does not hold the group's secret")
        except (StoreError, OSError, ValueError):
            self.sock.close()
            raise

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, body: dict[str, Any]) -> None:
        self.sock.settimeout(max(0.05, self.deadline - time.monotonic()))
        self.sock.sendall(frame(body))

    def _read(self, limit: int) -> dict[str, Any]:
        while True:
            frames = split_frames(self.buffer, limit)
            if frames is None:
                raise StoreError("the store sent something that is not a frame")
            if frames:
                return frames[0]
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise StoreError("no answer in time")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(_CHUNK)
            except TimeoutError:
                raise StoreError("no answer in time") from None
            if not data:
                raise StoreError("the store closed the connection (refused, or too busy)")
            self.buffer += data

    def request(self, op: str, key: str = "", **fields: Any) -> Any:
        self._write({"op": op, "key": key, **fields})
        answer = self._read(MAX_FRAME)
        if not answer.get("ok"):
            raise StoreError(str(answer.get("error", "refused")))
        return answer.get("value")


def run(
    host: str, port: int, secret: bytes, op: str, key: str, timeout: float, value: str = ""
) -> Any:
    """One request to the store at host:port, as the agent runs them for the daemon."""
    with StoreClient(host, port, secret, timeout) as client:
        if op == "set":
            return client.request("set", key, value=value)
        if op == "get":
            # The store answers "not set" a little before this side's deadline, so a key that
            # never came is told apart from a store that stopped answering.
            left = client.deadline - time.monotonic() - WAIT_MARGIN_S
            return client.request("get", key, wait=max(0.0, left))
        if op in ("check", "delete", "count"):
            return client.request(op, key)
    raise ValueError(f"unknown op {op!r}")
