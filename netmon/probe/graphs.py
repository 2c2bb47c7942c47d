"""Small sizes timed from CUDA graphs (docs/FACTS.md, "Timing small sizes").

At 8 B-1 MiB an NCCL kernel runs for microseconds, while each `dist.all_reduce` call costs tens
of microseconds of host time (its Work object, events, stream waits): a batch of eager calls
times the host's issue rate, not the link. Captured once in a CUDA graph, the batch replays
with one launch, as nccl-tests' `-G` does. PyTorch's ProcessGroupNCCL lets collectives be
captured from NCCL 2.9.6 on (it refuses older ones), once the communicator exists: the eager
warm-up makes it. Capture uses the thread-local error mode, so c10d's watchdog and the rank's
heartbeat thread may go on calling CUDA while this thread captures.

The choice is pure (`choose`); `capture` is the only CUDA call, made in the rank.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from netmon.probe.spec import ProbeSpec, SizeResult

log = logging.getLogger(__name__)

TimingPath = Literal["graph", "eager"]
# Sizes over this are bandwidth-bound: a launch gap of tens of microseconds is under 1 % of an
# op of milliseconds, and the eager path is nccl-tests' default there too.
GRAPH_MAX_BYTES = 1 << 20
# c10d refuses to capture NCCL collectives before this version (errorIfCapturingNonCapturableNCCL).
MIN_NCCL = (2, 9, 6)
# How each (op, size, path, reason) was timed, logged once per process: a daemon probes every
# minute, and a line per result would bury the one that changed. Bounded by the configured
# probes' ops and sizes.
_NOTED: set[tuple[str, int, str, str | None]] = set()
# Ops whose one call is one NCCL collective on preallocated tensors. sendrecv is a group of
# point-to-point calls and all_gather_object a host round trip: both stay eager.
CAPTURED_OPS = frozenset({"all_reduce", "broadcast", "all_gather", "reduce_scatter", "alltoall"})


@dataclass(frozen=True)
class Choice:
    path: TimingPath
    why: str  # one line: why this path (an operator reads it beside an eager result)


def choose(spec: ProbeSpec, size: int, on_gpu: bool, nccl: str | None) -> Choice:
    """How one size of `spec` is timed on a rank whose device is a GPU (`on_gpu`, a simulated one
    included) with `nccl` (its version, None when unknown)."""
    if spec.cuda_graph == "off":
        return Choice("eager", "cuda_graph: off")
    if spec.backend != "nccl" or not on_gpu:
        return Choice("eager", "no CUDA graphs without NCCL on a GPU")
    if spec.timing != "batched":
        return Choice("eager", "per_op timing synchronises after every op")
    if spec.op not in CAPTURED_OPS:
        return Choice("eager", f"{spec.op} is not captured")
    if size > GRAPH_MAX_BYTES:
        return Choice("eager", f"bandwidth-bound (over {GRAPH_MAX_BYTES} bytes)")
    version = parse_version(nccl)
    if version is None:
        return Choice("eager", f"NCCL version {nccl!r} unknown")
    if version < MIN_NCCL:
        return Choice("eager", f"NCCL {nccl} cannot be captured (2.9.6 or later)")
    return Choice("graph", f"one CUDA graph of {spec.batch} ops per sample")


def note(spec: ProbeSpec, result: SizeResult) -> None:
    """Log how a result was timed, the first time this process sees that choice for its size."""
    key = (spec.op, result.size_bytes, result.timing_path, result.timing_why)
    if spec.backend != "nccl" or key in _NOTED:
        return
    _NOTED.add(key)
    log.info(
        "%s %d B (%s path) timed %s: %s",
        spec.op,
        result.size_bytes,
        spec.path,
        "from a CUDA graph" if result.timing_path == "graph" else "eagerly",
        result.timing_why,
    )


def parse_version(text: str | None) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in str(text).split(".")[:3]) if text else None
    except ValueError:
        return None


def capture(torch: Any, run: Callable[[int], None], times: int) -> Callable[[], None]:
    """`run(times)` captured in a CUDA graph; its replay. Raises what CUDA or c10d raised."""
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
        run(times)
    torch.cuda.current_stream().wait_stream(side)
    return graph.replay  # type: ignore[no-any-return]


def issuer(
    torch: Any,
    dist: Any,
    device: Any,
    run: Callable[[int], None],
    ops: int,
    choice: Choice,
    capture_with: Callable[[Callable[[int], None], int], Callable[[], None]] | None = None,
) -> tuple[Callable[[], None], Choice]:
    """What one sample issues: `run(ops)` eagerly, or where `choice` says graph, its captured
    replay (by `capture_with`: a simulated node's stand-in; CUDA's own by default). Every rank
    takes the same path: if one could not capture, all go eager and say why."""
    eager: Callable[[], None] = lambda: run(ops)  # noqa: E731 (the issue of one sample)
    if choice.path == "eager":
        return eager, choice
    replay: Callable[[], None] | None = None
    why = "capture failed on another rank"
    try:
        replay = (capture_with or (lambda r, n: capture(torch, r, n)))(run, ops)
    except Exception as exc:  # any CUDA or c10d refusal: fall back, and say so
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        why = f"capture failed: {lines[0][:160]}"
    everyone = torch.tensor([0 if replay is None else 1], dtype=torch.int32, device=device)
    dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
    if replay is None or int(everyone.item()) == 0:
        return eager, Choice("eager", why)
    replay()  # the first launch uploads the graph: not a sample
    return replay, choice
