"""What a sweep pair's job runs on each of its nodes (`srun python -m netmon.sweep.ranks.rank`).

One task per rail per node: the task of local id k on each node joins rail k's communicator,
one rank per node, and times an all_reduce across the nodes (busbw as nccl-tests defines it).
With GPUs it takes GPU k (PCI order, as NVML counts) over NCCL, and refuses a GPU some process
already holds ("busy"); without, gloo on the CPU. The interface that carries the traffic is the
node's own: its netmon config's `env` (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME) is applied.

The sweep passes, in the environment: NETMON_SWEEP_NODES (name=address of each node, rank
order), NETMON_SWEEP_PORT (rail k's store listens on port + k on the first node), and the
measurement's size, warmup, iters and deadline (NETMON_SWEEP_DEADLINE, absolute; and
NETMON_SWEEP_RUN_S, seconds from the task's own start, where the scheduler cannot know when the
job will start). Every task prints `NETMON-SWEEP-STARTED {json}` as it starts and
`NETMON-SWEEP-JOINED {json}` once its rail's ranks have met: the sweep tells a pair the
scheduler has not started from one whose ranks cannot meet, and neither holds its round. The
task on the first node of each rail prints one line, `NETMON-SWEEP {json}`, naming the node it
ran on. A watchdog ends the task at its deadline, so nothing outlives the pair, whatever the
scheduler manages to do.

On Kubernetes a pod per node starts the rails' tasks (netmon.sweep.kube.pod_ranks) and the scheduler
picks which node is which pod: the node is NETMON_SWEEP_NODE, the rail NETMON_SWEEP_RAIL, the
rank the pod's index (NETMON_SWEEP_RANK) and the rendezvous pod 0's DNS name
(NETMON_SWEEP_MASTER).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from netmon.sweep.ranks.gpu import Binding

STARTED_AT = time.time()  # before torch is imported: the scheduler's overhead ends here
PREFIX = "NETMON-SWEEP "
STARTED = "NETMON-SWEEP-STARTED "
JOINED = "NETMON-SWEEP-JOINED "
EXIT_BUSY = 75  # the GPU was in use: the pair is skipped as busy, not failed


def _nodes(text: str) -> list[tuple[str, str]]:
    pairs = [item.split("=", 1) for item in text.split(",") if item]
    return [(name, address) for name, address in pairs]


def _node_env(path: Path) -> dict[str, str]:
    """The node's netmon config `env` (the traffic's interface), where the file exists."""
    if not path.is_file():
        return {}
    from netmon.config import load_document
    from netmon.errors import UsageError

    try:
        env = load_document(path).get("env") or {}
    except UsageError as exc:  # unreadable by the sweep's user, or not YAML: say so, go on
        print(f"netmon sweep rank: node config not used: {exc}", file=sys.stderr)
        return {}
    return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}


def _watchdog(deadline: float) -> None:
    def expire() -> None:
        time.sleep(max(0.0, deadline - time.time()))
        print(f"netmon sweep rank: deadline reached on {os.uname().nodename}", file=sys.stderr)
        os._exit(124)

    threading.Thread(target=expire, name="deadline", daemon=True).start()


def deadline_of(environ: Mapping[str, str], started_at: float) -> float:
    """The task's own deadline: the absolute one, or its run budget from its start if sooner."""
    deadline = float(environ["NETMON_SWEEP_DEADLINE"])
    run_s = environ.get("NETMON_SWEEP_RUN_S")
    return min(deadline, started_at + float(run_s)) if run_s else deadline


def _mark(prefix: str, node: str, rail: int) -> None:
    print(prefix + json.dumps({"node": node, "rail": rail, "at": time.time()}), flush=True)


def _gpu_busy(index: int) -> bool:
    from netmon.gpu.nvml import NvmlSource

    with NvmlSource() as source:
        readings = {r.index: r for r in source.read()}
    reading = readings.get(index)
    return reading is not None and bool(reading.compute_pids)


def _nvml_index(rail: int, environ: Mapping[str, str]) -> int:
    visible = [v for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if rail < len(visible) and visible[rail].strip().isdigit():
        return int(visible[rail])
    return rail


def _rendezvous(
    environ: Mapping[str, str], nodes: list[tuple[str, str]], me: str
) -> tuple[int, str]:
    """(this task's rank, rank 0's address)."""
    if environ.get("NETMON_SWEEP_MASTER"):
        return int(environ.get("NETMON_SWEEP_RANK", "0")), environ["NETMON_SWEEP_MASTER"]
    return [name for name, _ in nodes].index(me), nodes[0][1]


def measure(
    dist: Any, torch: Any, device: Any, size: int, warmup: int, iters: int
) -> tuple[float, list[float]]:
    """(busbw, per-sample seconds) of an all_reduce of `size` bytes across the group, timed by
    the probe engine's loop (netmon.probe.timing): the ranks meet, then each sample is one
    operation timed (CUDA events on a GPU). Zeros: a sum in place of anything else grows by the
    world size on every operation."""
    from netmon.bandwidth import busbw
    from netmon.probe import timing

    tensor = torch.zeros(size // 4, dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    times = timing.samples(torch, dist, device, lambda: dist.all_reduce(tensor), iters, 1)
    world = dist.get_world_size()
    ordered = sorted(times)
    return busbw("all_reduce", world, size, ordered[len(ordered) // 2]), times


def main() -> int:
    environ = os.environ
    deadline = deadline_of(environ, STARTED_AT)
    _watchdog(deadline)
    nodes = _nodes(environ["NETMON_SWEEP_NODES"])
    me = environ.get("NETMON_SWEEP_NODE") or environ.get("SLURMD_NODENAME") or os.uname().nodename
    names = [name for name, _ in nodes]
    if me not in names:
        print(f"netmon sweep rank: node {me} is not in this pair ({names})", file=sys.stderr)
        return 2
    rail = int(environ.get("NETMON_SWEEP_RAIL") or environ.get("SLURM_LOCALID", "0"))
    _mark(STARTED, me, rail)
    os.environ.update(_node_env(Path(environ.get("NETMON_SWEEP_NODE_CONFIG", "/nonexistent"))))
    gpus = environ.get("NETMON_SWEEP_BACKEND") == "nccl"
    if gpus and _gpu_busy(_nvml_index(rail, environ)):
        print(f"netmon sweep rank: GPU {rail} on {me} is in use", file=sys.stderr)
        return EXIT_BUSY
    binding: Binding | None = None
    log_file = Path(tempfile.gettempdir()) / f"netmon-sweep-nccl-{os.getpid()}.log"
    if gpus:
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # GPU k as NVML counts it
        from netmon.sweep.ranks import gpu as gpu_rank

        binding, added = gpu_rank.prepare(environ, _nvml_index(rail, environ), str(log_file))
        os.environ.update(added)
    import datetime

    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rail) if gpus else torch.device("cpu")
    if gpus:
        torch.cuda.set_device(device)
    rank, master = _rendezvous(environ, nodes, me)
    if ":" in master:
        master = f"[{master}]"  # an IPv6 NodeAddr
    port = int(environ["NETMON_SWEEP_PORT"]) + rail
    dist.init_process_group(
        "nccl" if gpus else "gloo",
        init_method=f"tcp://{master}:{port}",
        world_size=len(nodes),
        rank=rank,
        timeout=datetime.timedelta(seconds=max(1.0, deadline - time.time())),
    )
    try:
        dist.barrier()  # NCCL makes its communicator here: the ranks met, not just the store
        _mark(JOINED, me, rail)
        value, times = measure(
            dist,
            torch,
            device,
            int(environ["NETMON_SWEEP_SIZE"]),
            int(environ["NETMON_SWEEP_WARMUP"]),
            int(environ["NETMON_SWEEP_ITERS"]),
        )
    finally:
        dist.destroy_process_group()
    if rank == 0:
        line = {"rail": rail, "busbw": value, "times": times, "started_at": STARTED_AT, "node": me}
        if binding is not None:
            line |= _transport(binding, log_file)
        print(PREFIX + json.dumps(line), flush=True)
    log_file.unlink(missing_ok=True)
    return 0


def _transport(binding: Binding, log_file: Path) -> dict[str, Any]:
    """What the rank's NCCL log says of the network it used, and where the rank ran."""
    from netmon.sweep.ranks import gpu as gpu_rank

    try:
        log = log_file.read_text(errors="replace")
    except OSError:
        log = ""  # the operator's own NCCL_DEBUG_FILE, or none: nothing is known
    faults = gpu_rank.transport_faults(log, binding.hca)
    return {"transport_faults": faults, "hca": binding.hca, "cpus": len(binding.cpus)}


if __name__ == "__main__":
    sys.exit(main())
