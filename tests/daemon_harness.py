"""Runs the real daemon as a subprocess on a free loopback port and scrapes it over HTTP."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_for

_SERVING = re.compile(r"listen\W+https?://127\.0\.0\.1:(\d+)/metrics")

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


class DaemonProcess:
    def __init__(
        self,
        tmp_path: Path,
        config: dict[str, Any],
        name: str = "netmon",
        netns: str | None = None,
    ) -> None:
        # In a network namespace the daemon runs under `ip netns exec`, and so do the scrapes.
        self.netns = netns
        prefix = ["ip", "netns", "exec", netns] if netns else []
        self.config_path = tmp_path / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = tmp_path / f"{name}.log"
        # Every process the daemon starts inherits this tag, so the test can find leftovers.
        self.tag = uuid.uuid4().hex
        env = {**os.environ, "NETMON_TEST_TAG": self.tag}
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
            fetch = (
                "import sys, urllib.request; "
                f"sys.stdout.write(urllib.request.urlopen({url!r}, timeout={timeout}).read()"
                ".decode())"
            )
            done = subprocess.run(
                ["ip", "netns", "exec", self.netns, sys.executable, "-c", fetch],
                capture_output=True,
                text=True,
                timeout=timeout + 10,
            )
            if done.returncode != 0:
                raise OSError(f"scrape in {self.netns} failed: {done.stderr.strip()[-300:]}")
            return done.stdout
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

    def stop(self, timeout: float = 15) -> int:
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
        for pid in [*self.tagged_processes(), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: value for (metric, labels), value in samples.items() if metric == name}


def wait_until(predicate: Any, timeout: float, what: str) -> Any:
    return wait_for(predicate, timeout, what, poll=0.2)
