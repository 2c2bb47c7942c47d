"""The sweep's scheduler on Slurm: sinfo for the idle nodes, one `srun` job per pair in a
low-priority preemptible partition (or QOS), squeue for how each job ended.

Each pair is its own job, not a step of one allocation: Slurm's preemption (PreemptMode=CANCEL)
cancels a whole job, so a sweep held as one allocation would lose every pair for one node a
user wants. `--exclusive` makes the pair hold its nodes whole, so a job that wants one of them
preempts it at once rather than sharing its cores. docs/SWEEPS.md has the setup.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from netmon.sweep.locate import classes
from netmon.sweep.locate.plan import PairPlan, SweepNode
from netmon.sweep.scheduler import PairRun, SchedulerError
from netmon.sweep.settings import SweepConfig
from netmon.sweep.slurm import srun_result

log = logging.getLogger(__name__)

# sinfo's compact states of a node a sweep may take: idle and responding (a suffix * is "not
# responding", ~ "powered off", # "powering up", ! "pending power down", % "powering down").
# `plnd` is idle too: backfill has planned it for a pending job's start, which on a busy queue
# is most idle nodes most of the time (a pending job wider than what is free plans them all);
# backfill still starts a short pair there when it ends before that start.
IDLE_STATES = frozenset({"idle", "plnd"})
FREE_STATES = frozenset({"idle", "comp", "plnd"})
SLURM_TIMEOUT_S = 20.0  # one sinfo/squeue/scancel call
TERM_GRACE_S = 5.0  # srun has this long after SIGTERM to cancel its job before SIGKILL
# What a round keeps of the sweep's deadline for after its pairs: srun's grace, one squeue and
# the scancel of what is left, so that the sweep ends by its deadline, controller or none.
TAIL_S = TERM_GRACE_S + 2 * 3.0
POLL_S = 0.5  # how often a round's pairs are looked at while they run
MAX_OUTPUT = 1 << 20  # of srun's stdout or stderr read back
_ACTIVE = "PENDING,RUNNING,CONFIGURING,COMPLETING,SUSPENDED,REQUEUED,RESIZING"


def _signal(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def _lists_switches(text: str) -> bool:
    """topology/tree's switches or topology/block's blocks."""
    lowered = text.lower()
    return "switchname=" in lowered or "blockname=" in lowered


def job_name(prefix: str, sweep: str, plan: PairPlan, index: int) -> str:
    return f"{prefix}-{sweep}-r{plan.round}-p{index}"


def _pair_jobs(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}-(\d{{13}}-[0-9a-f]{{6}})-r\d+-p\d+$")


def clean_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for srun: without the SLURM_ variables of a job the sweep itself runs in
    (scrontab), srun would start a step in that job instead of a job of its own."""
    return {k: v for k, v in environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


@dataclass
class _Launch:
    plan: PairPlan
    name: str
    process: subprocess.Popen[bytes]
    # srun's output goes to files, not pipes: waiting on one pair never stalls another's.
    output: IO[bytes]
    errors: IO[bytes]
    submitted_at: float
    clocks: srun_result.Deadlines
    late: srun_result.Late | None = None
    started: bool = False
    joined_at: float | None = None
    term_at: float | None = None

    def look(self, now: float) -> None:
        """Read the ranks' marks so far (pread: srun's own offset in the file is untouched)."""
        if self.joined_at is not None:
            return
        started, joined = srun_result.marks(
            os.pread(self.output.fileno(), MAX_OUTPUT, 0).decode(errors="replace")
        )
        self.started = started > 0
        if joined >= self.plan.rails * len(self.plan.nodes):
            self.joined_at = now

    def give_up(self, late: srun_result.Late, now: float) -> None:
        """SIGTERM: srun cancels its job (queued or running) on it."""
        self.late, self.term_at = late, now
        _signal(self.process, signal.SIGTERM)

    def text(self) -> tuple[str, str]:
        """What srun wrote: its stdout (the ranks' reports) and its stderr."""
        texts = []
        for file in (self.output, self.errors):
            file.seek(0)
            texts.append(file.read(MAX_OUTPUT).decode(errors="replace"))
            file.close()
        return texts[0], texts[1]


@dataclass
class SlurmScheduler:
    settings: SweepConfig
    sweep: str
    partition: str
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    addresses: dict[str, str] = field(default_factory=dict)
    gpus: dict[str, int] = field(default_factory=dict)  # each node's, from its gres
    cpus: dict[str, int] = field(default_factory=dict)  # each node's CPUs (sinfo %c)
    submitted: list[str] = field(default_factory=list)
    _deadline: float = float("inf")
    _live: list[_Launch] = field(default_factory=list)  # the round's sruns, while it runs

    def _tail_timeout(self) -> float:
        """A call after the pairs: bounded by what is left of the sweep's deadline."""
        return max(1.0, min(SLURM_TIMEOUT_S, self._deadline - time.time()))

    def _run(self, argv: Sequence[str], timeout: float = SLURM_TIMEOUT_S) -> str:
        try:
            done = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=timeout,
                env=clean_env(self.environ),
                check=False,
            )
        except FileNotFoundError:
            raise SchedulerError(f"{argv[0]} not found: install Slurm's clients") from None
        except subprocess.TimeoutExpired:
            raise SchedulerError(f"{argv[0]} did not answer in {timeout:.0f} s") from None
        if done.returncode != 0:
            message = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise SchedulerError(f"{argv[0]} failed: {message}")
        return done.stdout

    def nodes(self, partition: str, nodelist: str | None) -> list[SweepNode]:
        argv = ["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%t|%G|%o|%f|%c"]
        if nodelist:
            argv += ["-n", nodelist]
        seen: dict[str, SweepNode] = {}
        for line in self._run(argv).splitlines():
            fields = [*line.split("|"), "", "", "", "", ""]
            name, state, gres, address, features, cpus = fields[:6]
            if not name or state.strip() not in IDLE_STATES or name in seen:
                continue
            gpus = classes.gpus_of(gres)
            kind = classes.node_class(
                gpus, classes.gpu_types(gres), classes.slurm_features(features)
            )
            rails = self.settings.rails or max(gpus, 1)
            where = address.strip() or name
            seen[name] = SweepNode(name, rails=rails, address=where, kind=kind)
            self.addresses[name] = where
            self.gpus[name] = gpus
            self.cpus[name] = int(cpus) if cpus.strip().isdigit() else 0
        return list(seen.values())

    def backend(self, plan: PairPlan) -> str:
        """NCCL where every node of the pair has GPUs (sweep.backend: auto), else gloo: a
        CPU-only node in the partition no longer turns every pair into TCP."""
        return classes.backend_for(self.settings.backend, (self.gpus.get(n, 0) for n in plan.nodes))

    def taken(self, nodes: Sequence[str]) -> set[str]:
        if not nodes:
            return set()
        argv = ["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%t"]
        found: dict[str, str] = {}
        for line in self._run(argv, self._tail_timeout()).splitlines():
            name, _, state = line.partition("|")
            found[name.strip()] = state.strip()
        # Idle, completing (a pair's job ending) or planned for a pending job (the pair then
        # finds it busy): still a sweep's. Anything else, or gone from the list, is taken.
        return {n for n in nodes if found.get(n) not in FREE_STATES}

    def other_sweeps(self) -> list[str]:
        pattern = _pair_jobs(self.settings.job_name)
        listed = self._run(["squeue", "-h", "-t", _ACTIVE, "-o", "%i|%j"])
        others = []
        for line in listed.splitlines():
            job, _, name = line.partition("|")
            match = pattern.match(name.strip())
            if match and match.group(1) != self.sweep:
                others.append(f"{job.strip()} ({name.strip()})")
        return others

    def run_round(self, pairs: Sequence[PairPlan], deadline: float) -> list[PairRun]:
        self._deadline = deadline
        launches = [
            self._launch(plan, index, deadline - TAIL_S) for index, plan in enumerate(pairs)
        ]
        self._live = launches
        self._wait_all(launches)
        self._live = []
        states = self._states([launch.name for launch in launches])
        return [self._outcome(launch, states.get(launch.name)) for launch in launches]

    def _clocks(self, plan: PairPlan, hard: float) -> srun_result.Deadlines:
        launch = min(hard, time.time() + self.settings.launch_timeout)
        return srun_result.Deadlines(launch, self.settings.pair_timeout_for(plan.repeats), hard)

    def _launch(self, plan: PairPlan, index: int, hard: float) -> _Launch:
        name = job_name(self.settings.job_name, self.sweep, plan, index)
        self.submitted.append(name)
        clocks = self._clocks(plan, hard)
        argv = self._srun_argv(plan, name, clocks)
        env = clean_env(self.environ) | self._rank_env(plan, clocks)
        log.debug("sweep: %s", " ".join(argv))
        # Closed by _Launch.text() once the pair has ended.
        output, errors = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
        try:
            process = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=errors,
                start_new_session=True,
            )
        except OSError as exc:
            output.close()
            errors.close()
            raise SchedulerError(f"cannot start srun: {exc.strerror or exc}") from None
        return _Launch(plan, name, process, output, errors, time.time(), clocks)

    def _srun_argv(self, plan: PairPlan, name: str, clocks: srun_result.Deadlines) -> list[str]:
        # The job's own limit counts from its start: the ranks' meeting, then the run. The
        # shorter it is, the sooner backfill finds it a gap on a busy queue.
        minutes = max(1, math.ceil((self.settings.launch_timeout + clocks.run_s) / 60))
        argv = [
            "srun",
            f"--job-name={name}",
            f"--partition={self.partition}",
            f"--nodes={len(plan.nodes)}",
            f"--nodelist={','.join(plan.nodes)}",
            f"--ntasks-per-node={plan.rails}",
            "--exclusive",
            f"--time={minutes}",
            # No --immediate: only --immediate=1 reaches slurmctld as "immediate"; any other
            # value queues the job and srun cancels it at the end, and on a busy queue a pair
            # starts only at a backfill pass (bf_interval, 30 s by default). The launch
            # deadline (sweep.launch_timeout) gives it up instead.
            "--kill-on-bad-exit=1",
            "--quiet",
        ]
        if self.settings.qos:
            argv.append(f"--qos={self.settings.qos}")
        if self.settings.account:
            argv.append(f"--account={self.settings.account}")
        if self.backend(plan) == "nccl":
            argv.append(f"--gpus-per-node={plan.rails}")
            # Each rank's share of its node's cores (the rank binds to its GPU's CPUs among
            # them): one core per task leaves the spin-wait and NCCL's proxy on one core.
            cores = min((self.cpus.get(n, 0) for n in plan.nodes), default=0) // plan.rails
            if cores > 1:
                argv.append(f"--cpus-per-task={cores}")
        python = self.settings.rank_python or sys.executable
        return [*argv, python, "-m", "netmon.sweep.ranks.rank"]

    def _rank_env(self, plan: PairPlan, clocks: srun_result.Deadlines) -> dict[str, str]:
        s = self.settings
        nccl = self.backend(plan) == "nccl"
        nodes = ",".join(f"{n}={self.addresses.get(n, n)}" for n in plan.nodes)
        return {
            "NETMON_SWEEP_NODES": nodes,
            "NETMON_SWEEP_PORT": str(s.rendezvous_port),
            "NETMON_SWEEP_SIZE": str(s.nccl_size if nccl else s.size),
            "NETMON_SWEEP_WARMUP": str(s.warmup),
            "NETMON_SWEEP_ITERS": str((s.nccl_iters if nccl else s.iters) * plan.repeats),
            "NETMON_SWEEP_DEADLINE": f"{clocks.hard:.3f}",
            "NETMON_SWEEP_RUN_S": f"{s.launch_timeout + clocks.run_s:.3f}",
            "NETMON_SWEEP_BACKEND": self.backend(plan),
            "NETMON_SWEEP_NODE_CONFIG": str(s.node_config),
        }

    def _wait_all(self, launches: Sequence[_Launch]) -> None:
        """Every srun to its end. A pair is given up by its own clocks (srun_result.Deadlines):
        queued or not met by its launch deadline, or run past its run time; SIGTERM (srun
        cancels its job), one grace, then SIGKILL (the controller is gone and srun cannot
        cancel). The others go on meanwhile: no pair holds its round for another."""
        live = list(launches)
        while live:
            now = time.time()
            for launch in live:
                self._tend(launch, now)
            live = [launch for launch in live if launch.process.poll() is None]
            if live:
                time.sleep(POLL_S)

    @staticmethod
    def _tend(launch: _Launch, now: float) -> None:
        if launch.process.poll() is not None:
            return
        if launch.term_at is not None:
            if now - launch.term_at >= TERM_GRACE_S:
                _signal(launch.process, signal.SIGKILL)
                launch.process.wait()
            return
        launch.look(now)
        late = launch.clocks.late(now, launch.started, launch.joined_at)
        if late is not None:
            launch.give_up(late, now)

    def _states(self, names: Sequence[str]) -> dict[str, tuple[str, str]]:
        """{job name: (job id, state)} of the submitted jobs the controller still knows."""
        if not names:
            return {}
        argv = ["squeue", "-h", "-t", "all", "-n", ",".join(names), "-o", "%i|%j|%T"]
        try:
            listed = self._run(argv, self._tail_timeout())
        except SchedulerError as exc:
            log.warning("sweep: cannot ask how the pairs' jobs ended: %s", exc)
            return {}
        states: dict[str, tuple[str, str]] = {}
        for line in listed.splitlines():
            job, name, state = ([*line.split("|"), "", ""])[:3]
            states[name.strip()] = (job.strip(), state.strip())
        return states

    def _outcome(self, launch: _Launch, known: tuple[str, str] | None) -> PairRun:
        job, state = known if known is not None else (None, None)
        out, err = launch.text()
        found = srun_result.parse(out, launch.plan.rails)
        waited = (launch.term_at or time.time()) - launch.submitted_at
        outcome, detail = srun_result.classify(
            launch.process.returncode, state, err, found, launch.late, waited
        )
        return PairRun(
            plan=launch.plan,
            outcome=outcome,
            busbw=found.busbw if outcome == "ok" else (),
            detail=detail,
            job=job,
            submitted_at=launch.submitted_at,
            ranks_started_at=found.started_at,
            finished_at=time.time(),
        )

    def topology(self) -> str | None:
        """`scontrol show topology`: the switches of the topology/tree plugin; else the
        topology.conf beside slurm.conf (Debian's Slurm 22.05 scontrol answers "slurm_load_topo
        error: Insane message length" with exit 0 here); None when neither lists a switch.
        SchedulerError when the controller does not answer."""
        text = self._run(["scontrol", "show", "topology"])
        if _lists_switches(text):
            return text
        conf = Path(self.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
        try:
            text = conf.with_name("topology.conf").read_text()
        except OSError:
            return None
        return text if _lists_switches(text) else None

    def cleanup(self) -> None:
        """Cancel what this sweep submitted and is still queued or running: its sruns first
        (a sweep stopped mid-round by SIGTERM), then its jobs by id, in one call (a job ends
        on its own anyway: its ranks at their deadline, the job at its time limit)."""
        for launch in self._live:
            if launch.process.poll() is None:
                _signal(launch.process, signal.SIGTERM)
        if not self.submitted:
            return
        try:
            names = ",".join(self.submitted)
            listed = self._run(
                ["squeue", "-h", "-t", _ACTIVE, "-n", names, "-o", "%i"], self._tail_timeout()
            )
            jobs = [job.strip() for job in listed.splitlines() if job.strip()]
            if jobs:
                self._run(["scancel", "--quiet", *jobs], self._tail_timeout())
        except SchedulerError as exc:
            log.warning("sweep: cannot cancel the sweep's jobs: %s", exc)
        finally:
            self._reap()

    def _reap(self) -> None:
        """The sruns that cleanup signalled: waited for, killed after the grace."""
        for launch in self._live:
            try:
                launch.process.wait(timeout=TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                _signal(launch.process, signal.SIGKILL)
                launch.process.wait()
        self._live = []
