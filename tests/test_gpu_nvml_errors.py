"""NVML errors as real nodes give them (issue 34): a driver that is not loaded, a container without
the permission to list processes, a GPU fallen off the bus, a process whose memory NVML cannot
say, a fabric still registering. Each is set per GPU and per call in the simulated node file and
drives the real commands, daemon and readers: one line naming the cause, the documented exit
code, a skip reason of its own in the daemon, and never a preempted or failed run."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from netmon.logs import PlainFormatter
from tests.gpu_node import SimNode, dgx_h100
from tests.test_gpu_node import skipped_daemon

FLAGS = ("--backend", "nccl", "--ranks", "2", "--sizes", "1M", "--iters", "2")
Edit = Callable[[dict[str, Any]], None]


def _node(tmp_path: Path, edit: Edit) -> SimNode:
    node = dgx_h100(tmp_path)
    edit(node.document)
    node.write()
    return node


def _gpu1(**fields: Any) -> Edit:
    return lambda document: document["gpus"][1].update(fields)


def _netmon(node: SimNode, command: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "netmon", command, "--simulate", str(node.path), *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _told(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("netmon: SIMULATED")]


def test_nvml_that_cannot_start_refuses_probe_and_selftest_in_one_line(tmp_path: Path) -> None:
    node = _node(tmp_path, lambda d: d.update(nvml_errors={"nvmlInit": "driver_not_loaded"}))
    for command, code in (("probe", 3), ("selftest", 3)):  # could not run here, both
        done = _netmon(node, command, *(FLAGS if command == "probe" else FLAGS[:-2]))
        assert done.returncode == code, (command, done.stderr)
        told = _told(done.stderr)
        assert len(told) == 1, (command, done.stderr)
        assert "Driver Not Loaded" in told[0] or "NVML sees none" in told[0], told
    assert node.opened() == []


def test_a_gpu_fallen_off_the_bus_fails_the_probe_in_one_line_naming_it(tmp_path: Path) -> None:
    node = _node(tmp_path, _gpu1(nvml_errors={"nvmlDeviceGetUUID": "gpu_is_lost"}))
    done = _netmon(node, "probe", *FLAGS)
    assert done.returncode == 3, done.stderr
    told = [line for line in _told(done.stderr) if line.startswith("netmon: probe")]
    assert len(told) == 1 and "fallen off the bus" in told[0], done.stderr
    assert node.uuid(1) in told[0]


DAEMON_CASES = [
    pytest.param(
        lambda d: d.update(nvml_errors={"nvmlInit": "driver_not_loaded"}),
        "nvml_error",
        id="driver not loaded",
    ),
    pytest.param(
        _gpu1(nvml_errors={"nvmlDeviceGetComputeRunningProcesses": "no_permission"}),
        "gpu_unknown",
        id="processes not permitted",
    ),
    pytest.param(
        _gpu1(nvml_errors={"nvmlDeviceGetUUID": "gpu_is_lost"}), "gpu_missing", id="GPU lost"
    ),
    pytest.param(
        _gpu1(nvml_errors={"nvmlDeviceGetHandleByIndex": "gpu_is_lost"}),
        "gpu_missing",
        id="GPU unopenable",
    ),
    pytest.param(
        lambda d: d["processes"].append(
            {"gpu": d["gpus"][1]["uuid"], "pid": 4242, "used_memory": None}
        ),
        "gpu_busy_process",
        id="a job whose memory NVML cannot say",
    ),
]


@pytest.mark.parametrize(("edit", "reason"), DAEMON_CASES)
def test_the_daemon_skips_with_the_reason_and_never_starts_a_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: Edit, reason: str
) -> None:
    node = _node(tmp_path, edit).activate(monkeypatch)
    probe = {"name": "small", "sizes": [8], "interval": "1s", "iters": 2, "warmup": 1}
    daemon = skipped_daemon(tmp_path, ["0", "1"], probe, reason)
    stats = daemon.results.snapshot().probes["small"]
    # A busy GPU is waited for until the next run is due (that one is `still_running`).
    assert set(stats.skips) <= {reason, "still_running"}, stats
    assert stats.failures == {} and stats.runs == 0, stats
    assert node.opened() == []


def test_a_fabric_still_registering_skips_the_nvls_path_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def registering(document: dict[str, Any]) -> None:
        for gpu in document["gpus"]:
            gpu["fabric"] = "in_progress"

    caplog.set_level(logging.INFO)
    node = _node(tmp_path, registering).activate(monkeypatch)
    probe = {
        "name": "small",
        "sizes": [8],
        "interval": "1s",
        "iters": 2,
        "warmup": 1,
        "paths": ["nvls"],
    }
    daemon = skipped_daemon(tmp_path, ["0", "1", "2", "3"], probe, "path_unsupported", 2)
    stats = daemon.results.snapshot().probes["small"]
    assert stats.failures == {} and stats.runs == 0, stats
    lines = [PlainFormatter().format(r) for r in caplog.records]
    said = [line for line in lines if "joining the NVLink fabric" in line]
    assert said and "in_progress" in said[0] and "fabric manager" in said[0], lines
    assert node.opened() == []
