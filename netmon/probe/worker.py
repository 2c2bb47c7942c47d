"""The code inside one rank process: rendezvous, timed collective loops, reports to the launcher.

Run as `python -m netmon.probe.worker`, or forked by the rank zygote (netmon.probe.zygote, the
one other module that imports torch, and never touches CUDA). The launcher writes one JSON line on
stdin (the spec and this rank's number) and, for ranks other than 0, a second line with the
rendezvous port that rank 0's store bound. The rank answers with JSON lines on its channel, the
descriptor that NETMON_CHANNEL_FD names: phases, heartbeats, results, its peak memory, errors.
Never on stdout, which NCCL and other libraries write to. This is the only netmon module that may
touch CUDA.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import IO, Any

from netmon.bandwidth import Buffers, buffers_for
from netmon.listen import listen_on
from netmon.probe import cpushare, graphs
from netmon.probe.processes import CHANNEL_FD, is_loopback
from netmon.probe.spec import Phase, ProbeSpec
from netmon.sim import rank as sim_rank

HEARTBEAT_S = 0.5


def open_channel(environ: Mapping[str, str]) -> IO[str]:
    """The channel to the launcher, which it named in the environment. A descriptor of its own:
    on stdout, a library's output (NCCL's log, which C stdio buffers fully into a pipe and so
    flushes in the middle of a line) could land inside one of our lines."""
    try:
        fd = int(environ[CHANNEL_FD])
        os.set_inheritable(fd, False)  # nothing the rank starts may hold it open
        return open(fd, "w", encoding="utf-8")
    except (KeyError, ValueError, OSError) as exc:
        raise SystemExit(
            f"netmon.probe.worker: no channel to the launcher ({CHANNEL_FD}="
            f"{environ.get(CHANNEL_FD)!r}: {exc}); it runs under netmon's launcher, and a"
            " rank_wrapper must leave inherited descriptors open"
        ) from None


class Channel:
    """Line-delimited JSON to the launcher; a broken pipe means the launcher is gone: exit."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, event: str, **fields: Any) -> None:
        line = json.dumps({"ev": event, **fields}, separators=(",", ":"))
        with self._lock:
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                os._exit(3)


def _heartbeat(channel: Channel, parent: int) -> None:
    # A rank whose launcher died must not linger holding a GPU.
    while True:
        time.sleep(HEARTBEAT_S)
        if os.getppid() != parent:
            os._exit(4)
        channel.send("hb")


class Rank:
    def __init__(self, spec: ProbeSpec, rank: int, channel: Channel) -> None:
        self.spec = spec
        self.rank = rank
        self.world = spec.ranks
        self.channel = channel
        self.phase: Phase = "spawn"
        self.simulated = False  # on a simulated GPU node (netmon.sim): gloo, capped buffers

    def enter(self, phase: Phase, **fields: Any) -> None:
        self.phase = phase
        self.channel.send("phase", phase=phase, **fields)

    def run(self, stdin: IO[str]) -> None:
        import torch
        import torch.distributed as dist

        self.channel.send("hello", pid=os.getpid())
        self.enter("rendezvous")
        store = self._rendezvous(dist, stdin)
        self.enter("init")
        device = self._init(torch, dist, store)
        if device.type == "cuda":
            # Which GPU CUDA really opened, for `netmon selftest` to hold against the one pinned.
            uuid = torch.cuda.get_device_properties(device).uuid
            self.channel.send("gpu", uuid=f"GPU-{uuid}")
        if self.rank in self.spec.reporters:
            self._report_environment(torch)
        for size in self.spec.sizes:
            self._sweep_one(torch, dist, device, size)
        if device.type == "cuda":
            self.channel.send("mem", peak_bytes=int(torch.cuda.max_memory_allocated(device)))
        # This rank's peak resident host memory, torch's own footprint included (Linux counts
        # ru_maxrss in KiB). A launcher that does not know the event ignores it.
        self.channel.send(
            "rss", peak_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        )
        self.enter("teardown")
        # Rank 0 hosts the store: nobody leaves until everybody is done with it.
        self._synchronize(torch, dist, device)
        dist.destroy_process_group()
        self.channel.send("done")

    def _rendezvous(self, dist: Any, stdin: IO[str]) -> Any:
        timeout = timedelta(seconds=self.spec.deadlines.rendezvous)
        if self.rank == 0:
            # Port 0: the kernel picks a free port, so no other process can race us for it. The
            # store lives only as long as this probe, on the one address the other ranks use.
            sock = listen_on(self.spec.host)
            store = dist.TCPStore(
                self.spec.host,
                sock.getsockname()[1],
                self.world,
                is_master=True,
                timeout=timeout,
                wait_for_workers=False,
                master_listen_fd=sock.detach(),
            )
            self.channel.send("store", port=int(store.port))
            return store
        line = stdin.readline()
        if not line:
            raise RuntimeError("the launcher closed stdin before sending the rendezvous port")
        port = int(json.loads(line)["port"])
        return dist.TCPStore(self.spec.host, port, self.world, is_master=False, timeout=timeout)

    def _init(self, torch: Any, dist: Any, store: Any) -> Any:
        timeout = timedelta(seconds=self.spec.deadlines.watchdog())
        if self.spec.backend == "nccl" and (gpu := sim_rank.open_gpu(os.environ)) is not None:
            return self._init_simulated(torch, dist, store, timeout, gpu)
        if self.spec.backend == "nccl":
            # CUDA_VISIBLE_DEVICES pins exactly one GPU to this process.
            device = torch.device("cuda", 0)
            torch.cuda.set_device(device)
            dist.init_process_group(
                "nccl",
                store=store,
                rank=self.rank,
                world_size=self.world,
                timeout=timeout,
                device_id=device,
            )
        else:
            device = torch.device("cpu")
            dist.init_process_group(
                "gloo", store=store, rank=self.rank, world_size=self.world, timeout=timeout
            )
        return device

    def _init_simulated(
        self, torch: Any, dist: Any, store: Any, timeout: timedelta, gpu: str
    ) -> Any:
        """On a simulated node (`--simulate`): registered on `gpu`, where CUDA would have made
        its context, the rank runs the collectives on gloo over loopback."""
        self.simulated = True
        self.channel.send("gpu", uuid=gpu)
        if is_loopback(self.spec.host):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(
            "gloo", store=store, rank=self.rank, world_size=self.world, timeout=timeout
        )
        return torch.device("cpu")

    def _report_environment(self, torch: Any) -> None:
        self.channel.send(
            "env",
            torch=torch.__version__,
            nccl=self._nccl_version(torch),
            python=sys.version.split()[0],
            devices=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        )

    def _sweep_one(self, torch: Any, dist: Any, device: Any, size: int) -> None:
        spec = self.spec
        chunk_bytes = max(1, size // spec.chunks)
        buffers = buffers_for(spec.op, chunk_bytes, self.world, spec.dtype)
        carried = buffers
        if self.simulated:
            # Reported as the GPU would carry it, so every series has its real labels.
            carried = buffers_for(spec.op, sim_rank.carried(chunk_bytes), self.world, spec.dtype)
        collective = Collective(torch, dist, spec, self.rank, device, carried)
        self.enter("warmup", size=size)
        sim_rank.kernels(True)
        for _ in range(spec.warmup):
            collective.run(spec.chunks)
        self._synchronize(torch, dist, device)
        on_gpu = device.type == "cuda" or self.simulated
        choice = graphs.choose(spec, size, on_gpu, self._nccl_version(torch))
        issue, choice = graphs.issuer(
            torch,
            dist,
            device,
            collective.run,
            spec.chunks * self._reps(),
            choice,
            sim_rank.capture if self.simulated else None,
        )
        self.enter("measure", size=size)
        samples, cpu = self._measure(torch, dist, device, issue)
        check_ok: bool | None = None
        if spec.check:
            self.enter("check", size=size)
            check_ok = self._check(torch, dist, device, collective)
        sim_rank.kernels(False)
        if self.rank in self.spec.reporters:
            self.channel.send(
                "size",
                requested=size,
                size_bytes=buffers.size_bytes * spec.chunks,
                carried_bytes=carried.size_bytes * spec.chunks,
                count=buffers.count * spec.chunks,
                samples=samples,
                cpu=cpu,
                check_ok=check_ok,
                timing_path=choice.path,
                timing_why=choice.why,
            )

    def _reps(self) -> int:
        """Ops per sample: a batch, or one where every op is synchronised."""
        return self.spec.batch if self.spec.timing == "batched" else 1

    def _nccl_version(self, torch: Any) -> str | None:
        if self.spec.backend != "nccl":
            return None
        simulated = sim_rank.nccl_version()
        if simulated is not None or not torch.cuda.is_available():
            return simulated
        version = torch.cuda.nccl.version()
        return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)

    def _synchronize(self, torch: Any, dist: Any, device: Any) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            dist.barrier(device_ids=[device.index])
            torch.cuda.synchronize(device)
        else:
            dist.barrier()

    def _measure(
        self, torch: Any, dist: Any, device: Any, issue: Callable[[], None]
    ) -> tuple[list[list[float]], list[list[float]]]:
        """Every rank's sample times, and each rank's CPU reading over its measured loop
        (netmon.probe.cpushare; empty where /proc cannot say). A sample is one `issue`: a batch
        of ops, eager or one graph replay (netmon.probe.graphs), timed per op."""
        spec = self.spec
        times = []
        before = cpushare.read()
        for _ in range(spec.iters):
            self._synchronize(torch, dist, device)
            if device.type == "cuda":
                times.append(self._time_cuda(torch, issue))
            else:
                times.append(self._time_host(issue))
        after = cpushare.read()
        cpu = after.since(before) if before and after else [-1.0] * cpushare.READING_FIELDS
        # Every rank's times and reading, gathered outside the timed region; the launcher
        # combines the times per sample (spec.rank_stat) and keeps each rank's median.
        row = [*times, *cpu]
        mine = torch.tensor(row, dtype=torch.float64, device=device)
        everyone = torch.zeros(len(row) * self.world, dtype=torch.float64, device=device)
        dist.all_gather_into_tensor(everyone, mine)
        flat = [float(v) for v in everyone.cpu().tolist()]
        rows = [flat[r * len(row) : (r + 1) * len(row)] for r in range(self.world)]
        cut = len(times)
        return [r[:cut] for r in rows], [r[cut:] for r in rows if r[cut + 2] >= 0]

    def _time_host(self, issue: Callable[[], None]) -> float:
        start = time.perf_counter()
        issue()
        return (time.perf_counter() - start) / self._reps()

    def _time_cuda(self, torch: Any, issue: Callable[[], None]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        issue()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3 / self._reps()

    def _check(self, torch: Any, dist: Any, device: Any, collective: Collective) -> bool:
        ok = collective.verify()
        flags = torch.tensor([0 if ok else 1], dtype=torch.int32, device=device)
        dist.all_reduce(flags)
        return int(flags.item()) == 0


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


def main() -> None:
    warnings.filterwarnings("ignore")
    channel = Channel(open_channel(os.environ))
    threading.Thread(target=_heartbeat, args=(channel, os.getppid()), daemon=True).start()
    rank_obj: Rank | None = None
    try:
        first = json.loads(sys.stdin.readline())
        spec = ProbeSpec.model_validate(first["spec"])
        rank_obj = Rank(spec, int(first["rank"]), channel)
        rank_obj.run(sys.stdin)
    except BaseException as exc:  # report everything, including KeyboardInterrupt
        phase = rank_obj.phase if rank_obj else "spawn"
        channel.send(
            "error",
            phase=phase,
            type=type(exc).__name__,
            message=str(exc).strip().splitlines()[0][:500] if str(exc).strip() else "",
            trace=traceback.format_exc()[-2000:],
        )
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()  # into the rank's stderr file: the channel is not stdout
    # Skip interpreter teardown: torch's atexit hooks can hang after the group is destroyed.
    os._exit(0)


if __name__ == "__main__":
    main()
