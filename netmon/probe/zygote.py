"""The rank zygote: one process that imports torch once and forks a fresh rank for each rank of
each probe, so a probe no longer pays a torch import per rank.

Run as `python -m netmon.probe.zygote FD` by netmon.probe.forking; FD is its end of a Unix
socketpair with its parent, its only channel (never a port). Over it the parent opens one session
per probe, a socketpair of its own; on a session it asks for ranks (each with its environment and
its stdin, stdout, stderr and channel to the launcher as descriptors), hears their exits, and asks
for each to be reaped once it has killed the rank's group. A rank is reaped only when asked, so
its PID (and process group) cannot be reused while its launcher may still signal it.

What a forked rank inherits is torch imported and nothing more: CUDA is never initialised here,
nor its driver library even loaded (both checked before a probe's first fork, refused otherwise),
the zygote has one thread, and the rank sets its whole environment before the worker starts, so
NCCL and the CUDA context start in the rank, after CUDA_VISIBLE_DEVICES. A closed session kills
and reaps what is left of it; a closed parent channel ends the zygote, killing every rank first.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gc
import json
import os
import selectors
import signal
import socket
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netmon.probe.processes import CHANNEL_FD

MESSAGE_BYTES = 1 << 20
MAX_FDS = 4  # a rank's stdin, stdout, stderr and channel to the launcher
EXIT_BOOTSTRAP = 70  # a forked rank that failed before the worker ran
# What the zygote runs with over the ranks' environment (netmon.probe.forking adds it; a rank's
# environment is its own). Unless PYTORCH_NVML_BASED_CUDA_CHECK is 1, torch.cuda.is_available()
# and device_count() initialise the CUDA driver to answer, which is_initialized() does not show
# (pytorch/pytorch#55643). One thread in each pool that loading torch may start: OpenBLAS starts
# its own when loaded (numpy's, sized by OPENBLAS_NUM_THREADS or else OMP_NUM_THREADS), and a
# zygote with a second thread must not fork. A rank applies its own OMP_NUM_THREADS after the fork.
OWN_ENV = {
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
DRIVER_LIBRARY = "libcuda.so"  # libcuda.so.1 links to the versioned file, which is what is mapped
HUGE_PAGE = 2 << 20
MADV_COLLAPSE = 25  # linux/mman.h; Python's mmap module does not name it


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], fds or [])


@dataclass
class _Child:
    reported: bool = False
    reap_wanted: bool = False


@dataclass
class _Session:
    sock: socket.socket
    children: dict[int, _Child] = field(default_factory=dict)
    # The zygote runs nothing between forks that could load CUDA or start a thread, so what
    # its first fork found holds for the probe's others (reading /proc/self/maps costs 1 ms).
    inheritance_checked: bool = False


class Zygote:
    def __init__(self, control: socket.socket, torch: Any) -> None:
        self.control = control
        self.torch = torch
        self.sessions: dict[int, _Session] = {}
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # SIGCHLD wakes the loop through this pipe; the handler itself does nothing.
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(control, selectors.EVENT_READ, "control")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")

    def serve(self) -> None:
        send(
            self.control,
            {"op": "ready", "pid": os.getpid(), "torch": self.torch.__version__},
        )
        while True:
            for key, _ in self.selector.select():
                if key.data == "control":
                    if not self._on_control():
                        self._shutdown()
                        return
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self.wake_r, 512):
                            pass
                else:
                    self._on_session(key.data)
            self._report_exits()

    # ---- the parent's channel ----

    def _on_control(self) -> bool:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.control, MESSAGE_BYTES, 1)
        except OSError:
            return False
        if not data:
            return False
        message = json.loads(data)
        if message.get("op") == "session" and len(fds) == 1:
            session = _Session(socket.socket(fileno=fds[0]))
            self.sessions[session.sock.fileno()] = session
            self.selector.register(session.sock, selectors.EVENT_READ, session)
        else:
            for fd in fds:
                os.close(fd)
        return True

    # ---- a probe's session ----

    def _on_session(self, session: _Session) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(session.sock, MESSAGE_BYTES, MAX_FDS)
        except OSError:
            data, fds = b"", []
        if not data:
            self._close(session)
            return
        message = json.loads(data)
        op = message.get("op")
        reply: dict[str, Any] | None
        if op == "fork":
            reply = self._fork(session, message, fds)
        elif op == "reap":
            reply = self._reap(session, int(message["pid"]))
        else:
            for fd in fds:
                os.close(fd)
            reply = {"op": "error", "detail": f"unknown request {op!r}"}
        if reply is not None:
            self._send(session, reply)

    def _send(self, session: _Session, message: dict[str, Any]) -> None:
        try:
            send(session.sock, message)
        except OSError:
            self._close(session)

    def _refusal(self) -> str | None:
        """Why a fork now would give a rank a broken inheritance, if it would."""
        # The driver first: whoever loaded it (is_available() without NVML, a library) may have
        # initialised it, and a child of a process with an initialised driver cannot use CUDA.
        driver = mapped_cuda_driver(Path("/proc/self/maps").read_text())
        if driver is not None:
            return f"the CUDA driver is loaded in the zygote ({driver})"
        if self.torch.cuda.is_initialized():
            return "CUDA is initialised in the zygote"
        threads = len(os.listdir("/proc/self/task"))
        if threads != 1:
            return f"the zygote has {threads} threads"
        return None

    def _fork(self, session: _Session, message: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        refusal = None if session.inheritance_checked else self._refusal()
        if len(fds) != MAX_FDS:
            refusal = f"a rank needs {MAX_FDS} descriptors"
        if refusal is not None:
            for fd in fds:
                os.close(fd)
            return {"op": "refused", "reason": refusal}
        session.inheritance_checked = True
        pid = os.fork()
        if pid == 0:
            self._become_rank(message, fds)  # never returns
        for fd in fds:
            os.close(fd)
        session.children[pid] = _Child()
        return {"op": "forked", "pid": pid}

    def _become_rank(self, message: dict[str, Any], fds: list[int]) -> None:
        code = EXIT_BOOTSTRAP
        try:
            os.setsid()  # its own session, as a spawned rank has: a kill of its group is exact
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.selector.close()
            for sock in (self.control, *(s.sock for s in self.sessions.values())):
                sock.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            # The channel above 0-2 first, where no dup2 below can overwrite it.
            channel = fcntl.fcntl(fds[3], fcntl.F_DUPFD_CLOEXEC, 3)
            for target, fd in enumerate(fds[:3]):
                os.dup2(fd, target)
            for fd in set(fds) - {0, 1, 2}:
                os.close(fd)
            # Its whole environment, before anything reads it: CUDA, NCCL and gloo read theirs
            # when the rank initialises them, which is after this.
            os.environ.clear()
            os.environ.update(message["env"])
            os.environ[CHANNEL_FD] = str(channel)
            sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
            sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
            sys.argv = ["netmon.probe.worker"]
            threads = os.environ.get("OMP_NUM_THREADS", "")
            if threads.isdigit() and int(threads) > 0:
                # OpenMP read its variable when torch was imported here: apply the rank's.
                self.torch.set_num_threads(int(threads))
            from netmon.probe import worker

            worker.main()  # ends the process itself
        except BaseException:
            with contextlib.suppress(BaseException):
                traceback.print_exc()
                sys.stderr.flush()
        os._exit(code)

    def _reap(self, session: _Session, pid: int) -> dict[str, Any] | None:
        child = session.children.get(pid)
        if child is None:
            return {"op": "reaped", "pid": pid}
        child.reap_wanted = True
        return self._reap_if_ended(session, pid)

    def _reap_if_ended(self, session: _Session, pid: int) -> dict[str, Any] | None:
        if _status(pid) is None:
            return None  # answered when it ends (SIGCHLD)
        # The rank's whole CPU time, its exit included: what no mark of its own can say.
        _, _, usage = os.wait4(pid, 0)
        del session.children[pid]
        return {"op": "reaped", "pid": pid, "cpu_s": round(usage.ru_utime + usage.ru_stime, 6)}

    def _report_exits(self) -> None:
        for session in list(self.sessions.values()):
            for pid, child in list(session.children.items()):
                if session.sock.fileno() < 0:
                    break  # closed on a failed send: its ranks are already gone
                status = _status(pid)
                if status is None:
                    continue
                if not child.reported:
                    child.reported = True
                    self._send(session, {"op": "exit", "pid": pid, "status": status})
                if child.reap_wanted and session.sock.fileno() >= 0:
                    reply = self._reap_if_ended(session, pid)
                    if reply is not None:
                        self._send(session, reply)

    def _close(self, session: _Session) -> None:
        """The launcher is done or gone: nothing of its probe may outlive it."""
        fileno = session.sock.fileno()
        if fileno in self.sessions:
            del self.sessions[fileno]
            self.selector.unregister(session.sock)
        session.sock.close()
        _kill_and_reap(session.children)
        session.children.clear()

    def _shutdown(self) -> None:
        for session in list(self.sessions.values()):
            self._close(session)


def mapped_cuda_driver(maps: str) -> str | None:
    """The CUDA driver library's path among a process's mappings (/proc/PID/maps), if there."""
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path
        if len(fields) == 6 and os.path.basename(fields[5]).startswith(DRIVER_LIBRARY):
            return fields[5]
    return None


def anonymous_spans(maps: str) -> list[tuple[int, int]]:
    """The 2 MiB-aligned parts of the writable anonymous mappings (the heap among them) in a
    process's /proc/PID/maps: what torch's import left in private memory."""
    spans = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path
        if len(fields) < 5 or "w" not in fields[1] or fields[1][3] != "p":
            continue
        if len(fields) == 6 and fields[5].strip() != "[heap]":
            continue  # a file's mapping, the stack, vdso...
        low, high = (int(part, 16) for part in fields[0].split("-"))
        start, end = -(-low // HUGE_PAGE) * HUGE_PAGE, high // HUGE_PAGE * HUGE_PAGE
        if end > start:
            spans.append((start, end))
    return spans


def collapse_into_huge_pages(spans: list[tuple[int, int]]) -> int:
    """Ask the kernel to back `spans` with 2 MiB pages (madvise MADV_COLLAPSE, Linux 6.1+), so
    that each fork copies, and each rank's exit drops, 512 times fewer page table entries: a
    small probe's ranks then cost the node about 15 ms less CPU a run (docs/BENCHMARKS.md). The
    bytes collapsed; 0 where the kernel cannot (older, or transparent huge pages off), which
    changes nothing but the cost. A rank's first write to a shared huge page splits it and
    copies 4 KiB, as before."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    collapsed = 0
    for start, end in spans:
        if madvise(start, end - start, MADV_COLLAPSE) == 0:
            collapsed += end - start
    return collapsed


def _status(pid: int) -> int | None:
    """A child's exit status without reaping it (>= 0 exit code, < 0 minus the signal)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return -int(signal.SIGKILL)
    if info is None or info.si_pid == 0:
        return None
    if info.si_code == os.CLD_EXITED:
        return int(info.si_status)
    return -int(info.si_status)


def _kill_and_reap(children: dict[int, _Child]) -> None:
    for pid in children:
        # Not reaped yet, so the group ID is still this rank's.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    for pid in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    # The only reason this process exists: pay these imports once, not once per rank.
    import torch
    import torch.distributed

    from netmon.probe import worker  # noqa: F401

    # Objects that exist now are never collected, so the ranks keep sharing their pages.
    gc.freeze()
    collapse_into_huge_pages(anonymous_spans(Path("/proc/self/maps").read_text()))
    try:
        Zygote(control, torch).serve()
    finally:
        os._exit(0)  # torch's atexit hooks are not needed here


if __name__ == "__main__":
    main()
