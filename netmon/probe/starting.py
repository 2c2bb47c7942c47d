"""How a rank process starts: forked by the rank zygote where it can be (netmon.probe.forking),
else spawned as a new interpreter, each in its own session. One RankStarter per probe: it holds
the probe's zygote session and the first reason any of its ranks had to be spawned.

Either way a rank gets the same descriptors: stdin from the launcher (the spec, the rendezvous
port), stdout and stderr into its stderr file, and its channel to the launcher, a pipe of its own
named by CHANNEL_FD. Its JSON lines never share stdout, where libraries write as they please (NCCL
logs there when its log has no file, fully buffered into a pipe, so flushed mid-line)."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import IO

import netmon
from netmon.probe import cpushare
from netmon.probe.forking import ForkedRank, Session, Zygote, ZygoteLost, early_variable
from netmon.probe.processes import CHANNEL_FD, RankHandle, SpawnedRank, process_state
from netmon.probe.spec import ProbeSpec


@functools.cache
def _package_root() -> str:
    return str(Path(netmon.__file__).resolve().parent.parent)


def base_env() -> dict[str, str]:
    """What every rank's environment starts from (and the rank zygote's): ours, with netmon
    importable and one intra-op thread (two ranks on a small host fight over intra-op threads;
    collectives do not need them)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_package_root(), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class RankStarter:
    def __init__(self, spec: ProbeSpec, python: str, zygote: Zygote | None) -> None:
        self.spec = spec
        self.python = python
        self.zygote = zygote
        self.session: Session | None = None
        self.fallback: str | None = None  # why a rank was spawned although a zygote was given

    def command(self, rank: int) -> list[str]:
        """A spawned rank's command line: its wrapper, then the worker."""
        return [*self.spec.wrapper_of(rank), self.python, "-m", "netmon.probe.worker"]

    def start(self, rank: int, env: dict[str, str], stderr: IO[bytes]) -> RankHandle:
        forked = self._fork(rank, env, stderr.fileno())
        return forked or self._spawn(rank, self._naming_own(env), stderr)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()

    def _spawn(self, rank: int, env: dict[str, str], stderr: IO[bytes]) -> RankHandle:
        channel_r, channel_w = os.pipe()
        try:
            proc = subprocess.Popen(
                self.command(rank),
                stdin=subprocess.PIPE,
                stdout=stderr,
                stderr=stderr,
                env={**env, CHANNEL_FD: str(channel_w)},
                start_new_session=True,
                close_fds=True,
                pass_fds=(channel_w,),  # the same number in the rank (and through its wrapper)
            )
        except BaseException:
            os.close(channel_r)
            raise
        finally:
            os.close(channel_w)
        return SpawnedRank(proc, os.fdopen(channel_r, "rb"))

    def _fork(self, rank: int, env: dict[str, str], stderr: int) -> RankHandle | None:
        """The rank forked by the zygote, or None (the reason noted) where it must be spawned."""
        if self.zygote is None:
            return None
        why = self._why_not_fork(rank, env)
        if why is None and self._open_session() is None:
            why = "unavailable"
        if why is not None:
            self.fallback = self.fallback or why
            return None
        assert self.session is not None
        stdin_r, stdin_w = os.pipe()
        channel_r, channel_w = os.pipe()
        try:
            # Named once the session is open: a first probe's session starts the zygote.
            pid = self.session.fork(self._naming_own(env), stdin_r, stderr, stderr, channel_w)
        except ZygoteLost:
            pid = "unavailable"
        finally:
            os.close(stdin_r)
            os.close(channel_w)
        if isinstance(pid, str):
            os.close(stdin_w)
            os.close(channel_r)
            if pid != "unavailable":
                self.zygote.refused(pid)
            self.fallback = self.fallback or ("refused" if pid != "unavailable" else pid)
            return None
        return ForkedRank(self.session, pid, os.fdopen(stdin_w, "wb"), os.fdopen(channel_r, "rb"))

    def _naming_own(self, env: dict[str, str]) -> dict[str, str]:
        """`env` naming netmon's own processes to the rank (cpushare.OWN_PIDS): this process,
        which launched it (the daemon, or `netmon probe`), and the rank zygote if one runs. Their
        CPU time while the rank measures is netmon's, not the other work that disturbs a result.
        A launcher names them only to the ranks it starts itself, on its own machine (a group
        round's other ranks hear of their own node's); and the value carries the boot_id and
        each process's start time, so a rank that a wrapper runs on another kernel or in another
        PID namespace counts none rather than a stranger's time."""
        zygote = self.zygote.pid if self.zygote is not None else None
        return {**env, cpushare.OWN_PIDS: cpushare.own_pids((os.getpid(), zygote))}

    def _why_not_fork(self, rank: int, env: dict[str, str]) -> str | None:
        assert self.zygote is not None
        if self.spec.wrapper_of(rank):
            return "wrapper"  # the wrapper must exec the interpreter itself
        if self.python != self.zygote.python:
            return "python"
        if early_variable(self.zygote.env, env) is not None:
            return "environment"  # it may be read by `import torch`, which the zygote did
        return None

    def _open_session(self) -> Session | None:
        if self.session is None and self.zygote is not None:
            self.session = self.zygote.session()
        return self.session


def orphan_gone(proc: RankHandle) -> bool:
    """A forked rank whose zygote died was reaped by init: its PID may already be another's."""
    return isinstance(proc, ForkedRank) and proc.session.lost and process_state(proc.pid) is None
