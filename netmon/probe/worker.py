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

from netmon.bandwidth import buffers_for
from netmon.gpu.clocks import SmClock
from netmon.listen import listen_on
from netmon.probe import cpushare, graphs, timing
from netmon.probe.collective import Collective
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


def cpu_s() -> float:
    """This process's CPU time so far, every thread's (gloo's too): each phase's mark, so the
    launcher can say what each phase of a run cost (netmon_probe_rank_cpu_seconds_total)."""
    return round(time.process_time(), 6)


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
        self.clock: SmClock | None = None  # this rank's GPU's SM clock, once it has one
        self.warm = False  # warmed up by time (spec.warmup_s), once per run

    def enter(self, phase: Phase, **fields: Any) -> None:
        self.phase = phase
        self.channel.send("phase", phase=phase, cpu_s=cpu_s(), **fields)

    def run(self, stdin: IO[str]) -> None:
        import torch
        import torch.distributed as dist

        self.channel.send("hello", pid=os.getpid(), cpu_s=cpu_s())
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
        timing.synchronize(torch, dist, device)
        dist.destroy_process_group()
        if self.clock is not None:
            self.clock.close()
        self.channel.send("done", cpu_s=cpu_s())

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
        tell = self._progress("warmup", size, spec.warmup)
        for done in range(1, spec.warmup + 1):
            collective.run(spec.chunks)
            tell(done)
        on_gpu = device.type == "cuda" or self.simulated
        if on_gpu and not self.warm:
            self._warm_for(torch, dist, device, collective)
        timing.synchronize(torch, dist, device)
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
        samples, cpu, clocks = self._measure(
            torch, dist, device, issue, self._progress("measure", size, spec.iters)
        )
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
                sm_clock_mhz=clocks,
            )

    def _progress(self, phase: str, size: int, of: int) -> Callable[[int], None]:
        """What a reporter calls after each op or sample: a "progress" event at most every
        spec.progress_s seconds, so a terminal can show a long size moving."""
        every = self.spec.progress_s
        if every <= 0 or self.rank not in self.spec.reporters:
            return lambda done: None
        last = [time.monotonic()]

        def tell(done: int) -> None:
            now = time.monotonic()
            if now - last[0] >= every and done < of:
                last[0] = now
                self.channel.send("progress", phase=phase, size=size, done=done, of=of)

        return tell

    def _warm_for(self, torch: Any, dist: Any, device: Any, collective: Collective) -> None:
        """Go on warming up until spec.warmup_s has passed on every rank, before the first size
        only: an idle GPU runs at a low clock until its load has lasted a moment, and the ranks
        agree by a collective when to stop (each one's clock alone could leave one short)."""
        self.warm = True
        until = time.monotonic() + self.spec.warmup_s
        more = torch.ones(1, dtype=torch.int32, device=device)
        while self.spec.warmup_s > 0:
            collective.run(self.spec.chunks)
            more.fill_(1 if time.monotonic() < until else 0)
            dist.all_reduce(more, op=dist.ReduceOp.MAX)
            if int(more.item()) == 0:
                return

    def _sm_clock(self, on_gpu: bool) -> float:
        """This rank's GPU's SM clock now (MHz), or -1 where it cannot be read (CPU ranks)."""
        if not on_gpu:
            return -1.0
        if self.clock is None:
            self.clock = SmClock(os.environ.get("CUDA_VISIBLE_DEVICES", ""))
        mhz = self.clock.read_mhz()
        return -1.0 if mhz is None else float(mhz)

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

    def _measure(
        self,
        torch: Any,
        dist: Any,
        device: Any,
        issue: Callable[[], None],
        on_sample: Callable[[int], None],
    ) -> tuple[list[list[float]], list[list[float]], list[float]]:
        """Every rank's sample times, each rank's CPU reading over its measured loop
        (netmon.probe.cpushare; empty where /proc cannot say), and each rank's GPU's SM clock
        right after it (MHz, -1 unknown). A sample is one `issue`: a batch of ops, eager or one
        graph replay (netmon.probe.graphs), timed per op."""
        before = cpushare.read()
        times = timing.samples(torch, dist, device, issue, self.spec.iters, self._reps(), on_sample)
        after = cpushare.read()
        cpu = after.since(before) if before and after else [-1.0] * cpushare.READING_FIELDS
        clock = self._sm_clock(device.type == "cuda" or self.simulated)
        # Every rank's times and reading, gathered outside the timed region; the launcher
        # combines the times per sample (spec.rank_stat) and keeps each rank's median.
        row = [*times, *cpu, clock]
        mine = torch.tensor(row, dtype=torch.float64, device=device)
        everyone = torch.zeros(len(row) * self.world, dtype=torch.float64, device=device)
        dist.all_gather_into_tensor(everyone, mine)
        flat = [float(v) for v in everyone.cpu().tolist()]
        rows = [flat[r * len(row) : (r + 1) * len(row)] for r in range(self.world)]
        cut = len(times)
        readings = [r[cut:-1] for r in rows if r[cut + 2] >= 0]
        return [r[:cut] for r in rows], readings, [r[-1] for r in rows]

    def _check(self, torch: Any, dist: Any, device: Any, collective: Collective) -> bool:
        ok = collective.verify()
        flags = torch.tensor([0 if ok else 1], dtype=torch.int32, device=device)
        dist.all_reduce(flags)
        return int(flags.item()) == 0


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
