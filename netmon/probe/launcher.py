"""Runs one probe: starts its rank processes, enforces phase deadlines, kills and reaps the group.

The launcher never imports torch. Each rank is a fresh process in its own session (so a kill of
its process group reaches anything it started): forked by the rank zygote when one is given
(netmon.probe.forking), else a new interpreter. It talks to us over pipes: JSON lines on a
channel of its own (not stdout), the rendezvous port on stdin. Any deadline passed, rank lost,
zygote lost or abort request ends the whole group: SIGTERM (and SIGCONT, so a stopped rank can
act on it), a short grace, SIGKILL, then every rank is reaped. Exits are seen without reaping
(waitid(WNOWAIT), here or in the zygote): no rank's PID can be reused before its group is killed.
When a deadline has passed and whom it blames is netmon.probe.deadlines; which trouble is the
probe's failure, netmon.probe.blame; what the ranks reported, netmon.probe.rank_reports.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from netmon.probe import transport_faults
from netmon.probe.blame import Blame
from netmon.probe.deadlines import deadline_passed
from netmon.probe.debugenv import debug_env
from netmon.probe.forking import ForkedRank, Zygote
from netmon.probe.processes import (
    RankProcess,
    SpawnedRank,
    is_loopback,
    signal_group,
    slowest_span,
)
from netmon.probe.rank_reports import RankReports
from netmon.probe.rankcpu import summed
from netmon.probe.spec import PHASES, ProbeFailure, ProbeOutcome, ProbeSpec
from netmon.probe.starting import RankStarter, base_env, orphan_gone
from netmon.probe.workdirs import probe_workdir

AbortCheck = Callable[[], "str | None"]
EventHook = Callable[[str, dict[str, Any]], None]

TERM_GRACE_S = 2.0
POLL_S = 0.05


class Launcher:
    def __init__(
        self,
        spec: ProbeSpec,
        *,
        python: str = sys.executable,
        abort: AbortCheck | None = None,
        on_event: EventHook | None = None,
        extra_env: Mapping[str, str] | None = None,
        local_ranks: Sequence[int] | None = None,
        port_source: Callable[[], int | None] | None = None,
        zygote: Zygote | None = None,
    ) -> None:
        """`local_ranks` (global rank numbers) are the ranks this launcher starts, all by default;
        another node starts the rest. When rank 0 is not local, `port_source` is polled for the
        rendezvous port that rank 0's node published. With a `zygote`, ranks are forked from it
        where they can be, and spawned otherwise."""
        self.spec = spec
        self.python = python
        self.abort = abort
        self.on_event = on_event
        self.extra_env = dict(extra_env or {})
        self.local_ranks = tuple(range(spec.ranks)) if local_ranks is None else tuple(local_ranks)
        if not self.local_ranks or not set(self.local_ranks) <= set(range(spec.ranks)):
            raise ValueError(f"local ranks {self.local_ranks} outside 0..{spec.ranks - 1}")
        if 0 not in self.local_ranks and port_source is None:
            raise ValueError("rank 0 runs elsewhere: a port_source is needed")
        self.port_source = port_source
        self._port_sent = 0 in self.local_ranks
        self._ranks: list[RankProcess] = []
        self._reports = RankReports(spec)
        self._blame = Blame()
        self._start = 0.0
        self._workdir = Path(tempfile.gettempdir())
        self.pids: list[int] = []
        self._starter = RankStarter(spec, python, zygote)

    # ---- public ----

    def run(self) -> ProbeOutcome:
        started_at = time.time()
        self._start = time.monotonic()
        failure: ProbeFailure | None = None
        transports: tuple[str, ...] = ()
        faults: tuple[str, ...] = ()
        with probe_workdir() as workdir:
            self._workdir = workdir
            try:
                failure = self._spawn_all(workdir)
                if failure is None:
                    failure = self._supervise()
            finally:
                self._terminate_all()
                self._starter.close()
                transports, faults = self._transports(workdir)
        return ProbeOutcome(
            spec=self.spec,
            results=tuple(self._reports.results),
            environment=self._reports.environment(),
            failure=failure,
            started_at=started_at,
            wall_s=time.monotonic() - self._start,
            collective_s=self._reports.collective_s,
            peak_device_memory_bytes=self._reports.peaks.get("mem"),
            peak_host_memory_bytes=self._reports.peaks.get("rss"),
            transports=transports,
            transport_faults=faults,
            startup_s=slowest_span(self._ranks, None, "rendezvous"),
            init_s=slowest_span(self._ranks, "init", "warmup"),
            ranks_forked=sum(isinstance(e.proc, ForkedRank) for e in self._ranks),
            ranks_spawned=sum(isinstance(e.proc, SpawnedRank) for e in self._ranks),
            fork_fallback=self._starter.fallback,
            rank_cpu_s=summed(e.cpu.by_phase() for e in self._ranks),
        )

    # ---- spawning ----

    def _rank_env(self, rank: int) -> dict[str, str]:
        env = base_env()
        if self.spec.backend == "nccl":
            if self.spec.devices:
                # The GPU found idle, by UUID where NVML gave one; an index left as such counts
                # in PCI bus order, NVML's, never CUDA's default fastest-first (docs/FACTS.md).
                env["CUDA_VISIBLE_DEVICES"] = (self.spec.cuda_devices or self.spec.devices)[rank]
                env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            # Only NCCL's own log shows the transport used (docs/FACTS.md, "Transport log"); an
            # operator's NCCL_DEBUG settings, in netmon's environment or the spec's, are kept.
            log_file = str(self._workdir / f"nccl.rank{rank}.%h.%p.log")
            env.update(debug_env({**env, **self.extra_env, **self.spec.env_dict()}, log_file))
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU rank must never create a CUDA context
            if is_loopback(self.spec.host):
                env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.update(self.extra_env)
        env.update(self.spec.env_dict())
        return env

    def _command(self, rank: int) -> list[str]:
        return self._starter.command(rank)

    def _spawn_all(self, workdir: Path) -> ProbeFailure | None:
        spec_json = self.spec.model_dump(mode="json")
        for rank in self.local_ranks:
            # A probe cancelled while its ranks start (a rank zygote's start can take seconds)
            # starts no more of them.
            cancelled = self._abort_requested()
            if cancelled is not None:
                return cancelled
            stderr_path = workdir / f"rank{rank}.stderr"
            env = self._rank_env(rank)
            try:
                with open(stderr_path, "wb") as stderr:
                    proc = self._starter.start(rank, env, stderr)
            except (OSError, ValueError) as exc:
                return ProbeFailure(phase="spawn", rank=rank, cause="spawn", detail=str(exc))
            now = time.monotonic()
            entry = RankProcess(rank, proc, stderr_path, phase_since=now, last_heard=now)
            self._ranks.append(entry)
            self.pids.append(proc.pid)
            assert proc.channel is not None
            os.set_blocking(proc.channel.fileno(), False)
            self._write(entry, {"spec": spec_json, "rank": rank})
        return None

    def _write(self, entry: RankProcess, message: dict[str, Any]) -> None:
        assert entry.proc.stdin is not None
        try:
            entry.proc.stdin.write((json.dumps(message) + "\n").encode())
            entry.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the rank is gone; its exit is noticed and blamed by the supervisor

    # ---- supervision ----

    def _supervise(self) -> ProbeFailure | None:
        selector = selectors.DefaultSelector()
        for entry in self._ranks:
            assert entry.proc.channel is not None
            selector.register(entry.proc.channel, selectors.EVENT_READ, entry)
        try:
            while True:
                for key, _ in selector.select(timeout=POLL_S):
                    self._read(key.data, selector)
                now = time.monotonic()
                self._notice_exits(now, selector)
                if all(entry.done and entry.exit_status == 0 for entry in self._ranks):
                    return None
                self._notice_zygote_lost(now)
                if self._blame:
                    blamed = self._blame.settled(now)
                    if blamed is not None:
                        return blamed
                    continue
                self._forward_remote_port()
                stop = self._abort_requested() or deadline_passed(
                    self.spec, self._ranks, self._start, now
                )
                if stop is not None:
                    return stop
        finally:
            selector.close()

    def _forward_remote_port(self) -> None:
        """Rank 0 lives on another node: hand its published port to our ranks once it exists."""
        if self._port_sent or self.port_source is None:
            return
        port = self.port_source()
        if port is None:
            return
        self._port_sent = True
        for entry in self._ranks:
            self._write(entry, {"port": port})

    def _read(self, entry: RankProcess, selector: selectors.BaseSelector) -> None:
        assert entry.proc.channel is not None
        try:
            chunk = os.read(entry.proc.channel.fileno(), 65536)
        except BlockingIOError:
            return
        if not chunk:
            entry.eof = True
            selector.unregister(entry.proc.channel)
            return
        entry.last_heard = time.monotonic()
        entry.buffer += chunk
        *lines, entry.buffer = entry.buffer.split(b"\n")
        for line in lines:
            if line.strip():
                self._handle(entry, line)

    def _handle(self, entry: RankProcess, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return  # never sent: the channel is the worker's alone (libraries write to stdout)
        kind = event.get("ev")
        now = time.monotonic()
        if "cpu_s" in event:  # hello, phase and done carry the rank's CPU time (probe.rankcpu)
            entry.cpu.enter(event.get("phase", "exit" if kind == "done" else ""), event["cpu_s"])
        if kind == "hello":
            entry.hello = True
        elif kind == "phase":
            entry.phase_entered.setdefault(event["phase"], now - self._start)
            entry.phase = event["phase"]
            entry.phase_since = now
            if entry.size is not None and event.get("size") != entry.size:
                entry.sizes_done += 1
            entry.size = event.get("size")
        elif kind == "store":
            for other in self._ranks:
                if other.rank != 0:
                    self._write(other, {"port": event["port"]})
        elif kind == "env":
            self._reports.environment_report = event
        elif kind == "size":
            self._record_size(event)
        elif kind in ("mem", "rss"):
            self._reports.peak(kind, int(event["peak_bytes"]))
        elif kind == "gpu":
            self._reports.gpus[entry.rank] = str(event["uuid"])
        elif kind == "error":
            entry.error = event
            self._blame.exception(now, entry, event)
        elif kind == "done":
            entry.done = True
        if self.on_event is not None and kind in ("hello", "store", "phase", "size", "progress"):
            self.on_event(kind, {"rank": entry.rank, **event})

    def _record_size(self, event: dict[str, Any]) -> None:
        result = self._reports.size(event)
        if result.check_ok is False:
            self._blame.wrong_values(time.monotonic(), self.spec.op, result.size_bytes)
        if self.on_event is not None:
            self.on_event("result", {"result": result})

    def _notice_exits(self, now: float, selector: selectors.BaseSelector) -> None:
        for entry in self._ranks:
            if entry.exit_status is not None:
                continue
            status = entry.proc.exit_status()
            if status is None:
                continue
            # Take what it wrote before dying: its error report names the real cause.
            if not entry.eof:
                self._read(entry, selector)
            entry.exit_status = status
            if not (entry.done and status == 0):
                self._blame.exited(now, entry, status)

    def _notice_zygote_lost(self, now: float) -> None:
        session = self._starter.session
        running = [e for e in self._ranks if isinstance(e.proc, ForkedRank) and not e.done]
        if session is not None and session.lost and running:
            self._blame.zygote_lost(now, min((e.phase for e in running), key=PHASES.index))

    def _abort_requested(self) -> ProbeFailure | None:
        if self.abort is None:
            return None
        reason = self.abort()
        if reason is None:
            return None
        phase = min((entry.phase for entry in self._ranks), key=PHASES.index, default="spawn")
        return ProbeFailure(
            phase=phase,
            rank=None,
            cause="cancelled",
            detail=f"stopped by netmon: {reason}",
            cancel_reason=reason,
        )

    # ---- teardown ----

    def _alive(self) -> list[RankProcess]:
        return [e for e in self._ranks if not e.reaped and e.proc.exit_status() is None]

    def _signal_groups(self, signum: int) -> None:
        for entry in self._ranks:
            if not entry.reaped and not orphan_gone(entry.proc):
                signal_group(entry.proc.pid, signum)

    def _terminate_all(self) -> None:
        if self._alive():
            self._signal_groups(signal.SIGTERM)
            self._signal_groups(signal.SIGCONT)
            deadline = time.monotonic() + TERM_GRACE_S
            while self._alive() and time.monotonic() < deadline:
                time.sleep(POLL_S)
        # Leaders are zombies or alive until reaped, so their group IDs cannot have been reused:
        # the KILL reaches only this probe's processes, including anything a rank started.
        self._signal_groups(signal.SIGKILL)
        for entry in self._ranks:
            for stream in (entry.proc.stdin, entry.proc.channel):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
            entry.proc.reap()
            entry.reaped = True
            entry.cpu.total_s = entry.proc.cpu_s()

    def _transports(self, workdir: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The transports NCCL logged, and how they contradict the intent; gloo is gloo."""
        if self.spec.backend != "nccl":
            return ("gloo",), ()
        return transport_faults.judge_logs(sorted(workdir.glob("nccl.rank*.log")), self.spec.intent)


def run_probe(spec: ProbeSpec, **kwargs: Any) -> ProbeOutcome:
    """Run one probe to completion or failure; never raises for what a rank does."""
    return Launcher(spec, **kwargs).run()
