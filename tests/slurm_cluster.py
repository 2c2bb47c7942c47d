"""A real Slurm cluster on this machine: slurmctld and one slurmd per node, each in its own
network namespace (tests.netns) with its own hostname, and a munged of its own.

    with SlurmCluster(nodes=3) as cluster:
        cluster.run(["srun", "-N3", "hostname"]).stdout   # n1, n2, n3

Layout: member 0 of a tests.netns.Namespaces is the controller `ctl` (10.<net>.0.10), members 1..N
are the nodes n1..nN (10.<net>.0.11, .12, ...). Everything else lives in one temp dir: slurm.conf,
cgroup.conf, an empty plugstack.conf, munge key and socket, state, spool, logs and pid files.
/etc/slurm, /etc/munge and any system munged are never used.

Facts found while building it (Debian slurm-wlm 22.05.8, munge 0.5.15, this 2-core machine):
- munged runs as root without `--force`, but refuses a socket whose directory, or any ancestor,
  is not executable by all ("Socket is inaccessible: execute permissions for all required"), so
  the temp dir is made with tempfile under /tmp and chmod 0711: pytest's tmp_path sits under a
  0700 /tmp/pytest-of-root and cannot hold the socket. `munged -F` stays in the foreground, so its
  Popen is its pid. A pathname Unix socket is reachable from every network namespace.
- `AuthInfo=socket=...` points both the auth and the credential plugin at that munged.
- slurmd and slurmctld run with `-D` under `ip netns exec NS unshare --uts sh -c 'hostname ..;
  exec ..'`: every step execs, so the Popen pid is the daemon's. slurmctld forks `slurmscriptd`;
  slurmstepd is re-parented away from slurmd (to PID 1 here, which reaps it a little later), so
  it and the job's processes are found and killed by namespace. srun runs tasks by full path
  (/usr/bin/sleep), a batch script by the name it was given (sleep).
- Times: up (namespaces, munged, slurmctld answering, all nodes idle) 0.3-0.5 s for 3 nodes,
  ~0.6 s for 6; teardown ~0.4 s (3) to ~0.9 s (6). An srun starts at once; an sbatch job in
  ~0.8 s (see SchedulerParameters); a preemptor 0.1-1 s after submission.
- Preemption (PreemptMode=CANCEL): the victim shows JobState=PREEMPTED (squeue %T PREEMPTED, %t
  PR), Reason=None, ExitCode=0:15, listed with --states=all for MinJobAge. A preempted srun exits
  143 with `slurmstepd-n2: error: *** STEP 2.0 ON n2 CANCELLED AT <time> DUE TO PREEMPTION ***`,
  `srun: Job step aborted: Waiting up to 4 seconds for job step to finish.` and `srun: error:
  n2: task 0: Terminated`. An srun that must wait prints `srun: job N queued and waiting for
  resources` then `... has been allocated resources`.
- Node states (sinfo %t): `plnd` is an idle node that backfill planned for a pending job (up to
  1 s after that job is gone); `resume` of a drained node shows `idle*` (not answering) for ~1 s
  while slurmctld pings it. After kill_slurmd the node stays `idle` ~15 s, then `idle*`, then
  `down*` at ~28 s (SlurmdTimeout=10; 3 gives ~16 s); an srun sent to it fails after ~11 s with
  exit 233 and `Task launch for StepId=N.0 failed on node n3: Communication connection failure`.
  A restarted slurmd is idle again in ~0.1 s. After stop_slurmctld/start_slurmctld, slurmctld
  answers in ~0.1 s but lists every node `unk` until it has heard from them: ~4 s.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.conftest import wait_for
from tests.netns import Namespaces

CONTROLLER = "ctl"
SLURM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # the daemons are in /usr/sbin


class SlurmCluster:
    """A controller and `nodes` slurmd's, partitions `sweep` (tier 1, preemptable) and `batch`."""

    def __init__(
        self,
        nodes: int = 6,
        net: int = 236,
        settings: Mapping[str, str] | None = None,
        up_timeout: float = 30.0,
        topology: str | None = None,
    ) -> None:
        """`settings` override or add slurm.conf keys (e.g. {"SlurmdTimeout": "3"});
        `topology`: a topology.conf, with the topology/tree plugin to read it."""
        self.topology = topology
        self.node_names = [f"n{i}" for i in range(1, nodes + 1)]
        self.net = net
        self.settings = dict(settings or {})
        self.up_timeout = up_timeout
        self.dir = Path(tempfile.mkdtemp(prefix="netmon-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self.spaces: Namespaces | None = None
        self.munged: subprocess.Popen[bytes] | None = None
        self.slurmctld: subprocess.Popen[bytes] | None = None
        self.slurmd: dict[str, subprocess.Popen[bytes]] = {}
        self._pids: set[int] = set()  # every daemon pid ever started, checked gone at the end

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        labels = [CONTROLLER, *self.node_names]
        self.spaces = Namespaces(len(labels), net=self.net, labels=labels)
        self._write_files()
        self._start_munged()
        self.start_slurmctld()
        for node in self.node_names:
            self.start_slurmd(node)
        self.wait_idle(self.node_names, self.up_timeout)

    def stop(self) -> None:
        """Tear down whatever exists (also after a failed start), then assert that nothing of
        the cluster is left: no process in its namespaces, no daemon, no namespace, no dir."""
        if self.slurmctld is not None and self.slurmctld.poll() is None:
            # Courtesy only: every process is killed by namespace below anyway.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.run(["scancel", "--quiet", "--user=root"], timeout=5)
        survivors: dict[str, list[int]] = {}
        for node in self.node_names:
            survivors[node] = self._kill_namespace(node)
        self._terminate(self.slurmctld)
        survivors[CONTROLLER] = self._kill_namespace(CONTROLLER)  # and slurmscriptd, clients
        self._terminate(self.munged)
        if self.spaces is not None:
            self.spaces.remove()
        shutil.rmtree(self.dir, ignore_errors=True)
        self._assert_gone({name: pids for name, pids in survivors.items() if pids})

    # -- commands ----------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """os.environ for Slurm commands: our slurm.conf, and no SLURM_* inherited from a job
        the tests may themselves run in (srun would join that job's allocation)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = SLURM_PATH + os.pathsep + env.get("PATH", "")
        return env

    def run(
        self, argv: Sequence[str], ns: str = CONTROLLER, timeout: float = 30.0, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """`argv` inside namespace `ns` (ctl or a node), in the cluster's work dir (where
        sbatch's slurm-<id>.out files land)."""
        return subprocess.run(
            self._in(ns, argv),
            env=self.env(),
            cwd=self.dir / "work",
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def popen(
        self, argv: Sequence[str], ns: str = CONTROLLER, **kwargs: Any
    ) -> subprocess.Popen[str]:
        """A background command in `ns`; it is killed with the namespace at teardown."""
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        return subprocess.Popen(
            self._in(ns, argv), env=self.env(), cwd=self.dir / "work", text=True, **kwargs
        )

    def _in(self, ns: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(ns), *argv]

    # -- nodes and namespaces ----------------------------------------------------------------

    def _member(self, name: str) -> int:
        return 0 if name == CONTROLLER else self.node_names.index(name) + 1

    def _spaces(self) -> Namespaces:
        if self.spaces is None:
            raise RuntimeError("the cluster is not started")
        return self.spaces

    def namespace(self, name: str) -> str:
        """The network namespace of a node, or of `ctl`."""
        return self._spaces().names[self._member(name)]

    def address(self, name: str) -> str:
        return self._spaces().address(self._member(name))

    def shape(self, node: str, rate: str = "1gbit") -> None:
        """tbf on both ends of the node's veth: its link to every other node, both directions."""
        self._spaces().shape(self._member(node), rate)

    def unshape(self, node: str) -> None:
        self._spaces().unshape(self._member(node))

    def pids(self, name: str) -> list[int]:
        """Processes in the namespace of a node (slurmd, slurmstepd, job processes) or `ctl`."""
        return self._spaces().pids(self.namespace(name))

    # -- Slurm state -------------------------------------------------------------------------

    def node_states(self) -> dict[str, str]:
        """Node -> compact state (idle, alloc, mix, drain, down*, ...); {} if slurmctld is down.
        Each node is listed once per partition: the dict folds them."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10)
        if out.returncode != 0:
            return {}
        return dict(line.split() for line in out.stdout.splitlines() if line.strip())

    def idle_nodes(self) -> list[str]:
        """Nodes whose state is exactly `idle`: not `idle*` (not answering), not `plnd`."""
        states = self.node_states()
        return [node for node in self.node_names if states.get(node) == "idle"]

    def wait_idle(self, nodes: Sequence[str] | None = None, timeout: float = 30.0) -> None:
        wanted = set(self.node_names if nodes is None else nodes)
        try:
            wait_for(lambda: wanted <= set(self.idle_nodes()), timeout, f"{sorted(wanted)} idle")
        except AssertionError as error:
            raise AssertionError(f"{error}; states {self.node_states()}\n{self.logs()}") from None

    def job_state(self, job_id: str) -> str:
        """JobState of a job slurmctld still remembers (MinJobAge=300 s), '' if unknown."""
        out = self.run(["scontrol", "-o", "show", "job", job_id], timeout=10)
        found = re.search(r"\bJobState=(\S+)", out.stdout)
        return found.group(1) if found else ""

    def drain(self, node: str, reason: str) -> None:
        self._scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def resume(self, node: str, timeout: float = 10.0) -> None:
        """Undrain and wait until the node answers: slurmctld first marks a resumed node
        not-responding (`idle*`) and pings it, which takes about 1 s."""
        self._scontrol("update", f"NodeName={node}", "State=RESUME")

        def back() -> bool:
            state = self.node_states().get(node, "*")
            return not state.endswith("*") and not state.startswith("dr")

        wait_for(back, timeout, f"{node} to answer after resume", poll=0.1)

    def sbatch(self, *args: str) -> str:
        """Submit with `sbatch --parsable ARGS`; the job id."""
        out = self.run(["sbatch", "--parsable", *args], timeout=10)
        if out.returncode != 0:
            raise AssertionError(f"sbatch {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout.strip().split(";")[0]

    def cancel_all(self, timeout: float = 30.0) -> None:
        """scancel every job and wait until none is pending, running or completing and every
        node in service is idle again: a clean cluster for the next test."""
        self.run(["scancel", "--quiet", "--user=root"], timeout=10)

        def settled() -> bool:
            queue = self.run(["squeue", "-h", "-o", "%i"], timeout=10)
            states = self.node_states()
            return (
                queue.returncode == 0
                and not queue.stdout.strip()
                and all(s in ("idle", "drain") or s.startswith("down") for s in states.values())
            )

        wait_for(settled, timeout, "jobs to end and nodes to settle", poll=0.1)

    def _scontrol(self, *args: str) -> None:
        out = self.run(["scontrol", *args], timeout=10)
        if out.returncode != 0:
            raise AssertionError(f"scontrol {' '.join(args)}: {out.stderr.strip()}")

    def logs(self, lines: int = 15) -> str:
        """The last lines of every daemon log: what a failed wait shows."""
        parts = []
        for log in sorted((self.dir / "log").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    # -- daemons -----------------------------------------------------------------------------

    def start_slurmctld(self) -> None:
        """slurmctld as host `ctl` (it checks its hostname against SlurmctldHost); returns once
        it answers. State in StateSaveLocation survives a stop_slurmctld/start_slurmctld."""
        self.slurmctld = self._daemon(CONTROLLER, ["slurmctld", "-D"])
        wait_for(self._slurmctld_answers, self.up_timeout, "slurmctld to answer", poll=0.1)

    def _slurmctld_answers(self) -> bool:
        if not self.slurmctld_running():
            raise AssertionError(f"slurmctld is not running\n{self.logs()}")
        return self.run(["scontrol", "ping"], timeout=10).returncode == 0

    def slurmctld_running(self) -> bool:
        return self.slurmctld is not None and self.slurmctld.poll() is None

    def stop_slurmctld(self) -> None:
        """SIGTERM, as an admin's restart would: slurmctld saves its state first."""
        self._terminate(self.slurmctld)

    def start_slurmd(self, node: str) -> None:
        """slurmd as host `node`: it takes its NodeName from the hostname."""
        self.slurmd[node] = self._daemon(node, ["slurmd", "-D"])

    def kill_slurmd(self, node: str) -> None:
        """SIGKILL the node's slurmd only: its slurmstepd's and jobs keep running."""
        proc = self.slurmd[node]
        proc.kill()
        proc.wait(timeout=10)

    def restart_slurmd_if_dead(self, node: str) -> None:
        """Start the node's slurmd again after kill_slurmd; it answers within ~0.1 s."""
        if self.slurmd[node].poll() is not None:
            self.start_slurmd(node)

    def _daemon(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        # `ip netns exec`, `unshare` and `sh -c 'exec ..'` all exec: the pid is the daemon's.
        hostname = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name]
        stderr = (self.dir / "log" / f"{argv[0]}-{name}.stderr").open("ab")
        with stderr:
            proc = subprocess.Popen(
                self._in(name, [*hostname, *argv]),
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                cwd=self.dir,
            )
        self._pids.add(proc.pid)
        return proc

    def _start_munged(self) -> None:
        # A key of our own and a foreground munged on a socket in our dir (see the docstring).
        key = self.dir / "munge" / "munge.key"
        subprocess.run(
            ["mungekey", "-c", "-k", str(key)], env=self.env(), check=True, capture_output=True
        )
        socket = self.dir / "munge" / "munge.sock"
        argv = [
            "munged",
            "-F",
            f"--socket={socket}",
            f"--key-file={key}",
            f"--pid-file={self.dir / 'run' / 'munged.pid'}",
            f"--log-file={self.dir / 'log' / 'munged.log'}",
            f"--seed-file={self.dir / 'munge' / 'munged.seed'}",
        ]
        log = (self.dir / "log" / "munged.stderr").open("ab")
        with log:
            self.munged = subprocess.Popen(
                argv, env=self.env(), stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        self._pids.add(self.munged.pid)
        wait_for(lambda: self._munge_ready(socket), 10, "munged's socket", poll=0.02)

    def _munge_ready(self, socket: Path) -> bool:
        if self.munged is not None and self.munged.poll() is not None:
            raise AssertionError(f"munged exited\n{self.logs()}")
        return socket.is_socket()

    # -- teardown ----------------------------------------------------------------------------

    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes] | None) -> None:
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def _kill_namespace(self, name: str, timeout: float = 10.0) -> list[int]:
        """SIGKILL every process in the namespace until none is left (they may fork meanwhile)
        and reap the daemons we started; what still runs at the deadline."""
        if self.spaces is None:
            return []
        namespace = self.namespace(name)
        try:
            identity = os.stat(f"/run/netns/{namespace}")
        except FileNotFoundError:
            return []  # removed already: stop() twice
        deadline = time.monotonic() + timeout
        while (pids := self.spaces.pids(namespace)) and time.monotonic() < deadline:
            for pid in pids:
                _kill_if_in(pid, identity)
            self._reap()
            time.sleep(0.02)
        self._reap()
        return pids

    def _reap(self) -> None:
        for proc in [self.munged, self.slurmctld, *self.slurmd.values()]:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.01)

    def _assert_gone(self, survivors: dict[str, list[int]]) -> None:
        assert not survivors, f"processes survived SIGKILL in namespaces: {survivors}"
        alive = [pid for pid in self._pids if process_alive(pid)]
        assert not alive, f"cluster daemons still alive: {alive}"
        if self.spaces is not None:
            assert not self.spaces.existing(), f"namespaces left: {self.spaces.existing()}"
        assert not self.dir.exists(), f"{self.dir} left behind"

    # -- configuration -----------------------------------------------------------------------

    def _write_files(self) -> None:
        self.dir.chmod(0o711)  # munged: the socket's directory and its ancestors a+x
        for sub in (
            "munge",
            "state",
            "run",
            "log",
            "work",
            *(f"spool/{n}" for n in self.node_names),
        ):
            (self.dir / sub).mkdir(parents=True)
        (self.dir / "munge").chmod(0o711)
        (self.dir / "plugstack.conf").write_text("")  # not /etc/slurm/plugstack.conf's includes
        # Without it slurmd fails: "No filesystem mounted on /sys/fs/cgroup" (`ip netns exec`
        # mounts a fresh /sys, without the host's cgroup mounts); cgroup/v1 starts regardless.
        (self.dir / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n")
        if self.topology is not None:
            # slurmctld reads topology.conf beside slurm.conf (topology.conf(5)).
            (self.dir / "topology.conf").write_text(self.topology)
        self.conf.write_text(self._slurm_conf())

    def _slurm_conf(self) -> str:
        settings = {**self._settings(), **self.settings}
        if self.topology is not None:
            settings.setdefault("TopologyPlugin", "topology/tree")
        hardware = _hardware(self.env())
        nodes = ",".join(self.node_names)
        lines = [f"{key}={value}" for key, value in settings.items()]
        lines += [
            f"NodeName={node} NodeAddr={self.address(node)} {hardware} RealMemory=100 State=UNKNOWN"
            for node in self.node_names
        ]
        lines += [
            f"PartitionName=sweep Nodes={nodes} PriorityTier=1 PreemptMode=CANCEL Default=NO"
            " MaxTime=INFINITE State=UP",
            f"PartitionName=batch Nodes={nodes} PriorityTier=10 Default=YES MaxTime=INFINITE"
            " State=UP",
        ]
        return "\n".join(lines) + "\n"

    def _settings(self) -> dict[str, str]:
        d = self.dir
        return {
            "ClusterName": "netmontest",
            "SlurmctldHost": f"{CONTROLLER}({self.address(CONTROLLER)})",
            "AuthInfo": f"socket={d / 'munge' / 'munge.sock'}",
            "PlugStackConfig": str(d / "plugstack.conf"),
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "StateSaveLocation": str(d / "state"),
            "SlurmdSpoolDir": f"{d / 'spool'}/%n",
            "SlurmctldPidFile": str(d / "run" / "slurmctld.pid"),
            "SlurmctldLogFile": str(d / "log" / "slurmctld.log"),
            "SlurmdPidFile": f"{d / 'run'}/slurmd-%n.pid",
            "SlurmdLogFile": f"{d / 'log'}/slurmd-%n.log",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
            "MpiDefault": "none",
            "ReturnToService": "2",
            "SchedulerType": "sched/backfill",
            # srun allocates at once; an sbatch job waits for a scheduler pass: slurmctld's 1 s
            # background tick once batch_sched_delay (default 3 s) allows, or a backfill pass
            # (default every 30 s). Measured: sbatch start ~2.8 s -> ~0.8 s; a preemptor
            # starts 0.1-1 s after submission. Cost: backfill marks a node it planned for a
            # pending job `plnd` until its next pass, even when that job is gone (up to 1 s).
            "SchedulerParameters": "sched_interval=1,bf_interval=1,batch_sched_delay=0",
            "SlurmdTimeout": "10",
            "MessageTimeout": "10",
            "KillWait": "2",
            "MinJobAge": "300",
            "InactiveLimit": "0",
            "PreemptType": "preempt/partition_prio",
            "PreemptMode": "CANCEL",
            "ScronParameters": "enable",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "JobCompType": "jobcomp/none",
            "MailProg": "/bin/true",  # the default /bin/mail is not installed: an error line
        }


def _hardware(env: dict[str, str]) -> str:
    """This machine's CPU layout as slurmd itself reports it (`slurmd -C`): a node configured
    with more than it has would be drained as 'Low socket*core*thread count'."""
    out = subprocess.run(
        ["slurmd", "-C"], env=env, capture_output=True, text=True, check=True, timeout=30
    ).stdout
    keys = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
    fields = dict(field.split("=", 1) for field in out.split() if "=" in field)
    return " ".join(f"{key}={fields[key]}" for key in keys)


def _kill_if_in(pid: int, netns: os.stat_result) -> None:
    """SIGKILL `pid` if it is (still) in the network namespace `netns`: through a pidfd, so a
    pid that exited and was reused by another process after it was listed is never hit."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        current = os.stat(f"/proc/{pid}/ns/net")
        if (current.st_dev, current.st_ino) == (netns.st_dev, netns.st_ino):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass  # exited meanwhile
    finally:
        os.close(pidfd)


def process_alive(pid: int) -> bool:
    """True for a live process; a zombie (dead, not yet reaped by its parent) does not count."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
