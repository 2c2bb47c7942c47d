"""The node group's store agent: the member port's store (netmon.group.store), outside the daemon.

The agent hosts this member's store on the member port and runs requests against any member's
store: JSON lines in on stdin ({"id", "op", ...}), JSON lines out on stdout ({"id", "ok", "value"
or "error"}). Its first line in is the group's secret ({"op": "keys", "secret": hex}), which it
takes before it listens; a later "keys" line replaces it (a SIGHUP that found the file changed).
Every request opens a fresh connection with its own deadline, so a member that vanished or
stopped answering costs one request its timeout and nothing else.

Refusals of the store (a stranger's handshake, a value too large) are reported to the daemon as
{"refused": {reason: count}} lines at most once a second, so that a flood costs no more output.
It needs no torch: only the ranks import it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from netmon.group.store import StoreServer, run
from netmon.listen import listen_on

REPORT_EVERY_S = 1.0
# Descriptors kept for the agent's own requests, pipes and imports, beyond the store's.
SPARE_FDS = 64

_out = threading.Lock()


def _reply(message: dict[str, Any]) -> None:
    line = json.dumps(message, separators=(",", ":"))
    with _out:
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, OSError):
            os._exit(3)  # the daemon is gone


def raise_fd_limit() -> int:
    """The soft RLIMIT_NOFILE raised to the hard one (a crowd of sockets is refused by the
    store's own caps, not by running out of descriptors); the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return soft


def _secret(line: str) -> bytes:
    request = json.loads(line)
    if request.get("op") != "keys":
        raise ValueError("the first line must carry the group's secret")
    return bytes.fromhex(str(request["secret"]))


class _Refusals:
    """Counts of the store's refusals, reported in batches."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def add(self, reason: str) -> None:
        with self.lock:
            self.counts[reason] += 1

    def report_forever(self) -> None:
        while True:
            time.sleep(REPORT_EVERY_S)
            with self.lock:
                counts, self.counts = self.counts, Counter()
            if counts:
                _reply({"id": None, "refused": dict(counts)})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True, help="the one address the store listens on")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    try:
        secret = _secret(sys.stdin.readline())
    except (ValueError, KeyError):
        _reply({"id": 0, "ok": False, "error": "no group secret on the first line"})
        os._exit(2)
    limit = raise_fd_limit()
    try:
        sock = listen_on(args.host, args.port)
    except OSError as exc:
        _reply({"id": 0, "ok": False, "error": f"cannot listen on {args.host}:{args.port}: {exc}"})
        os._exit(2)
    refusals = _Refusals()
    server = StoreServer(sock, secret, refusals.add, max_connections=limit - SPARE_FDS)
    threading.Thread(target=server.serve_forever, name="store", daemon=True).start()
    threading.Thread(target=refusals.report_forever, name="refusals", daemon=True).start()
    _reply({"id": 0, "ok": True, "value": {"port": sock.getsockname()[1], "pid": os.getpid()}})
    parent = os.getppid()
    pool = ThreadPoolExecutor(max_workers=16)

    def handle(request: dict[str, Any]) -> None:
        try:
            host, _, port = str(request["member"]).rpartition(":")
            value = run(
                host.strip("[]"),
                int(port),
                server.secret,
                str(request["op"]),
                str(request.get("key", "")),
                float(request.get("timeout", 2.0)),
                str(request.get("value", "")),
            )
            _reply({"id": request["id"], "ok": True, "value": value})
        except Exception as exc:  # every failure is an answer; the daemon decides
            text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            _reply({"id": request["id"], "ok": False, "error": f"{type(exc).__name__}: {text}"})

    for line in sys.stdin:
        if os.getppid() != parent:
            break
        try:
            request = json.loads(line)
        except ValueError:
            continue
        if request.get("op") == "keys":
            server.secret = bytes.fromhex(str(request["secret"]))  # new handshakes use it
            _reply({"id": request.get("id"), "ok": True, "value": True})
            continue
        pool.submit(handle, request)
    os._exit(0)  # stdin closed: the daemon stopped or died


if __name__ == "__main__":
    main()
