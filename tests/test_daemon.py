"""The real daemon as users run it: a subprocess probing with gloo ranks, scraped over HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.daemon_harness import DaemonProcess, fast_config, series, wait_until

CONTRACT = [
    "netmon_busbw_bytes_per_second",
    "netmon_algbw_bytes_per_second",
    "netmon_latency_seconds",
    "netmon_probe_runs_total",
    "netmon_probe_last_success_timestamp_seconds",
    "netmon_probe_duration_seconds",
    "netmon_probe_busy_seconds_total",
    "netmon_build_info",
]


def start(daemons: list[DaemonProcess], tmp_path: Path, **overrides: object) -> DaemonProcess:
    daemon = DaemonProcess(tmp_path, fast_config(tmp_path, **overrides), f"d{len(daemons)}")
    daemons.append(daemon)
    return daemon


def runs(daemon: DaemonProcess) -> float:
    return sum(series(daemon.scrape(), "netmon_probe_runs_total").values())


def test_daemon_exports_the_contract_counts_up_and_stops_cleanly(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    daemon = start(daemons, tmp_path)

    def contract_complete() -> bool:
        samples = daemon.scrape()
        sizes = {dict(k)["size_bytes"] for k in series(samples, "netmon_busbw_bytes_per_second")}
        return len(sizes) == 3 and all(
            any(v > 0 for v in series(samples, name).values()) for name in CONTRACT
        )

    wait_until(contract_complete, 60, "every contract family with a positive value")
    samples = daemon.scrape()
    busbw = series(samples, "netmon_busbw_bytes_per_second")
    labels = {dict(key)["size_bytes"] for key in busbw}
    assert labels == {"8", "1024", "65536"}
    assert {dict(key)["path"] for key in busbw} == {"default"}
    assert all(dict(k)["reason"] for k in series(samples, "netmon_probe_failures_total"))
    first = runs(daemon)
    wait_until(lambda: runs(daemon) >= first + 2, 30, "the runs counter to grow")
    assert "measured" in daemon.get().lower() or "Measured" in daemon.get()
    assert daemon.get("/healthz").strip() == "ok"
    # The daemon itself never loads torch or CUDA: only its rank processes do.
    maps = Path(f"/proc/{daemon.proc.pid}/maps").read_text()
    assert "libtorch" not in maps and "libcuda" not in maps and "libc10" not in maps

    assert daemon.stop(timeout=10) == 0
    assert daemon.tagged_processes() == []
    assert "netmon stopped" in daemon.log()
    assert "Traceback" not in daemon.log()
    assert (tmp_path / "state" / "baselines.json").exists()


def test_pause_file_stops_runs_and_counts_skips(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    daemon = start(daemons, tmp_path)
    wait_until(lambda: runs(daemon) >= 1, 60, "a first run")
    pause = tmp_path / "pause"
    pause.touch()

    def paused_skips() -> float:
        return sum(
            value
            for key, value in series(daemon.scrape(), "netmon_probe_skips_total").items()
            if dict(key)["reason"] == "paused"
        )

    wait_until(lambda: paused_skips() >= 1, 30, "a paused skip")
    assert daemon.value("netmon_paused") == 1.0
    runs_while_paused = runs(daemon)
    skips_then = paused_skips()
    wait_until(lambda: paused_skips() >= skips_then + 3, 30, "three more paused skips")
    assert runs(daemon) == runs_while_paused
    pause.unlink()
    wait_until(lambda: runs(daemon) > runs_while_paused, 30, "runs to resume")
    assert daemon.value("netmon_paused") == 0.0
    assert daemon.stop() == 0


def test_a_restart_keeps_the_baseline(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    daemon = start(daemons, tmp_path)
    key = {
        "probe": "large",
        "op": "all_reduce",
        "size_bytes": "65536",
        "path": "default",
        "ranks": "2",
    }
    learned = wait_until(
        lambda: daemon.value("netmon_busbw_baseline_bytes_per_second", **key),
        60,
        "a learned baseline",
    )
    assert daemon.stop() == 0
    saved = json.loads((tmp_path / "state" / "baselines.json").read_text())
    assert saved["baselines"]
    # Paused on restart, so nothing is measured: the baseline can only come from the state file.
    (tmp_path / "pause").touch()
    again = start(daemons, tmp_path)
    restored = wait_until(
        lambda: again.value("netmon_busbw_baseline_bytes_per_second", **key),
        30,
        "the restored baseline",
    )
    assert restored > 0
    assert runs(again) == 0
    # The baseline may have learned more results after the scrape above, before the stop.
    entry = next(b for b in saved["baselines"] if b["probe"] == "large")
    assert min(entry["learned"]) <= restored <= max(entry["learned"])
    assert learned > 0
    assert again.stop() == 0


def test_a_corrupt_state_file_is_set_aside_with_a_warning(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "baselines.json").write_text('{"version": 1, "baselines": [{"probe": ')
    daemon = start(daemons, tmp_path)
    wait_until(lambda: runs(daemon) >= 1, 60, "a run despite the corrupt state")
    assert list(state.glob("baselines.json.corrupt-*"))
    assert "warning" in daemon.log() and "corrupt" in daemon.log().lower()
    assert daemon.stop() == 0


def test_serve_config_error_names_the_field(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(
        "listen: 127.0.0.1:19464\nprobes:\n  - name: small\n    sizes: [8]\n    interval: soon\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "netmon", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "probes[0].interval" in done.stderr


def test_a_port_in_use_is_a_one_line_error(daemons: list[DaemonProcess], tmp_path: Path) -> None:
    daemon = start(daemons, tmp_path)
    config = tmp_path / "clash.yaml"
    config.write_text(f"listen: 127.0.0.1:{daemon.port}\nbackend: gloo\n")
    done = subprocess.run(
        [sys.executable, "-m", "netmon", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "listen" in done.stderr and "Traceback" not in done.stderr
    assert daemon.stop() == 0


def test_sigterm_kills_an_in_flight_probe_and_exits_0(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    long_probe = {"name": "long", "sizes": ["16M"], "interval": "1h", "iters": 500, "warmup": 1}
    daemon = start(daemons, tmp_path, probes=[long_probe])
    wait_until(lambda: runs(daemon) == 1, 60, "the long probe to start")
    wait_until(lambda: len(daemon.tagged_processes()) >= 3, 30, "its two ranks to exist")
    assert daemon.value("netmon_probe_last_run_timestamp_seconds", probe="long") is None
    assert daemon.stop(timeout=10) == 0
    assert daemon.tagged_processes() == []
    assert "reason=shutdown" in daemon.log()
    # The run was waited for, not abandoned: its end is logged before the daemon's, and the
    # stop raised nothing on any thread.
    log = daemon.log()
    assert log.index("reason=shutdown") < log.index("netmon stopped")
    assert "Traceback" not in log


def test_sigterm_while_the_rank_zygote_starts_does_not_wait_for_its_import(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    """A zygote whose torch import never ends (a slow disk, at worst): SIGTERM still stops the
    daemon within seconds, the probe waiting for the zygote ends cancelled, nothing is left."""
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\ncase "$2" in netmon.probe.zygote) exec sleep 300;; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    probe = {"name": "small", "sizes": [8], "interval": "1h", "iters": 5, "warmup": 1}
    daemon = start(daemons, tmp_path, probes=[probe], rank_python=str(python))

    def command_of(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""  # ended since it was listed

    def zygote_starting() -> bool:
        return any(command_of(pid).startswith(b"sleep") for pid in daemon.tagged_processes())

    wait_until(zygote_starting, 60, "the rank zygote's start under way")
    began = time.monotonic()
    assert daemon.stop(timeout=30) == 0
    # Before, the stop waited out the daemon's grace (8 s) and then the whole import.
    assert time.monotonic() - began < 5.0
    assert daemon.tagged_processes() == []
    log = daemon.log()
    assert "reason=shutdown" in log and "Traceback" not in log
    assert "rank zygote unavailable" not in log  # a stop is not a zygote that failed


def test_a_failing_probe_is_counted_by_reason_and_the_daemon_keeps_serving(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    doomed = {
        "name": "doomed",
        "sizes": ["16M"],
        "interval": "1s",
        "iters": 500,
        "warmup": 1,
        "timeout": "6s",
    }
    daemon = start(daemons, tmp_path, probes=[doomed], logging={"format": "json"})

    def timeouts() -> float:
        # timeout_measure, unless a loaded machine is slow to even start the ranks.
        failures = series(daemon.scrape(), "netmon_probe_failures_total")
        return sum(v for k, v in failures.items() if dict(k)["reason"].startswith("timeout_"))

    wait_until(lambda: timeouts() >= 2, 60, "two counted timeouts")
    assert daemon.get("/healthz").strip() == "ok"
    assert daemon.value("netmon_probe_last_success_timestamp_seconds", probe="doomed") is None
    lines = [json.loads(line) for line in daemon.log().splitlines() if line.startswith("{")]
    failed = [line for line in lines if line.get("outcome") == "failed"]
    assert failed and failed[0]["probe"] == "doomed" and failed[0]["reason"].startswith("timeout_")
    assert daemon.stop() == 0
    assert daemon.tagged_processes() == []


def test_pair_and_path_probes_export_per_pair_and_per_path(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    probes = [
        {
            "name": "pairs",
            "kind": "pairs",
            "sizes": ["64K"],
            "interval": "2s",
            "iters": 3,
            "warmup": 1,
        },
        {
            "name": "paths",
            "sizes": ["64K"],
            "interval": "2s",
            "iters": 3,
            "warmup": 1,
            "paths": ["default", "pcie"],
        },
    ]
    daemon = start(daemons, tmp_path, probes=probes, ranks=3)

    def complete() -> bool:
        samples = daemon.scrape()
        return (
            len(series(samples, "netmon_link_busbw_bytes_per_second")) == 3
            and len(series(samples, "netmon_busbw_bytes_per_second")) == 2
        )

    wait_until(complete, 90, "3 pairs and 2 paths")
    samples = daemon.scrape()
    pairs = {
        (dict(k)["gpu"], dict(k)["peer_gpu"])
        for k in series(samples, "netmon_link_busbw_bytes_per_second")
    }
    assert pairs == {("0", "1"), ("0", "2"), ("1", "2")}
    assert set(series(samples, "netmon_gpu_suspect").values()) <= {0.0, 1.0}
    assert len(series(samples, "netmon_gpu_suspect")) == 3
    paths = {dict(k)["path"] for k in series(samples, "netmon_busbw_bytes_per_second")}
    assert paths == {"default", "pcie"}
    assert series(samples, "netmon_nvlink_pcie_busbw_ratio")
    transports = {dict(k)["transport"] for k in series(samples, "netmon_transport_info")}
    assert transports == {"gloo"}
    assert daemon.stop() == 0
    assert daemon.tagged_processes() == []


def test_a_port_in_use_leaves_no_state_directory_behind(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = fast_config(tmp_path, listen=f"127.0.0.1:{port}")
        config["state_dir"] = str(tmp_path / "new" / "state")
        path = tmp_path / "netmon.yaml"
        path.write_text(yaml.safe_dump(config))
        done = subprocess.run(
            [sys.executable, "-m", "netmon", "serve", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    assert f"listen: cannot listen on 127.0.0.1:{port}" in done.stderr
    assert not (tmp_path / "new").exists()
