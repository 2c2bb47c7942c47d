"""The node group's store agent: torch.distributed's TCPStore, outside the daemon process.

The daemon never imports torch, so it runs this small process beside it. The agent hosts this
member's TCPStore on the member port and runs requests against any member's store: JSON lines in
on stdin ({"id", "op", ...}), JSON lines out on stdout ({"id", "ok", "value" or "error"}). Every
request opens a fresh client with its own timeout, so a member that vanished or stopped answering
costs one request its timeout and nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from netmon.listen import listen_on

_out = threading.Lock()


def _reply(message: dict[str, Any]) -> None:
    line = json.dumps(message, separators=(",", ":"))
    with _out:
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, OSError):
            os._exit(3)  # the daemon is gone


def _client(dist: Any, member: str, timeout: float) -> Any:
    host, _, port = member.rpartition(":")
    return dist.TCPStore(
        host.strip("[]"),
        int(port),
        is_master=False,
        timeout=timedelta(seconds=timeout),
        wait_for_workers=False,
    )


def _handle(dist: Any, request: dict[str, Any]) -> Any:
    op = request["op"]
    timeout = float(request.get("timeout", 2.0))
    store = _client(dist, request["member"], timeout)
    key = request.get("key", "")
    if op == "set":
        store.set(key, str(request["value"]))
        return True
    if op == "delete":
        return bool(store.delete_key(key))
    if op == "check":
        return bool(store.check([key]))
    if op == "get":
        # wait() raises after the timeout when the key never appears.
        store.wait([key], timedelta(seconds=timeout))
        return bytes(store.get(key)).decode()
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True, help="the one address the store listens on")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import importlib

    dist: Any = importlib.import_module("torch.distributed")

    # This member's store: the others read plans and results from it while it leads. It listens
    # on the group's address only; what it holds is sealed by the daemon (netmon.group.auth).
    try:
        sock = listen_on(args.host, args.port)
    except OSError as exc:
        _reply({"id": 0, "ok": False, "error": f"cannot listen on {args.host}:{args.port}: {exc}"})
        os._exit(2)
    server = dist.TCPStore(
        args.host,
        sock.getsockname()[1],
        is_master=True,
        timeout=timedelta(seconds=30),
        wait_for_workers=False,
        master_listen_fd=sock.detach(),
    )
    _reply({"id": 0, "ok": True, "value": {"port": int(server.port), "pid": os.getpid()}})
    parent = os.getppid()
    pool = ThreadPoolExecutor(max_workers=16)

    def run(request: dict[str, Any]) -> None:
        try:
            _reply({"id": request["id"], "ok": True, "value": _handle(dist, request)})
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
        pool.submit(run, request)
    os._exit(0)  # stdin closed: the daemon stopped or died


if __name__ == "__main__":
    main()
