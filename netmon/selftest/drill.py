"""The preemption drill: a job starts on a GPU mid-probe, and the drill times how long netmon's
ranks outlive it. The probe runs through the real readiness decision and the real launcher; on gloo
a stand-in for NVML lists a real `sleep` process as the job (a simulation of the GPU case)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from netmon import sim
from netmon.config import NetmonConfig
from netmon.gpu.idle import GpuReading, IdleSource
from netmon.probe.forking import Zygote
from netmon.probe.launcher import Launcher
from netmon.probe.processes import running_as, start_time, stderr_tail
from netmon.probe.spec import ProbeOutcome, ProbeSpec
from netmon.probe.starting import base_env
from netmon.selftest.checks import Row, Status
from netmon.serve.current import CurrentConfig
from netmon.serve.readiness import DeviceLocks, Readiness, device_keys

GOAL_S = 1.5  # from the job's first moment on the GPU until every rank is gone
GIVE_UP_S = 15.0  # ranks still running this long after the job started: the drill failed
IDLE_WAIT_S = 10.0  # how long the drill waits for its GPUs to look idle
JOB_LIFE_S = 300  # the job sleeps at most this long, should the drill fail to kill it
POLL_S = 0.005

# Started between us and the job, and gone at once: the job must not be our child, since the
# readiness decision counts this process's descendants as netmon's own (own_of), and a real
# job never is one. The job gets a session of its own, so one kill reaches all of it.
_DETACH = (
    "import subprocess, sys\n"
    "job = subprocess.Popen(sys.argv[1:], start_new_session=True)\n"
    "print(job.pid, flush=True)\n"
)
# A CUDA job: a context on the one GPU it sees, a tensor in it, a line once both exist.
_CUDA_JOB = (
    "import sys, time, torch\n"
    "held = torch.ones(1 << 20, device='cuda')\n"
    "torch.cuda.synchronize()\n"
    "print('cuda context ready', flush=True)\n"
    "time.sleep(float(sys.argv[1]))\n"
)


@dataclass(frozen=True)
class JobCommand:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    says_ready: bool  # the clock starts at its first line, not when it is spawned
    ready_timeout: float = 180.0  # `import torch` and a CUDA context on a busy node


# The same job on a simulated node (`--simulate`): it opens its GPU as a rank there does, so the
# simulated NVML lists it on that GPU for as long as it runs.
_SIMULATED_JOB = (
    "import os, sys, time\n"
    "from netmon.sim.rank import open_gpu\n"
    "open_gpu(os.environ)\n"
    "print('cuda context ready', flush=True)\n"
    "time.sleep(float(sys.argv[1]))\n"
)


def cuda_job(gpu: str, python: str = sys.executable) -> JobCommand:
    """A process holding a CUDA context on `gpu` (a UUID, or an index in PCI bus order)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    script = _SIMULATED_JOB if sim.active() is not None else _CUDA_JOB
    return JobCommand((python, "-c", script, str(JOB_LIFE_S)), env, says_ready=True)


def sleep_job() -> JobCommand:
    return JobCommand(("sleep", str(JOB_LIFE_S)), dict(os.environ), says_ready=False)


class SimulatedGpu:
    """An idle source for CPU ranks: "GPU 0", idle until a job is placed on it, then running that
    job as a compute process, as NVML would list it."""

    def __init__(self) -> None:
        self._job: tuple[int, int] | None = None
        self._lock = threading.Lock()

    def place(self, pid: int, start: int) -> None:
        with self._lock:
            self._job = (pid, start)

    def read(self) -> list[GpuReading]:
        with self._lock:
            job = self._job
        pids = (job[0],) if job is not None and running_as(*job) else ()
        return [
            GpuReading(
                index=0,
                uuid="GPU-00000000-0000-0000-0000-000000000000",
                utilization=0.0,
                memory_used=0,
                compute_pids=pids,
            )
        ]


def _read_line(fd: int, buffer: bytearray, deadline: float) -> str | None:
    """The next line from a pipe, or None at its end or the deadline."""
    while b"\n" not in buffer:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line.decode(errors="replace").strip()


@dataclass
class _Job:
    """The job as started: its PID and start time, when it was ready, and its pipe."""

    pid: int = 0
    start: int = 0
    ready_at: float = 0.0
    stdout: Any = None
    stderr_path: Path | None = None

    def kill(self) -> None:
        if self.pid and running_as(self.pid, self.start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)  # its own session: the job and its children
        # Not our child: init reaps it; wait until it no longer runs.
        deadline = time.monotonic() + 5.0
        while self.pid and running_as(self.pid, self.start) and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.stdout is not None:
            self.stdout.close()
        if self.stderr_path is not None:
            self.stderr_path.unlink(missing_ok=True)


class DrillError(Exception):
    """The job could not be started or never said it was ready."""


def _start(command: JobCommand, job: _Job) -> None:
    handle, name = tempfile.mkstemp(prefix="netmon-drill-job-", suffix=".stderr")
    job.stderr_path = Path(name)
    try:
        with os.fdopen(handle, "wb") as stderr:
            detacher = subprocess.Popen(
                [sys.executable, "-c", _DETACH, *command.argv],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=dict(command.env),
                close_fds=True,
            )
    except OSError as exc:
        raise DrillError(f"the job could not be started: {exc}") from None
    job.stdout = detacher.stdout
    fd, buffer = detacher.stdout.fileno(), bytearray()  # type: ignore[union-attr]
    first = _read_line(fd, buffer, time.monotonic() + 30.0)
    try:
        detacher.wait(timeout=30.0)  # it exits once it has started the job
    except subprocess.TimeoutExpired:
        detacher.kill()
        detacher.wait()
        raise DrillError("the job's starter hung") from None
    if not first or not first.isdigit():
        raise DrillError(f"the job did not start: {stderr_tail(job.stderr_path)}")
    job.pid = int(first)
    job.start = start_time(job.pid) or 0
    if command.says_ready:
        line = _read_line(fd, buffer, time.monotonic() + command.ready_timeout)
        if line is None:
            raise DrillError(f"the job never said it was ready: {stderr_tail(job.stderr_path)}")
    job.ready_at = time.monotonic()


@dataclass
class _Measuring:
    """Which ranks have entered the measure phase (the launcher's events, from its thread)."""

    ranks: int
    seen: set[int] = field(default_factory=set)
    all_in: threading.Event = field(default_factory=threading.Event)

    def on_event(self, kind: str, event: dict[str, Any]) -> None:
        if kind == "phase" and event.get("phase") == "measure":
            self.seen.add(int(event["rank"]))
            if len(self.seen) >= self.ranks:
                self.all_in.set()


@dataclass(frozen=True)
class DrillResult:
    simulated: bool
    gpu: str
    seconds: float | None = None  # job ready -> every rank gone
    outcome: ProbeOutcome | None = None
    job_pid: int | None = None
    problem: str | None = None  # the drill could not be carried out (FAIL)
    skip: str | None = None  # the drill could not start here (SKIP)


def readiness_for(node: NetmonConfig, source: IdleSource) -> Readiness:
    """The daemon's own readiness decision over `source`, without a pause file: an operator who
    runs the selftest means it, even while the daemon is paused."""
    current = CurrentConfig(node.model_copy(update={"pause_file": None}))
    return Readiness(current, DeviceLocks(), source, threading.Event())


def _wait_gone(ranks: Mapping[int, int], deadline: float) -> float | None:
    while time.monotonic() < deadline:
        if not any(running_as(pid, start) for pid, start in ranks.items()):
            return time.monotonic()
        time.sleep(POLL_S)
    return None


def run_drill(
    spec: ProbeSpec,
    readiness: Readiness,
    watched: Sequence[str],
    command: JobCommand,
    stand_in: SimulatedGpu | None = None,
    zygote: Zygote | None = None,
) -> DrillResult:
    """Run `spec` once `readiness` finds `watched` idle, watching them as the daemon does; once
    every rank measures, start the job on the first of them and time until no rank runs.

    The ranks are forked by `zygote` (one of its own when none is given, started before the
    GPUs are claimed), as the daemon starts them: grandchildren of this process, which the
    readiness decision must still count as its own."""
    if zygote is None:
        with contextlib.closing(Zygote(sys.executable, base_env())) as own:
            warm = own.session()  # torch imported now, not while the GPUs are held
            if warm is not None:
                warm.close()
            return run_drill(spec, readiness, watched, command, stand_in, own)
    result = DrillResult(simulated=stand_in is not None, gpu=watched[0])
    # GPUs that ran the selftest's previous probe a moment ago may still show its utilization
    # (NVML averages over up to a second): ask again for a while before calling them busy.
    deadline = time.monotonic() + IDLE_WAIT_S
    while True:
        with readiness.claim(device_keys(spec), watched, lock_timeout=10.0) as decision:
            if decision.ready:
                return _drill(result, spec, readiness, watched, command, stand_in, zygote)
        if time.monotonic() >= deadline:
            return replace(result, skip=f"GPU not idle before the drill: {decision.detail}")
        time.sleep(1.0)


def _drill(
    result: DrillResult,
    spec: ProbeSpec,
    readiness: Readiness,
    watched: Sequence[str],
    command: JobCommand,
    stand_in: SimulatedGpu | None,
    zygote: Zygote,
) -> DrillResult:
    """The drill on claimed devices. The job is killed afterwards, always."""
    measuring = _Measuring(spec.ranks)
    launcher = Launcher(
        spec, abort=readiness.abort_check(watched), on_event=measuring.on_event, zygote=zygote
    )
    box: list[ProbeOutcome] = []
    runner = threading.Thread(target=lambda: box.append(launcher.run()), daemon=True)
    runner.start()
    job = _Job()
    try:
        if not _await_measure(measuring, runner, spec.timeout):
            outcome = _join(runner, box, readiness)
            return replace(result, outcome=outcome, problem="no measure phase to drill in")
        ranks = {pid: start_time(pid) or 0 for pid in launcher.pids}
        _start(command, job)
        if stand_in is not None:
            stand_in.place(job.pid, job.start)
        gone = _wait_gone(ranks, job.ready_at + GIVE_UP_S)
    except DrillError as exc:
        return replace(result, outcome=_join(runner, box, readiness), problem=str(exc))
    finally:
        job.kill()
    seconds = None if gone is None else gone - job.ready_at
    outcome = _join(runner, box, readiness)
    return replace(result, seconds=seconds, outcome=outcome, job_pid=job.pid)


def _await_measure(measuring: _Measuring, runner: threading.Thread, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while runner.is_alive() and time.monotonic() < deadline:
        if measuring.all_in.wait(0.05):
            return True
    return measuring.all_in.is_set()


def _join(
    runner: threading.Thread, box: list[ProbeOutcome], readiness: Readiness
) -> ProbeOutcome | None:
    runner.join(timeout=GIVE_UP_S)
    if runner.is_alive():
        readiness.stopping.set()  # the abort check then says "shutdown" at the next poll
        runner.join(timeout=GIVE_UP_S)
    return box[0] if box else None


def drill_row(result: DrillResult) -> Row:
    """PASS when the probe was stopped as preempted and its ranks were gone within GOAL_S."""
    name = "drill preemption" + (" (simulated)" if result.simulated else "")
    goal = f"<= {GOAL_S:g} s"
    if result.simulated:
        where = f"a sleep process (PID {result.job_pid}) that a stand-in for NVML lists on GPU "
    elif sim.active() is not None:
        where = f"a job (PID {result.job_pid}) that opened the simulated node's GPU "
    else:
        where = f"a CUDA job (PID {result.job_pid}) holding a context on GPU "
    where += result.gpu
    if result.skip is not None:
        return Row("drill", name, "SKIP", "", goal, result.skip)
    outcome = result.outcome
    failure = outcome.failure if outcome is not None else None
    if result.problem is not None:
        ended = f"; the probe: {failure.describe()}" if failure is not None else ""
        return Row("drill", name, "FAIL", "", goal, result.problem + ended)
    forked = outcome.ranks_forked if outcome is not None else 0
    figures = {
        "seconds": result.seconds,
        "goal_seconds": GOAL_S,
        "simulated": result.simulated,
        "job_pid": result.job_pid,
        "ranks_forked": forked,
    }
    if result.seconds is None:
        detail = f"ranks still running {GIVE_UP_S:g} s after {where} started"
        return Row("drill", name, "FAIL", f"> {GIVE_UP_S:g} s", goal, detail, figures)
    measured = f"{result.seconds:.2f} s"
    if failure is None or failure.cancel_reason != "preempted":
        how = failure.describe() if failure is not None else "it finished"
        detail = f"the ranks ended, but not as preempted: {how}"
        return Row("drill", name, "FAIL", measured, goal, detail, figures)
    status: Status = "PASS" if result.seconds <= GOAL_S else "FAIL"
    started = (
        f"{forked} ranks forked by the rank zygote"
        if forked
        else f"ranks spawned ({outcome.fork_fallback or 'no zygote'})"
        if outcome is not None
        else "no rank"
    )
    detail = f"stopped as preempted; timed from {where} until every rank was gone; {started}"
    return Row("drill", name, status, measured, goal, detail, figures)
