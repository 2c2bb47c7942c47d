"""`netmon serve` as the benchmarks run it: a tagged daemon on a loopback port, read from /proc.

The tag is an environment variable every rank the daemon starts inherits, so that whatever is
left after the daemon's exit can be found and killed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import yaml

HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
HTTP_TIMEOUT_S = 10.0
# A mapping whose file name starts with one of these means torch, CUDA or NCCL is in the process.
FORBIDDEN_LIBS = ("libtorch", "libc10", "libcuda", "libnccl")
TORCH_DIR = f"{os.sep}torch{os.sep}"
TAG_VARIABLE = "DAEMON_BENCH_TAG"

_LISTENING = re.compile(r"listen=http://127\.0\.0\.1:(\d+)/metrics")
PROBE_OK = re.compile(r"probe ok .*?probe=(\w+).*?wall_s=([0-9.]+)")
PROBE_FAILED = re.compile(r"probe failed .*?probe=(\w+).*?reason=(\w+)")


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile (KiB) and Threads of a process."""
    wanted = {"VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads"}
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in wanted:
            fields[key] = int(value.split()[0])
    return fields


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def forbidden_mappings(pid: int) -> list[str]:
    """Mapped files of the process that belong to torch, CUDA or NCCL."""
    found = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        if os.path.basename(path).startswith(FORBIDDEN_LIBS) or TORCH_DIR in path:
            found.add(path)
    return sorted(found)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tagged_processes(tag: str) -> list[int]:
    """Processes that inherited our tag: the daemon and every rank it started."""
    marker = f"{TAG_VARIABLE}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "environ").read_bytes():
                found.append(int(entry.name))
    return found


class Daemon:
    """`python -m netmon serve` on a free loopback port, with a tag its ranks inherit."""

    def __init__(
        self, workdir: Path, config: dict[str, Any], python_path: str | None = None
    ) -> None:
        """`python_path`: another checkout's root, whose netmon the daemon (and its ranks) run."""
        self.config_path = workdir / "daemon.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "daemon.log"
        self.tag = uuid.uuid4().hex
        # No stray NETMON_* override may change the schedule under test.
        env = {k: v for k, v in os.environ.items() if not k.startswith("NETMON_")}
        env[TAG_VARIABLE] = self.tag
        if python_path is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [python_path, env.get("PYTHONPATH")]))
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "netmon", "serve", "--config", str(self.config_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=workdir,
            )
        try:
            self.port = self._wait_for_port()
        except BaseException:
            self.kill_leftovers()
            raise

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_for_port(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.log()[-1500:]}")
            match = _LISTENING.search(self.log())
            if match:
                return int(match.group(1))
            time.sleep(0.05)
        raise RuntimeError(f"the daemon did not listen within {START_TIMEOUT_S:g} s")

    def get(self, path: str = "/metrics") -> bytes:
        url = f"http://{HOST}:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            body: bytes = response.read()
        return body

    def stop(self) -> tuple[int | None, float]:
        """SIGTERM, then the exit code and how long the exit took (None: it had to be killed)."""
        start = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        return code, time.monotonic() - start

    def kill_leftovers(self) -> list[int]:
        """SIGKILL anything still carrying our tag (there should be nothing); the PIDs found."""
        leftovers = tagged_processes(self.tag)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        return leftovers
