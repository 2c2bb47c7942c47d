"""One op on preallocated buffers, as a rank runs it, with a correctness check of known values
(the rank's life around it is netmon.probe.worker). Imported only inside rank processes: the
torch and torch.distributed it uses are handed in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from netmon.bandwidth import Buffers
from netmon.probe.spec import ProbeSpec


class Collective:
    """One op on preallocated buffers, plus a correctness check with known values.

    It allocates only what the op needs (bandwidth.buffer_budget): one buffer for the ops that
    run in place, whose `recv` is then `send`, and for all_gather_object a host payload and no
    tensors at all.
    """

    def __init__(
        self,
        torch: Any,
        dist: Any,
        spec: ProbeSpec,
        rank: int,
        device: Any,
        buffers: Buffers,
    ) -> None:
        self.torch, self.dist, self.spec, self.rank = torch, dist, spec, rank
        self.world = spec.ranks
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
            spec.dtype
        ]
        self.dtype = dtype
        # Timed ops run on zeros: all_reduce sums in place, so any other value is multiplied by
        # the world size on every op and overflows to inf (float32 after 128 ops at 2 ranks,
        # float16 after 16, sooner at more ranks); a benchmark must not time inf/NaN arithmetic.
        self.payload = b""
        if spec.op == "all_gather_object":
            self.send = self.recv = torch.zeros(0, dtype=dtype, device=device)
            self.payload = bytes([rank % 256]) * (buffers.in_count * buffers.element_bytes)
        else:
            self.send = torch.zeros(buffers.in_count, dtype=dtype, device=device)
            self.recv = (
                torch.zeros(buffers.out_count, dtype=dtype, device=device)
                if buffers.out_count
                else self.send
            )
        self.objects: list[Any] = [None] * self.world
        self._op = self._bind()

    def run(self, times: int) -> None:
        for _ in range(times):
            self._op()

    def _bind(self) -> Callable[[], None]:
        dist, op = self.dist, self.spec.op
        if op == "all_reduce":
            return lambda: dist.all_reduce(self.send)
        if op == "broadcast":
            return lambda: dist.broadcast(self.send, src=0)
        if op == "all_gather":
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            return lambda: gather(self.recv, self.send)
        if op == "reduce_scatter":
            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            return lambda: scatter(self.recv, self.send)
        if op == "alltoall":
            return lambda: dist.all_to_all_single(self.recv, self.send)
        if op == "sendrecv":
            return self._sendrecv()
        if op == "all_gather_object":
            return lambda: dist.all_gather_object(self.objects, self.payload)
        raise ValueError(f"unknown op {op}")

    def _sendrecv(self) -> Callable[[], None]:
        # nccl-tests' sendrecv: every rank sends to the next and receives from the previous. The
        # send and the receive go in one batch, which torch issues as one NCCL group: NCCL may
        # hold a send until the peer's receive is posted in the same group, so two separate calls
        # can hang the ring (docs/FACTS.md, "Point-to-point"). Gloo takes the batch too.
        dist = self.dist
        peer_to, peer_from = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        batch = [
            dist.P2POp(dist.isend, self.send, peer_to),
            dist.P2POp(dist.irecv, self.recv, peer_from),
        ]

        def exchange() -> None:
            for request in dist.batch_isend_irecv(batch):
                request.wait()

        return exchange

    def verify(self) -> bool:
        ok = self._verify()
        # The check leaves known nonzero values behind; any op timed after it would grow them.
        self.send.zero_()
        self.recv.zero_()
        return ok

    def _verify(self) -> bool:
        # Known values in, expected values out, checked block by block through their minimum and
        # maximum: no temporary as large as a buffer, so a check stays within the op's budget.
        n, r = self.world, self.rank
        op = self.spec.op
        if op == "all_gather_object":
            self.payload = bytes([r % 256]) * len(self.payload)
            self._op()
            return all(self.objects[j] == bytes([j % 256]) * len(self.payload) for j in range(n))
        if op == "sendrecv":
            self.send.fill_(r + 1)
            self._op()
            return self._holds(self.recv, [(r - 1) % n + 1])
        if op == "broadcast":
            self.send.fill_(7 if r == 0 else 0)
            self._op()
            return self._holds(self.send, [7])
        if op == "all_reduce":
            self.send.fill_(r + 1)
            self._op()
            return self._holds(self.send, [n * (n + 1) // 2])
        if op == "all_gather":
            self.send.fill_(r + 1)
            self._op()
            return self._holds(self.recv, [j + 1 for j in range(n)])
        if op == "reduce_scatter":
            # Block j of rank r holds r + 1 + j; rank r receives block r summed over ranks.
            self._fill_blocks(self.send, [r + 1 + j for j in range(n)])
            self._op()
            return self._holds(self.recv, [n * (n + 1) // 2 + n * r])
        if op == "alltoall":
            # Block j of rank r, sent to rank j, holds r * n + j.
            self._fill_blocks(self.send, [r * n + j for j in range(n)])
            self._op()
            return self._holds(self.recv, [j * n + r for j in range(n)])
        raise ValueError(f"no check for {op}")

    @staticmethod
    def _fill_blocks(tensor: Any, values: list[int]) -> None:
        for block, value in zip(tensor.view(len(values), -1), values, strict=True):
            block.fill_(value)

    @staticmethod
    def _holds(tensor: Any, values: list[int]) -> bool:
        """Whether block j of the tensor holds values[j] everywhere, to 1% (bfloat16 sums round).

        Every element lies between its block's min and max, so both within the tolerance means all
        are; a NaN makes them NaN, which fails.
        """
        low, high = tensor.view(len(values), -1).aminmax(dim=1)
        return all(
            abs(lo - value) <= 1e-2 * value and abs(hi - value) <= 1e-2 * value
            for lo, hi, value in zip(low.tolist(), high.tolist(), values, strict=True)
        )
