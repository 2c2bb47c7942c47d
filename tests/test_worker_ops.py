"""What the worker's Collective asks of torch.distributed, recorded by a stand-in that keeps score.

NCCL cannot run here, so the calls are checked instead: sendrecv must post its send and its
receive in ONE batch_isend_irecv (one NCCL group, or NCCL may hang the ring), each to the right
peer; every op must use the buffers it was given; and the buffers a Collective holds must add up
to bandwidth.buffer_budget. Tensors are real (CPU) torch tensors; only the transport is recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from netmon.bandwidth import OPS, OpName, buffer_budget, buffers_for
from netmon.probe.collective import Collective
from netmon.probe.spec import ProbeSpec


@dataclass
class Work:
    """What an async call returns: it counts the waits on it."""

    waits: int = 0

    def wait(self) -> bool:
        self.waits += 1
        return True


@dataclass(frozen=True)
class RecordedP2POp:
    """torch.distributed.P2POp's positional form: op (isend or irecv), tensor, peer."""

    op: Callable[..., Work]
    tensor: Any
    peer: int


@dataclass
class RecordingDist:
    """The part of torch.distributed's surface the worker uses, each call recorded in order.

    all_gather_object fills the list as the real call would, every rank's copy of the object.
    """

    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    works: list[Work] = field(default_factory=list)

    P2POp = RecordedP2POp

    def _record(self, name: str, *args: Any, **kwargs: Any) -> Work:
        self.calls.append((name, args, kwargs))
        self.works.append(Work())
        return self.works[-1]

    def isend(self, tensor: Any, dst: int) -> Work:
        return self._record("isend", tensor, dst)

    def irecv(self, tensor: Any, src: int) -> Work:
        return self._record("irecv", tensor, src)

    def batch_isend_irecv(self, ops: list[RecordedP2POp]) -> list[Work]:
        self._record("batch_isend_irecv", list(ops))
        # One Work per op, as torch returns for a backend without coalescing (gloo).
        self.works.extend(Work() for _ in ops[1:])
        return self.works[-len(ops) :]

    def all_reduce(self, tensor: Any) -> Work:
        return self._record("all_reduce", tensor)

    def broadcast(self, tensor: Any, src: int) -> Work:
        return self._record("broadcast", tensor, src=src)

    # The single-tensor forms of the installed torch, which the worker prefers where they exist.
    def all_gather_single(self, output: Any, input: Any) -> Work:
        return self._record("all_gather_single", output, input)

    def reduce_scatter_single(self, output: Any, input: Any) -> Work:
        return self._record("reduce_scatter_single", output, input)

    def all_to_all_single(self, output: Any, input: Any) -> Work:
        return self._record("all_to_all_single", output, input)

    def all_gather_object(self, objects: list[Any], obj: Any) -> None:
        self._record("all_gather_object", objects, obj)
        objects[:] = [obj] * len(objects)


def _collective(
    op: OpName, rank: int, ranks: int, backend: str = "nccl", size: int = 4096
) -> tuple[Collective, RecordingDist]:
    dist = RecordingDist()
    devices = tuple(str(r) for r in range(ranks)) if backend == "nccl" else ()
    spec = ProbeSpec(op=op, backend=backend, ranks=ranks, devices=devices, sizes=(size,))
    buffers = buffers_for(op, size, ranks, spec.dtype)
    return Collective(torch, dist, spec, rank, torch.device("cpu"), buffers), dist


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
@pytest.mark.parametrize("ranks", [2, 3, 8])
def test_sendrecv_posts_its_send_and_receive_in_one_batch_to_the_ring_neighbours(
    backend: str, ranks: int
) -> None:
    for rank in range(ranks):
        collective, dist = _collective("sendrecv", rank, ranks, backend)
        collective.run(3)
        assert [name for name, _, _ in dist.calls] == ["batch_isend_irecv"] * 3, dist.calls
        for _, (batch,), _ in dist.calls:
            sends = [p for p in batch if p.op == dist.isend]
            receives = [p for p in batch if p.op == dist.irecv]
            assert len(sends) == len(receives) == 1 and len(batch) == 2
            assert sends[0].peer == (rank + 1) % ranks
            assert receives[0].peer == (rank - 1) % ranks
            assert sends[0].tensor is collective.send
            assert receives[0].tensor is collective.recv
        assert collective.send is not collective.recv
        # Every request is waited on before the op counts as done.
        assert dist.works and all(work.waits == 1 for work in dist.works)


EXPECTED_CALLS: dict[OpName, tuple[str, Callable[[Collective], tuple[Any, ...]]]] = {
    "all_reduce": ("all_reduce", lambda c: (c.send,)),
    "broadcast": ("broadcast", lambda c: (c.send,)),
    "all_gather": ("all_gather_single", lambda c: (c.recv, c.send)),
    "reduce_scatter": ("reduce_scatter_single", lambda c: (c.recv, c.send)),
    "alltoall": ("all_to_all_single", lambda c: (c.recv, c.send)),
    "all_gather_object": ("all_gather_object", lambda c: (c.objects, c.payload)),
}


@pytest.mark.parametrize("op", sorted(EXPECTED_CALLS))
def test_each_collective_runs_on_the_buffers_it_holds(op: OpName) -> None:
    collective, dist = _collective(op, 1, 3)
    collective.run(2)
    name, arguments = EXPECTED_CALLS[op]
    assert len(dist.calls) == 2
    for called, args, kwargs in dist.calls:
        assert called == name
        assert len(args) == len(arguments(collective))
        assert all(a is b for a, b in zip(args, arguments(collective), strict=True))
        assert kwargs == ({"src": 0} if op == "broadcast" else {})


def _bytes_held(collective: Collective) -> int:
    """Bytes of the distinct tensor storages and of the payloads the Collective holds."""
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in (collective.send, collective.recv)
    }
    gathered = sum(len(o) for o in collective.objects if o is not None)
    return int(sum(storages.values())) + len(collective.payload) + gathered


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("size", "ranks"), [(1 << 20, 3), (4096, 2), (4, 8)])
def test_a_collective_holds_exactly_its_buffer_budget(op: OpName, size: int, ranks: int) -> None:
    collective, _ = _collective(op, 0, ranks, size=size)
    collective.run(1)  # all_gather_object's gathered payloads exist only after an op
    assert _bytes_held(collective) == buffer_budget(op, size, ranks, "float32")
    if op == "all_gather_object":
        assert collective.send.numel() == collective.recv.numel() == 0
    else:
        assert collective.payload == b""
        # all_reduce and broadcast run in place: their result lands in their input.
        assert (collective.recv is collective.send) is (op in ("all_reduce", "broadcast"))


def test_the_check_finds_one_wrong_element_or_nan_in_any_block_and_allows_rounding() -> None:
    blocks = [3.0, 5.0, 7.0]
    good = torch.tensor(blocks, dtype=torch.float32).repeat_interleave(1000)
    assert Collective._holds(good, [3, 5, 7])
    for index, bad in ((1500, 5.2), (0, 2.9), (2999, float("nan")), (1000, float("inf"))):
        wrong = good.clone()
        wrong[index] = bad
        assert not Collective._holds(wrong, [3, 5, 7]), (index, bad)
    # bfloat16 rounds 255 to 256: within the 1% a sum of bfloat16 values may be off.
    rounded = torch.full((64,), 255.0, dtype=torch.bfloat16)
    assert Collective._holds(rounded, [255])
    filled = torch.zeros(6, dtype=torch.float16)
    Collective._fill_blocks(filled, [1, 2, 3])
    assert filled.tolist() == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
