"""The rank zygote: ranks forked from one process that imported torch once, with the isolation of
spawned ranks (their own session, their own environment, killed and reaped by the launcher), the
fallbacks to spawning, and a zygote killed under a probe."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from netmon.probe.forking import Zygote, early_variable
from netmon.probe.launcher import Launcher
from netmon.probe.processes import children_of, process_state
from netmon.probe.spec import ProbeOutcome, ProbeSpec
from netmon.probe.starting import base_env
from netmon.probe.zygote import anonymous_spans, mapped_cuda_driver
from tests.daemon_harness import DaemonProcess, fast_config, series, wait_until

SMALL = ProbeSpec(backend="gloo", ranks=2, op="all_reduce", sizes=(8, 1024), iters=5, warmup=1)
LONG = ProbeSpec(
    backend="gloo", ranks=2, op="all_reduce", sizes=(16 << 20,), iters=500, warmup=1, timeout=60
)


def new_zygote(made: list[Zygote], python: str = sys.executable) -> Zygote:
    """Made in the test itself: pytest's PYTEST_CURRENT_TEST differs between a fixture's setup
    and the test, and a rank whose environment differs from the zygote's is spawned."""
    made.append(Zygote(python, base_env()))
    return made[-1]


def _stat(pid: int) -> tuple[int, int, int]:
    """(parent, process group, session) of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[2]), int(fields[3])


def _gone(pids: list[int]) -> bool:
    return all(process_state(pid) in (None, "Z") for pid in pids)


def test_ranks_are_forked_in_their_own_sessions_and_nothing_is_left(zygotes: list[Zygote]) -> None:
    zygote = new_zygote(zygotes)
    seen: dict[int, tuple[int, int, int]] = {}

    def on_event(kind: str, fields: dict[str, Any]) -> None:
        if kind == "hello":
            seen[fields["rank"]] = _stat(int(fields["pid"]))

    first = Launcher(SMALL, zygote=zygote, on_event=on_event).run()
    assert first.ok, first.failure
    assert (first.ranks_forked, first.ranks_spawned, first.fork_fallback) == (2, 0, None)
    assert [r.size_bytes for r in first.results] == [8, 1024]
    assert zygote.pid is not None
    assert sorted(seen) == [0, 1]
    for rank, (parent, group, session) in seen.items():
        assert parent == zygote.pid, rank
        assert group == session != _stat(zygote.pid)[2]  # a session of its own, as it leads
    # Reaped by the zygote when the launcher asked: no child, zombie or not, is left to it.
    assert children_of(zygote.pid) == []
    second = Launcher(SMALL, zygote=zygote).run()
    assert second.ok and second.ranks_forked == 2
    assert zygote.starts == 1  # one torch import for both probes


def test_a_forked_rank_runs_with_its_own_environment(zygotes: list[Zygote]) -> None:
    zygote = new_zygote(zygotes)
    """The zygote runs with CUDA_VISIBLE_DEVICES empty; each rank reports the one its launcher
    gave it, set before the worker started (gloo ranks do not open the device)."""

    class Pinned(Launcher):
        def _rank_env(self, rank: int) -> dict[str, str]:
            return {**super()._rank_env(rank), "CUDA_VISIBLE_DEVICES": f"GPU-fake-{rank}"}

    for reporter in (0, 1):
        spec = SMALL.model_copy(update={"reporters": (reporter,)})
        outcome = Pinned(spec, zygote=zygote).run()
        assert outcome.ok and outcome.ranks_forked == 2
        assert outcome.environment is not None
        assert outcome.environment.devices == (f"GPU-fake-{reporter}",)
    assert zygote.env["CUDA_VISIBLE_DEVICES"] == ""
    assert outcome.startup_s is not None and outcome.init_s is not None
    assert 0 < outcome.startup_s < outcome.wall_s


def test_what_must_be_spawned_is_spawned_and_counted(zygotes: list[Zygote], tmp_path: Path) -> None:
    zygote = new_zygote(zygotes)
    # A variable that `import torch` may read: not forkable.
    assert early_variable({"A": "1"}, {"A": "1", "NCCL_ALGO": "Ring"}) is None
    assert early_variable({"A": "1"}, {"A": "2", "NCCL_ALGO": "Ring"}) == "A"
    assert early_variable({"TORCH_CPP_LOG_LEVEL": "INFO"}, {}) == "TORCH_CPP_LOG_LEVEL"
    early = Launcher(SMALL, zygote=zygote, extra_env={"PYTHONHASHSEED": "7"}).run()
    assert early.ok and (early.ranks_spawned, early.fork_fallback) == (2, "environment")
    # A wrapper must exec the interpreter itself.
    wrapped_spec = SMALL.model_copy(update={"wrappers": ((1, ("env",)),)})
    wrapped = Launcher(wrapped_spec, zygote=zygote).run()
    assert wrapped.ok
    assert (wrapped.ranks_forked, wrapped.ranks_spawned, wrapped.fork_fallback) == (1, 1, "wrapper")
    # Another interpreter than the zygote's.
    other = tmp_path / "python"
    other.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    other.chmod(0o755)
    moved = Launcher(SMALL, zygote=zygote, python=str(other)).run()
    assert moved.ok and (moved.ranks_spawned, moved.fork_fallback) == (2, "python")


def test_a_zygote_that_cannot_start_leaves_the_ranks_spawned(tmp_path: Path) -> None:
    """An interpreter that runs ranks but dies as a zygote: every probe still runs, spawned, and
    the start is not retried at every probe."""
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\ncase "$2" in netmon.probe.zygote) exit 3;; esac\nexec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    broken = Zygote(str(python), base_env())
    try:
        for _ in range(2):
            outcome = Launcher(SMALL, zygote=broken, python=str(python)).run()
            assert outcome.ok, outcome.failure
            assert (outcome.ranks_spawned, outcome.fork_fallback) == (2, "unavailable")
        assert broken.starts == 0 and broken.pid is None
    finally:
        broken.close()


@pytest.mark.parametrize("how", ["close", "cancel"])
def test_stopping_a_zygote_while_it_starts_does_not_wait_for_its_import(
    tmp_path: Path, how: str
) -> None:
    """A daemon told to stop while its zygote still imports torch (on a slow disk that can take
    minutes) stops at once: the start is cut short, by close() or by the daemon's stop event,
    and the zygote being started is killed."""
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\ncase "$2" in netmon.probe.zygote) exec sleep 60;; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    stop = threading.Event()
    slow = Zygote(str(python), base_env(), cancel=stop)
    opened: list[Any] = []
    starter = threading.Thread(target=lambda: opened.append(slow.session()))
    starter.start()
    wait_until(lambda: slow.pid is not None, 10, "the zygote's start under way")
    starting = slow.pid
    assert starting is not None
    began = time.monotonic()
    if how == "close":
        slow.close()
    else:
        stop.set()
    starter.join(10)
    took = time.monotonic() - began
    try:
        assert not starter.is_alive() and opened == [None]
        assert took < 3.0, f"the start went on for {took:.1f} s after the stop"
        assert process_state(starting) is None  # killed and reaped, not left to its sleep
        assert slow.starts == 0 and slow.session() is None  # and none started after it
    finally:
        slow.close()


def test_a_zygote_refuses_to_fork_once_cuda_is_initialised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Made to believe CUDA is initialised in it (no GPU here), the zygote forks nothing and
    the ranks are spawned: a fork after CUDA's initialisation would hand ranks a broken CUDA.
    (The spawned gloo ranks believe it too, and never touch CUDA.)"""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import torch\ntorch.cuda.is_initialized = lambda: True\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    assert_refused_and_said(caplog, "CUDA is initialised in the zygote")


# Lines of /proc/PID/maps: torch's CUDA libraries are mapped in any CUDA build, the driver
# (libcuda.so.1, a link to the versioned file) only once something loaded it.
MAPS_WITHOUT_DRIVER = """\
7f2a1c000000-7f2a1c200000 r-xp 00000000 08:01 1049 /opt/venv/lib/nvidia/lib/libcudart.so.12
7f2a1d000000-7f2a1d400000 r--p 00000000 08:01 1050 /opt/venv/lib/torch/lib/libtorch_cuda.so
7f2a1e000000-7f2a1e021000 rw-p 00000000 00:00 0
7ffd5b1f0000-7ffd5b211000 rw-p 00000000 00:00 0                          [stack]
"""
DRIVER = "/usr/lib/x86_64-linux-gnu/libcuda.so.535.129.03"


def test_the_cuda_driver_is_found_among_the_mapped_files() -> None:
    assert mapped_cuda_driver(MAPS_WITHOUT_DRIVER) is None
    assert mapped_cuda_driver("") is None
    loaded = MAPS_WITHOUT_DRIVER + f"7f2a20000000-7f2a21000000 r-xp 00000000 08:01 77 {DRIVER}\n"
    assert mapped_cuda_driver(loaded) == DRIVER
    # A path with spaces, and a library replaced on disk since it was loaded, are still paths.
    odd = "7f2a20000000-7f2a21000000 r-xp 00000000 08:01 77 /drivers/v 535/libcuda.so.1 (deleted)"
    assert mapped_cuda_driver(odd) == "/drivers/v 535/libcuda.so.1 (deleted)"


def test_a_zygote_with_the_cuda_driver_loaded_refuses_to_fork_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """torch.cuda.is_available() loads and initialises the CUDA driver (cuInit) without
    torch.cuda.is_initialized() saying so: the zygote looks for the driver library among its
    mappings before every fork. A real shared object named libcuda.so.1 (empty: no GPU here),
    preloaded into the zygote and its ranks alike, is mapped as the driver would be."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build a stand-in libcuda.so.1")
    (tmp_path / "empty.c").write_text("")
    driver = tmp_path / "libcuda.so.1"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-o", str(driver), str(tmp_path / "empty.c")],
        check=True,
        timeout=60,
    )
    monkeypatch.setenv("LD_PRELOAD", str(driver))
    assert_refused_and_said(caplog, f"the CUDA driver is loaded in the zygote ({driver})")


def _environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in entries if b"=" in e)


def test_the_zygote_asks_nvml_and_not_the_driver_whether_cuda_is_there(
    zygotes: list[Zygote],
) -> None:
    """Without PYTORCH_NVML_BASED_CUDA_CHECK=1, torch.cuda.is_available() and device_count()
    initialise the driver to answer. It is the zygote's own: not part of what a rank's
    environment is held against (zygote.env), so ranks still fork."""
    zygote = new_zygote(zygotes)
    outcome = Launcher(SMALL, zygote=zygote).run()
    assert outcome.ok, outcome.failure
    assert (outcome.ranks_forked, outcome.fork_fallback) == (2, None)
    assert zygote.pid is not None
    assert _environ(zygote.pid)["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
    assert "PYTORCH_NVML_BASED_CUDA_CHECK" not in zygote.env


def test_an_operators_thread_settings_do_not_stop_the_zygote_forking(
    zygotes: list[Zygote], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With more than one OpenMP thread in netmon's environment, loading torch's libraries would
    leave the zygote a second thread (OpenBLAS starts its pool when loaded), and a process with
    two threads must not fork: the zygote imports with one, each rank gets its own setting."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    zygote = new_zygote(zygotes)
    outcome = Launcher(SMALL, zygote=zygote).run()
    assert outcome.ok, outcome.failure
    assert (outcome.ranks_forked, outcome.ranks_spawned, outcome.fork_fallback) == (2, 0, None)
    assert zygote.pid is not None
    assert len(os.listdir(f"/proc/{zygote.pid}/task")) == 1


def test_a_zygote_killed_mid_probe_fails_it_by_name_and_the_next_run_works(
    zygotes: list[Zygote],
) -> None:
    zygote = new_zygote(zygotes)
    launcher = Launcher(LONG, zygote=zygote)
    done: list[ProbeOutcome] = []
    runner = threading.Thread(target=lambda: done.append(launcher.run()))
    runner.start()
    wait_until(
        lambda: (
            len(launcher.pids) == 2
            and all(process_state(p) not in (None, "Z") for p in launcher.pids)
        ),
        60,
        "both ranks forked",
    )
    first_zygote = zygote.pid
    assert first_zygote is not None
    os.kill(first_zygote, signal.SIGKILL)
    runner.join(60)
    assert not runner.is_alive()
    failure = done[0].failure
    assert failure is not None and failure.reason == "zygote_lost", failure
    assert "zygote" in failure.describe()
    wait_until(lambda: _gone(launcher.pids), 15, "the orphaned ranks to end")
    again = Launcher(SMALL, zygote=zygote).run()
    assert again.ok and again.ranks_forked == 2
    assert zygote.starts == 2 and zygote.pid not in (None, first_zygote)


def test_a_stopped_zygote_is_killed_and_the_probe_runs_spawned(zygotes: list[Zygote]) -> None:
    """A zygote that does not answer (SIGSTOP here; a wedged one alike) must not stall the
    probe: after the reply deadline it is killed, this probe's ranks are spawned, and the next
    probe forks again from a new zygote."""
    zygote = new_zygote(zygotes)
    zygote.reply_timeout_s = 2.0
    assert Launcher(SMALL, zygote=zygote).run().ranks_forked == 2
    stopped = zygote.pid
    assert stopped is not None
    os.kill(stopped, signal.SIGSTOP)
    began = time.monotonic()
    outcome = Launcher(SMALL, zygote=zygote).run()
    assert outcome.ok, outcome.failure
    assert (outcome.ranks_spawned, outcome.fork_fallback) == (2, "unavailable")
    assert time.monotonic() - began < 2.0 + 20  # the deadline, then a spawned probe
    # Killed: a zombie until the next session finds it dead and reaps it.
    wait_until(lambda: process_state(stopped) in (None, "Z"), 15, "the stopped zygote killed")
    again = Launcher(SMALL, zygote=zygote).run()
    assert again.ok and again.ranks_forked == 2
    assert zygote.starts == 2 and zygote.pid != stopped
    assert process_state(stopped) is None


def test_closing_the_zygote_ends_it_and_any_rank_it_has(zygotes: list[Zygote]) -> None:
    zygote = new_zygote(zygotes)
    launcher = Launcher(LONG, zygote=zygote)
    runner = threading.Thread(target=launcher.run)
    runner.start()
    wait_until(lambda: len(launcher.pids) == 2, 60, "both ranks forked")
    pid = zygote.pid
    assert pid is not None
    zygote.close()  # as a daemon's stop does, after its probes: here one is still running
    runner.join(60)
    assert not runner.is_alive()
    assert process_state(pid) is None
    wait_until(lambda: _gone(launcher.pids), 15, "its ranks to end")
    assert zygote.session() is None  # closed for good


# ---- in the daemon ----


def _zygote_of(daemon: DaemonProcess) -> int | None:
    for pid in daemon.tagged_processes():
        try:
            if b"netmon.probe.zygote" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def test_the_daemon_survives_its_zygote_and_counts_it(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    long = {"name": "long", "sizes": ["16M"], "interval": "3s", "iters": 100, "warmup": 1}
    daemon = DaemonProcess(tmp_path, fast_config(tmp_path, probes=[long]))
    daemons.append(daemon)
    wait_until(lambda: daemon.value("netmon_rank_starts_total", method="fork") == 2, 90, "forks")
    zygote = _zygote_of(daemon)
    assert zygote is not None
    wait_until(lambda: len(children_of(zygote)) == 2, 60, "the long probe's ranks")
    os.kill(zygote, signal.SIGKILL)

    def lost() -> float:
        failures = series(daemon.scrape(), "netmon_probe_failures_total")
        return sum(v for k, v in failures.items() if dict(k)["reason"] == "zygote_lost")

    wait_until(lambda: lost() == 1, 60, "the run to fail as zygote_lost")
    killed_at = time.time()
    wait_until(
        lambda: (
            (daemon.value("netmon_probe_last_success_timestamp_seconds", probe="long") or 0)
            > killed_at
        ),
        120,
        "a run after the kill to succeed",
    )
    assert daemon.value("netmon_zygote_starts_total") == 2
    # What the runs cost the CPUs, by phase: the reaper's exit figure too, for the ranks of the
    # run after the kill, which the new zygote reaped.
    for phase in ("start", "rendezvous", "init", "measure", "exit"):
        cpu = daemon.value("netmon_probe_rank_cpu_seconds_total", probe="long", phase=phase)
        assert cpu is not None and cpu > 0, phase
    assert daemon.value("netmon_probe_rank_cpu_seconds_total", probe="long", phase="check") == 0
    assert daemon.value("netmon_rank_starts_total", method="spawn") == 0
    assert daemon.value("netmon_rank_fork_fallbacks_total", reason="unavailable") == 0
    assert daemon.stop(timeout=15) == 0
    assert daemon.tagged_processes() == []
    assert "Traceback" not in daemon.log()


def assert_refused_and_said(caplog: pytest.LogCaptureFixture, said: str) -> None:
    """A probe through a zygote started now: its ranks spawned, as the zygote refused to fork
    them, and the reason logged."""
    zygote = Zygote(sys.executable, base_env())
    try:
        with caplog.at_level(logging.WARNING, logger="netmon.probe"):
            outcome = Launcher(SMALL, zygote=zygote).run()
        assert outcome.ok, outcome.failure
        assert (outcome.ranks_forked, outcome.ranks_spawned) == (0, 2)
        assert outcome.fork_fallback == "refused"
        assert zygote.pid is not None and children_of(zygote.pid) == []
        assert said in caplog.text
    finally:
        zygote.close()


MAPS = """\
55a0beef0000-55a0c453b000 rw-p 00000000 00:00 0                          [heap]
7f3c3312a000-7f3c35600000 rw-p 00000000 00:00 0
7f3c35600000-7f3c35601000 rw-p 00000000 00:00 0
7f3c521e5000-7f3c52485000 rw-p 00a00000 08:01 1234                       /usr/lib/libtorch_cpu.so
7f3c60000000-7f3c60400000 r--p 00000000 00:00 0
7f3c70000000-7f3c70400000 rw-s 00000000 00:01 99                         /dev/shm/x
7ffd00000000-7ffd00400000 rw-p 00000000 00:00 0                          [stack]
"""


def test_only_the_2_mib_aligned_parts_of_private_writable_anonymous_memory_are_collapsed() -> None:
    mib2 = 2 << 20
    assert anonymous_spans(MAPS) == [
        (0x55A0BF000000, 0x55A0C4400000),  # the heap, rounded inward to 2 MiB
        (0x7F3C33200000, 0x7F3C35600000),
    ]
    assert all(start % mib2 == 0 and end % mib2 == 0 for start, end in anonymous_spans(MAPS))


def _kernel_release() -> tuple[int, ...]:
    return tuple(int(part) for part in os.uname().release.split(".")[:2] if part.isdigit())


def _transparent_huge_pages_on() -> bool:
    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return setting.exists() and "[never]" not in setting.read_text()


def test_the_zygote_holds_torch_in_huge_pages_where_the_kernel_has_them(
    zygotes: list[Zygote],
) -> None:
    """Each fork copies, and each rank's exit drops, 512 times fewer page table entries; a
    kernel older than 6.1 keeps 4 KiB pages, and the ranks run as before."""
    zygote = new_zygote(zygotes)
    outcome = Launcher(SMALL, zygote=zygote).run()
    assert outcome.ok and outcome.ranks_forked == 2, outcome.failure
    assert zygote.pid is not None
    rollup = Path(f"/proc/{zygote.pid}/smaps_rollup").read_text()
    huge_kb = int(next(line.split()[1] for line in rollup.splitlines() if "AnonHugePages" in line))
    if _kernel_release() < (6, 1):
        assert huge_kb == 0, rollup  # no MADV_COLLAPSE: the zygote runs as before
    elif _transparent_huge_pages_on():
        assert huge_kb >= 32 << 10, rollup  # most of torch's 100+ MiB heap
    # What each phase cost the ranks, the reaper's figure included: exit is wait4's.
    assert {"start", "rendezvous", "init", "warmup", "measure", "teardown", "exit"} <= set(
        outcome.rank_cpu_s
    ), outcome.rank_cpu_s
    assert all(seconds >= 0 for seconds in outcome.rank_cpu_s.values())
