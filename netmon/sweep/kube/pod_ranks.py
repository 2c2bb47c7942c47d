"""What a sweep pair's pod runs on Kubernetes (`python -m netmon.sweep.kube.pod_ranks`): one rank
per rail (netmon.sweep.ranks.rank), as srun starts them on Slurm, then one line on how they ended.

The pod's index in its Indexed Job (JOB_COMPLETION_INDEX, set by the Job controller) is the
ranks' rank, and pod 0's DNS name under the JobSet's headless service is where they meet. The
pod exits 0 whatever its ranks did: a failed pod fails its Job, and a JobSet with a failed Job
deletes the Jobs of every other pair of the round. The sweep reads how the ranks ended from the
log instead: `NETMON-SWEEP-POD {"node", "index", "exits", "detail"}`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any

POD_PREFIX = "NETMON-SWEEP-POD "
GRACE_S = 5.0  # past the deadline, for the ranks' own watchdogs to end them
RESOLVE_EVERY_S = 0.5


def wait_resolvable(
    name: str, deadline: float, resolve: Callable[[str], object] | None = None
) -> bool:
    """Whether `name` resolves by `deadline`. Pod 0's DNS record appears only once that pod
    has an address, and the ranks' store gives up on a name it cannot resolve."""
    lookup = resolve or (lambda host: socket.getaddrinfo(host, None))
    while True:
        try:
            lookup(name)
            return True
        except OSError:
            if time.time() + RESOLVE_EVERY_S >= deadline:
                return False
            time.sleep(RESOLVE_EVERY_S)


def _rank_env(environ: Mapping[str, str], rail: int) -> dict[str, str]:
    return {
        **environ,
        "NETMON_SWEEP_RAIL": str(rail),
        "NETMON_SWEEP_RANK": environ.get("JOB_COMPLETION_INDEX", "0"),
    }


def run_ranks(environ: Mapping[str, str], rails: int, deadline: float) -> list[int]:
    """Every rail's rank to its end, or killed past the deadline; their exit codes."""
    children: list[subprocess.Popen[bytes]] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)  # the pod is being deleted: the finally below reaps

    signal.signal(signal.SIGTERM, stop)
    try:
        for rail in range(rails):
            argv = [sys.executable, "-m", "netmon.sweep.ranks.rank"]
            children.append(subprocess.Popen(argv, env=_rank_env(environ, rail)))
        codes = []
        for child in children:
            try:
                codes.append(child.wait(timeout=max(0.0, deadline + GRACE_S - time.time())))
            except subprocess.TimeoutExpired:
                child.kill()
                codes.append(child.wait())
        return codes
    finally:
        for child in children:
            if child.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
                child.wait()


def end_line(node: str, index: int, exits: Sequence[int], detail: str = "") -> str:
    record: dict[str, Any] = {"node": node, "index": index, "exits": list(exits)}
    if detail:
        record["detail"] = detail
    return POD_PREFIX + json.dumps(record)


def main() -> int:
    environ = dict(os.environ)
    deadline = float(environ["NETMON_SWEEP_DEADLINE"])
    node = environ.get("NETMON_SWEEP_NODE") or os.uname().nodename
    index = int(environ.get("JOB_COMPLETION_INDEX", "0"))
    master = environ["NETMON_SWEEP_MASTER"]
    if not wait_resolvable(master, deadline):
        print(end_line(node, index, [], f"cannot resolve the rendezvous {master}"), flush=True)
        return 0
    exits = run_ranks(environ, int(environ.get("NETMON_SWEEP_RAILS", "1")), deadline)
    print(end_line(node, index, exits), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
