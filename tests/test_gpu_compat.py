"""Before the first rank: a driver too old for torch's CUDA, and a PID namespace of netmon's own
(netmon.gpu.compat). Each is one line naming the fix, a skip reason of its own in the daemon, and
never a stream of preempted or failed runs: checked on simulated nodes whose node file says what
the driver and the container would, through the real commands, daemon, launcher and ranks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from netmon.gpu import compat
from netmon.gpu.compat import CudaVersion
from netmon.probe.forking import Zygote
from tests.gpu_node import SimNode, dgx_h100
from tests.test_gpu_node import config_for, runner_on, skipped_daemon

V = CudaVersion.parse


@pytest.mark.parametrize(
    ("driver", "torch", "fault"),
    [
        ("12.2", "13.0", True),  # an H100 fleet on R535 and the image's torch for CUDA 13
        ("12.8", "13.0", True),
        ("11.8", "12.4", True),
        ("13.0", "13.0", False),
        ("13.1", "13.0", False),
        ("12.2", "12.8", False),  # minor version compatibility: the same major runs
        ("12.8", "12.4", False),
    ],
)
def test_a_driver_is_refused_only_for_an_older_cuda_major(
    driver: str, torch: str, fault: bool
) -> None:
    found = compat.driver_fault(V(driver), V(torch), "torch 2.13.0")
    assert (found is not None) == fault
    if found is not None:
        assert found.reason == "cuda_driver" and "\n" not in found.message
        assert f"runs CUDA up to {driver}, but torch 2.13.0 is built for CUDA {torch}" in (
            found.message
        )
        assert "upgrade the driver (R" in found.message


def test_what_nobody_can_say_is_not_a_fault() -> None:
    assert compat.driver_fault(None, V("13.0"), "torch") is None
    assert compat.driver_fault(V("12.2"), None, "torch") is None
    assert CudaVersion.from_nvml(12040) == V("12.4") and CudaVersion.from_nvml(13000) == V("13.0")


def test_torch_cuda_is_read_from_its_version_file_without_importing_it(tmp_path: Path) -> None:
    built = tmp_path / "version.py"
    built.write_text("__version__ = '2.13.0+cu130'\ncuda: Optional[str] = '13.0'\n")
    assert compat.read_torch_cuda(built) == (V("13.0"), "torch 2.13.0+cu130")
    built.write_text("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n")
    assert compat.read_torch_cuda(built) == (None, "torch 2.13.0+cpu")


def test_only_the_initial_pid_namespace_is_the_hosts(tmp_path: Path) -> None:
    other = tmp_path / "pid"
    other.write_text("")  # another inode than PROC_PID_INIT_INO, as any other namespace has
    assert compat.read_pid_namespace(other) == "container"
    assert compat.read_pid_namespace(tmp_path / "absent") == "host"
    fault = compat.namespace_fault("container")
    assert fault is not None and fault.reason == "pid_namespace"
    assert "hostPID: true" in fault.message and "--pid=host" in fault.message


def _node(tmp_path: Path, **said: str) -> SimNode:
    node = dgx_h100(tmp_path)
    node.document.update(said)
    node.write()
    return node


CASES = [
    ({"driver_cuda": "12.2"}, "the NVIDIA driver runs CUDA up to 12.2", "cuda_driver"),
    ({"pid_namespace": "container"}, "netmon runs in a PID namespace of its own", "pid_namespace"),
]


FLAGS = ("--backend", "nccl", "--ranks", "2", "--sizes", "1M")


@pytest.mark.parametrize(("said", "line", "reason"), CASES)
def test_probe_and_selftest_refuse_in_one_line_with_their_exit_codes(
    tmp_path: Path, said: dict[str, str], line: str, reason: str
) -> None:
    node = _node(tmp_path, **said)
    for command, code in (("probe", 3), ("selftest", 3)):  # could not run here, both
        done = subprocess.run(
            [sys.executable, "-m", "netmon", command, "--simulate", str(node.path), *FLAGS],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == code, (command, done.stderr)
        told = [t for t in done.stderr.splitlines() if not t.startswith("netmon: SIMULATED")]
        assert len(told) == 1 and line in told[0], (command, done.stderr)
    assert node.opened() == []  # no rank was started


@pytest.mark.parametrize(("said", "line", "reason"), CASES)
def test_the_daemon_skips_every_run_with_its_reason_and_starts_no_rank(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    said: dict[str, str],
    line: str,
    reason: str,
) -> None:
    node = _node(tmp_path, **said).activate(monkeypatch)
    probe = {"name": "small", "sizes": [8], "interval": "1s", "iters": 2, "warmup": 1}
    daemon = skipped_daemon(tmp_path, ["0", "1"], probe, reason)
    stats = daemon.results.snapshot().probes["small"]
    assert set(stats.skips) == {reason} and stats.failures == {} and stats.runs == 0
    assert node.opened() == []
    assert sum(line in r.getMessage() for r in caplog.records) == 1  # said once, at start


def test_without_the_check_container_pids_would_preempt_every_probe(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    zygotes: list[Zygote],
) -> None:
    """What the check spares a node: with the PID namespace unchecked, NVML lists the ranks
    under host PIDs netmon does not know, and the probe is stopped as if a job took its GPUs.
    (The simulated node drives the same readiness code a real one does.)"""
    node = _node(tmp_path, pid_namespace="container")
    probe = {"name": "small", "sizes": ["4M"], "iters": 200, "warmup": 1}
    on = runner_on(node, config_for(tmp_path, ["0", "1"], [probe]), monkeypatch, zygotes)
    on.readiness.foreign_check_s = 0.1
    assert on.readiness.fault is None  # the runner alone, as before the check
    on.runner.run("small")
    assert on.results.snapshot().probes["small"].failures == {"preempted": 1}


def test_a_forward_compatibility_package_new_enough_runs_torchs_cuda_on_an_older_driver(
    tmp_path: Path,
) -> None:
    # An R535 node (CUDA 12.2) whose image brings cuda-compat for R580 (CUDA 13.0).
    assert compat.driver_fault(V("12.2"), V("13.0"), "torch", compat=V("13.0")) is None
    assert compat.driver_fault(V("12.2"), V("13.0"), "torch", compat=V("12.8")) is not None
    library = tmp_path / "compat"
    library.mkdir()
    for name in ("libcuda.so.1", "libcuda.so", "libnvidia-ptxjitcompiler.so.580.65.06"):
        (library / name).write_bytes(b"")
    environ = {"LD_LIBRARY_PATH": f"/nonexistent:{library}"}
    assert compat.read_compat_cuda(environ) is None  # no versioned libcuda: no package
    (library / "libcuda.so.580.65.06").write_bytes(b"")
    assert compat.read_compat_cuda(environ) == (V("13.0"), library / "libcuda.so.580.65.06")
    (library / "libcuda.so.999.1.2").write_bytes(b"")  # a branch nobody has published
    assert compat.read_compat_cuda(environ) == (V("13.0"), library / "libcuda.so.580.65.06")
    assert compat.read_compat_cuda({}) is None


def test_a_simulated_node_with_the_package_is_not_refused(tmp_path: Path) -> None:
    node = _node(tmp_path, driver_cuda="12.2", compat_cuda="13.0")
    done = subprocess.run(
        [sys.executable, "-m", "netmon", "probe", "--simulate", str(node.path), *FLAGS],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
