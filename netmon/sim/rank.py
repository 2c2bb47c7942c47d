"""What a rank does on a simulated node at the point where it would create its CUDA context: find
the GPU CUDA would open from its environment, and register on it, so that NVML lists the rank
among that GPU's processes until it exits. The collectives then run on gloo over loopback; while
they do (`kernels`), NVML reads the GPU busy, as a GPU's utilization counts its kernels."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from netmon.sim import active

# The most a simulated rank carries per op: a GPU probe's 1 GiB on 8 CPU ranks would take minutes
# and gigabytes. The result is labelled with the size asked for and reports the bytes carried.
MAX_BYTES = 4 << 20


def open_gpu(env: Mapping[str, str]) -> str | None:
    """Register this process on the GPU CUDA would open with `env`; its UUID. None off a
    simulated node. RuntimeError, as CUDA would raise it, when no GPU is visible."""
    node = active(env)
    if node is None:
        return None
    gpu = node.cuda_device(env)
    node.register(gpu.uuid, os.getpid(), env)
    return gpu.uuid


def nccl_version() -> str | None:
    node = active()
    return None if node is None else node.current().nccl


def carried(size: int) -> int:
    """The bytes a simulated rank moves for an op of `size`."""
    return min(size, MAX_BYTES)


def kernels(running: bool) -> None:
    """This rank's collectives start (`running`) or have ended: NVML's utilization follows them,
    not the process, which keeps its context until it exits. Nothing off a simulated node."""
    node = active()
    if node is not None:
        node.kernels(os.getpid(), running)


def capture(run: Callable[[int], None], ops: int) -> Callable[[], None]:
    """A simulated node's CUDA graph: the batch recorded once, replayed as the same ops (gloo has
    no graphs; what the rehearsal checks is the choice, the ranks' agreement and the report)."""
    return lambda: run(ops)
