"""Runs the real daemon as a subprocess on a free loopback port and scrapes it over HTTP."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import struct
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_for

_SERVING = re.compile(r"listen\W+https?://(?:127\.0\.0\.1|0\.0\.0\.0):(\d+)/metrics")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def fast_config(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """A gloo configuration whose probes run every second or two with few samples."""
    config: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp_path / "state"),
        "backend": "gloo",
        "ranks": 2,
        "pause_file": str(tmp_path / "pause"),
        "pause_dir": str(tmp_path / "pause.d"),
        "probes": [
            {"name": "small", "sizes": [8, "1K"], "interval": "1s", "iters": 3, "warmup": 1},
            {
                "name": "large",
                "sizes": ["64K"],
                "interval": "2s",
                "iters": 3,
                "warmup": 1,
                "min_busbw": "1K",
            },
        ],
        "baseline": {"min_samples": 2, "window": 5},
    }
    config.update(overrides)
    return config


GROUP_SECRET = "netmon-test-group-secret-0123456789"


def secret_file(directory: Path, secret: str = GROUP_SECRET, name: str = "group.secret") -> str:
    """A group secret file as an operator would make it (owner-only), for `group.secret_file`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return str(path)


# Runs inside a network namespace and fetches the URLs it is sent, one per line; each answer is
# b"1" (or b"0" and the error) and a 4-byte length before the body.
_FETCHER = """
import struct, sys, urllib.request
for line in sys.stdin:
    url, timeout = line.split()
    try:
        body, ok = urllib.request.urlopen(url, timeout=float(timeout)).read(), b"1"
    except Exception as exc:
        body, ok = str(exc).encode(), b"0"
    sys.stdout.buffer.write(ok + struct.pack(">I", len(body)) + body)
    sys.stdout.buffer.flush()
"""


class NetnsFetcher:
    """One interpreter inside a network namespace that fetches URLs on request. Starting one per
    scrape costs about 50 ms of CPU; polled ten times a second that is most of a core, which
    the probes under test rightly count as other work and leave unjudged (docs/SIGNAL.md)."""

    def __init__(self, netns: str) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-c", _FETCHER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def get(self, url: str, timeout: float) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{url} {timeout}\n".encode())
        self.proc.stdin.flush()
        head = self.proc.stdout.read(5)
        if len(head) < 5:
            raise OSError(f"the fetcher in the namespace exited ({self.proc.poll()})")
        body = self.proc.stdout.read(struct.unpack(">I", head[1:])[0])
        if head[:1] != b"1":
            raise OSError(f"scrape failed: {body.decode(errors='replace')[-300:]}")
        return body.decode()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class DaemonProcess:
    def __init__(
        self,
        tmp_path: Path,
        config: dict[str, Any],
        name: str = "netmon",
        netns: str | None = None,
        hostname: str | None = None,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        # `args` go after `serve --config FILE` (--web-config WEB, say).
        # In a network namespace the daemon runs under `ip netns exec`, and so do the scrapes;
        # with `hostname`, in a UTS namespace of its own under that name (a Slurm node's).
        self.netns = netns
        self._fetcher: NetnsFetcher | None = None
        prefix = ["ip", "netns", "exec", netns] if netns else []
        if hostname:
            prefix += ["unshare", "--uts", "sh", "-c", f'hostname {hostname} && exec "$@"', "sh"]
        self.config_path = tmp_path / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = tmp_path / f"{name}.log"
        # Every process the daemon starts inherits this tag, so the test can find leftovers.
        self.tag = uuid.uuid4().hex
        env = {**os.environ, "NETMON_TEST_TAG": self.tag, **(env or {})}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    *prefix,
                    sys.executable,
                    "-m",
                    "netmon",
                    "serve",
                    "--config",
                    str(self.config_path),
                    *args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        try:
            self.port = int(wait_for(self._port, 60, "the daemon to listen"))
        except BaseException:
            self.kill_all()  # never leave a daemon running behind a failed start
            raise

    def _port(self) -> str | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited {self.proc.returncode}: {self.log()}")
        match = _SERVING.search(self.log())
        return match.group(1) if match else None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str = "/metrics", timeout: float = 10) -> str:
        url = f"http://127.0.0.1:{self.port}{path}"
        if self.netns:
            if self._fetcher is None:
                self._fetcher = NetnsFetcher(self.netns)
            return self._fetcher.get(url, timeout)
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body: bytes = response.read()
        return body.decode()

    def scrape(self) -> Samples:
        samples: Samples = {}
        for family in text_string_to_metric_families(self.get()):
            for sample in family.samples:
                samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return samples

    def value(self, name: str, **labels: str) -> float | None:
        return self.scrape().get((name, frozenset(labels.items())))

    def value_with(self, name: str, **labels: str) -> float | None:
        """A sample that has these labels and maybe more (a group round's `ranks` is its world
        size, which changes as members come and go); None when there is none."""
        wanted = set(labels.items())
        found = [v for (n, have), v in self.scrape().items() if n == name and wanted <= have]
        return found[0] if found else None

    def _close_fetcher(self) -> None:
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None

    def stop(self, timeout: float = 15) -> int:
        self._close_fetcher()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"daemon did not stop within {timeout} s") from None

    def tagged_processes(self) -> list[int]:
        found = []
        marker = f"NETMON_TEST_TAG={self.tag}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if marker in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def kill_all(self) -> None:
        self._close_fetcher()
        for pid in [*self.tagged_processes(), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: value for (metric, labels), value in samples.items() if metric == name}


def wait_until(predicate: Any, timeout: float, what: str) -> Any:
    return wait_for(predicate, timeout, what, poll=0.2)
