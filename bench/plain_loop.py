"""The plain side of probe_vs_loop.py: a timed all_reduce loop in two fresh rank processes.

Each rank (`plain_rank`, run as `probe_vs_loop.py --plain-rank=N`) has its own TCPStore and
process group, then per sample a barrier and time.perf_counter around ONE op, and around `batch`
back-to-back ops; it prints its samples and medians as one JSON line. Imports torch only there.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

RANKS = 2
HOST = "127.0.0.1"
FLOAT32_BYTES = 4
# netmon's defaults for its batched timing, used unchanged on both sides.
BATCH, BATCHED_ITERS, WARMUP = 5, 20, 5
RUN_TIMEOUT_S = 120.0
# A plain rank is probe_vs_loop.py run with --plain-rank: its command line is the benchmark's own.
SCRIPT = Path(__file__).resolve().with_name("probe_vs_loop.py")

# ---- the plain reference loop: runs inside each of its two rank processes ----


def plain_rank(
    rank: int, port: int, sizes: Sequence[int], iters: int, batched_iters: int, batch: int
) -> None:
    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=60)
    # torch.distributed re-exports TCPStore from its C extension without declaring it.
    store = dist.TCPStore(  # type: ignore[attr-defined]
        HOST, port, RANKS, is_master=rank == 0, timeout=timeout
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=RANKS, timeout=timeout)
    per_op: dict[str, list[float]] = {}
    batched: dict[str, list[float]] = {}
    for size in sizes:
        tensor = torch.ones(max(1, size // FLOAT32_BYTES), dtype=torch.float32)
        for _ in range(WARMUP):
            dist.all_reduce(tensor)
        times = []
        for _ in range(iters):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        per_op[str(size)] = times
        times = []
        for _ in range(batched_iters):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(batch):
                dist.all_reduce(tensor)
            times.append((time.perf_counter() - start) / batch)
        batched[str(size)] = times
    # Rank 0 hosts the store: nobody leaves before everybody is done with it.
    dist.barrier()
    dist.destroy_process_group()
    report = {
        "rank": rank,
        "median_s": {size: statistics.median(times) for size, times in per_op.items()},
        "batched_median_s": {size: statistics.median(times) for size, times in batched.items()},
        "per_op_s": per_op,
        "batched_s": batched,
    }
    print(json.dumps(report), flush=True)
    # As netmon's worker does: skip interpreter teardown, where torch's atexit hooks can hang.
    os._exit(0)


# ---- the parent: starts the two ranks and reads their reports ----


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _plain_env() -> dict[str, str]:
    # The environment netmon's launcher gives a gloo rank on loopback.
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _kill_and_reap(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def run_plain(sizes: Sequence[int], iters: int, batched_iters: int) -> dict[str, Any]:
    """One run of the plain loop in 2 fresh processes: per-rank samples and the wall time."""
    port = _free_port()  # a race with another process is possible; the rank would then fail
    command = [
        sys.executable,
        str(SCRIPT),
        f"--port={port}",
        f"--sizes={','.join(map(str, sizes))}",
        f"--iters={iters}",
        f"--batched-iters={batched_iters}",
    ]
    procs: list[subprocess.Popen[bytes]] = []
    start = time.monotonic()
    with contextlib.ExitStack() as files:
        # Files, not pipes: a rank blocked on a full pipe could hold its peer in a collective.
        outputs: list[IO[bytes]] = [
            files.enter_context(tempfile.TemporaryFile()) for _ in range(RANKS)
        ]
        try:
            for rank, out in enumerate(outputs):
                procs.append(
                    subprocess.Popen(
                        [*command, f"--plain-rank={rank}"],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=_plain_env(),
                        start_new_session=True,
                    )
                )
            deadline = start + RUN_TIMEOUT_S
            for proc in procs:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            wall = time.monotonic() - start
        finally:
            _kill_and_reap(procs)  # on success a no-op; on a timeout or error, no rank lingers
        reports = []
        for proc, out in zip(procs, outputs, strict=True):
            out.seek(0)
            text = out.read().decode(errors="replace")
            if proc.returncode != 0:
                raise RuntimeError(f"plain rank exited with {proc.returncode}: {text[-1500:]}")
            reports.append(json.loads(text.strip().splitlines()[-1]))
    reports.sort(key=lambda report: int(report["rank"]))
    timed = sum(
        sum(max(values) for values in zip(*(r[key][str(size)] for r in reports), strict=True))
        * (BATCH if key == "batched_s" else 1)
        for key in ("per_op_s", "batched_s")
        for size in sizes
    )
    return {"wall_s": wall, "timed_s": timed, "ranks": reports}


def plain_times(run: dict[str, Any], size: int, key: str = "per_op_s") -> tuple[float, float]:
    """(the slower rank's median, the median over samples of the slower rank) for one size."""
    per_rank = [[float(t) for t in report[key][str(size)]] for report in run["ranks"]]
    slower_median = max(statistics.median(times) for times in per_rank)
    per_sample_max = [max(values) for values in zip(*per_rank, strict=True)]
    return slower_median, statistics.median(per_sample_max)
