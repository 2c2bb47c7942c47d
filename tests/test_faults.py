"""Faults with real processes: the daemon keeps serving, counts what happened, and leaks nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from tests.daemon_harness import DaemonProcess, fast_config, secret_file, series, wait_until
from tests.prometheus_harness import free_port

LONG = {"name": "long", "sizes": ["16M"], "interval": "1h", "iters": 500, "warmup": 1}


def ranks_of(daemon: DaemonProcess) -> list[int]:
    return [pid for pid in daemon.tagged_processes() if pid != daemon.proc.pid]


def test_a_daemon_killed_mid_probe_leaves_no_rank_behind(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    temp = tmp_path / "tmp"  # the daemons' own temp dir: what a probe left is theirs alone
    temp.mkdir()
    env = {"TMPDIR": str(temp)}
    daemon = DaemonProcess(tmp_path, fast_config(tmp_path, probes=[LONG]), "first", env=env)
    daemons.append(daemon)
    wait_until(lambda: len(ranks_of(daemon)) >= 2, 60, "the long probe's ranks")
    orphans = ranks_of(daemon)
    os.kill(daemon.proc.pid, signal.SIGKILL)  # no cleanup of its own: the ranks must notice
    daemon.proc.wait()
    wait_until(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in orphans),
        15,
        "the orphaned ranks to exit",
    )
    left = [p.name for p in temp.iterdir() if p.name.startswith("netmon-probe-")]
    assert len(left) == 1, left  # the killed probe's stderr files and logs
    again = DaemonProcess(tmp_path, fast_config(tmp_path), "second", env=env)
    daemons.append(again)
    wait_until(
        lambda: (again.value("netmon_probe_runs_total", probe="small") or 0) >= 1,
        60,
        "the restarted daemon to probe",
    )
    assert again.stop() == 0
    # The next probe removed the directory whose lock died with the killed daemon.
    assert [p.name for p in temp.iterdir() if p.name.startswith("netmon-probe-")] == []


def test_a_stopped_rank_is_a_counted_timeout_and_scrapes_stay_fast(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    probe = {**LONG, "interval": "2s", "timeout": "8s"}
    daemon = DaemonProcess(tmp_path, fast_config(tmp_path, probes=[probe]))
    daemons.append(daemon)
    pids = wait_until(
        lambda: ranks_of(daemon) if len(ranks_of(daemon)) >= 2 else None, 60, "ranks to stop"
    )
    os.kill(pids[-1], signal.SIGSTOP)
    # Scrapes during a hung probe are answered promptly.
    slowest = 0.0
    deadline = time.monotonic() + 20

    def timeouts() -> float:
        failures = series(daemon.scrape(), "netmon_probe_failures_total")
        return sum(v for k, v in failures.items() if dict(k)["reason"].startswith("timeout_"))

    while timeouts() < 1:
        started = time.monotonic()
        assert daemon.get("/healthz").strip() == "ok"
        slowest = max(slowest, time.monotonic() - started)
        assert time.monotonic() < deadline, "the stopped rank was never counted"
        time.sleep(0.2)
    assert slowest < 2.0, slowest
    assert not Path(f"/proc/{pids[-1]}").exists() or _zombie(pids[-1]) is False
    assert daemon.stop() == 0
    assert daemon.tagged_processes() == []


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def test_an_unusable_state_dir_is_a_warning_not_a_crash(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the state directory should be\n")
    daemon = DaemonProcess(tmp_path, fast_config(tmp_path, state_dir=str(blocker / "state")))
    daemons.append(daemon)
    wait_until(
        lambda: (daemon.value("netmon_probe_runs_total", probe="small") or 0) >= 1,
        60,
        "a run without a state directory",
    )
    assert "state_dir" in daemon.log() and "warning" in daemon.log()
    assert daemon.stop() == 0


def test_a_full_state_filesystem_is_survived(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(full)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert mounted.returncode == 0, f"tmpfs mount (needs root): {mounted.stderr}"
    try:
        (full / "state").mkdir()
        # ENOSPC on the way: the filesystem ends up full, which is the point.
        with open(full / "filler", "wb") as filler, contextlib.suppress(OSError):
            filler.write(b"x" * (64 << 10))
        daemon = DaemonProcess(tmp_path, fast_config(tmp_path, state_dir=str(full / "state")))
        daemons.append(daemon)
        wait_until(lambda: "cannot save baselines" in daemon.log(), 60, "a failed state write")
        runs = daemon.value("netmon_probe_runs_total", probe="small") or 0
        wait_until(
            lambda: (daemon.value("netmon_probe_runs_total", probe="small") or 0) > runs,
            60,
            "probing to go on",
        )
        assert daemon.stop() == 0
    finally:
        for daemon in daemons:
            if daemon.proc.poll() is None:
                daemon.kill_all()
        subprocess.run(["umount", str(full)], capture_output=True, timeout=30)


class _SilentMember:
    """Accepts TCP connections on a port and never says a word: a hung group member."""

    def __init__(self) -> None:
        self.port = free_port()
        self.server = socket.create_server(("127.0.0.1", self.port))
        self.connections: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.connections.append(connection)

    def close(self) -> None:
        self.server.close()
        for connection in self.connections:
            connection.close()


def test_a_group_member_that_never_answers_makes_rounds_fail_fast(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    silent = _SilentMember()
    try:
        me = f"127.0.0.1:{free_port()}"
        # The silent member never answers a ping, so this daemon leads whatever the names.
        members = [me, f"127.0.0.1:{silent.port}"]
        config = fast_config(
            tmp_path,
            probes=[{"name": "cross", "scope": "group", "sizes": ["1K"], "interval": "1s"}],
            group={
                "name": "g",
                "members": members,
                "self": me,
                "heartbeat": "500ms",
                "ready_timeout": "2s",
                "secret_file": secret_file(tmp_path),
            },
        )
        daemon = DaemonProcess(tmp_path, config)
        daemons.append(daemon)
        wait_until(
            lambda: (
                (
                    daemon.value("netmon_probe_skips_total", probe="cross", reason="member_absent")
                    or 0
                )
                >= 2
            ),
            60,
            "rounds skipped for the silent member",
        )
        assert (
            daemon.value("netmon_group_member_up", group="g", member=f"127.0.0.1:{silent.port}")
            == 0.0
        )
        assert daemon.get("/healthz").strip() == "ok"
        assert daemon.stop() == 0
    finally:
        silent.close()
