"""A real Prometheus (Debian's package) started on a free loopback port, queried over its API."""

from __future__ import annotations

import json
import random
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import wait_for

_handed_out: set[int] = set()


def server_ready(proc: subprocess.Popen[bytes], log_path: Path, port: int, name: str) -> bool:
    """A Prometheus-family server on loopback answers /-/ready; its log if it died instead."""
    if proc.poll() is not None:
        raise AssertionError(f"{name} exited: {log_path.read_text()[-2000:]}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 15 s; reaped either way."""
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port() -> int:
    """A port free now, chosen below the kernel's ephemeral range: a port the kernel handed out
    could be given again to some connection's local end before the process under test binds it
    (seen in CI as EADDRINUSE on a group member port)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randint(10000, max(10001, low - 1))
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port between 10000 and {low}")


def require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.fail(
            f"{binary} is not installed: install Debian's prometheus package "
            "(scripts/test-deps does, which make test runs)"
        )
    return path


class Prometheus:
    def __init__(
        self,
        tmp_path: Path,
        targets: list[str],
        rule_files: tuple[Path, ...] = (),
        features: tuple[str, ...] = (),
    ) -> None:
        binary = require("prometheus")
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [{"job_name": "netmon", "static_configs": [{"targets": targets}]}],
        }
        config_path = tmp_path / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.log_path = tmp_path / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    *(f"--enable-feature={feature}" for feature in features),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(self._ready, 60, "prometheus to be ready", poll=0.2)

    def _ready(self) -> bool:
        return server_ready(self.proc, self.log_path, self.port, "prometheus")

    def query(self, expression: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expression}
        )
        with urllib.request.urlopen(url, timeout=10) as response:
            document = json.load(response)
        assert document["status"] == "success", document
        result: list[dict[str, Any]] = document["data"]["result"]
        return result

    def api(self, path: str, **params: str) -> Any:
        """The `data` of any GET endpoint under /api/v1/ (targets, targets/metadata...)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            document = json.load(response)
        assert document["status"] == "success", document
        return document["data"]

    def stop(self) -> None:
        stop_server(self.proc)
