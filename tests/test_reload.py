"""SIGHUP reloads the configuration; a bad file is refused, logged and counted: the old stays."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.daemon_harness import DaemonProcess, fast_config, wait_until


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    process = DaemonProcess(tmp_path, fast_config(tmp_path))
    try:
        yield process
    finally:
        if process.proc.poll() is None:
            process.kill_all()


def runs(daemon: DaemonProcess, probe: str) -> float:
    return daemon.value("netmon_probe_runs_total", probe=probe) or 0.0


def hangup(daemon: DaemonProcess) -> None:
    daemon.proc.send_signal(signal.SIGHUP)


def test_a_bad_reload_keeps_the_old_configuration_and_a_good_one_applies(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    wait_until(lambda: runs(daemon, "small") >= 1, 60, "a first run")
    good = yaml.safe_load(daemon.config_path.read_text())

    daemon.config_path.write_text("probes:\n  - name: small\n    sizes: [8]\n    interval: soon\n")
    hangup(daemon)
    wait_until(
        lambda: daemon.value("netmon_config_reload_failures_total") == 1.0,
        20,
        "the refused reload to be counted",
    )
    assert daemon.value("netmon_config_last_reload_successful") == 0.0
    assert "configuration reload failed" in daemon.log() and "probes[0].interval" in daemon.log()
    before = runs(daemon, "small")
    wait_until(lambda: runs(daemon, "small") > before, 30, "the old configuration to go on")

    moved = {**good, "listen": "127.0.0.1:1"}
    daemon.config_path.write_text(yaml.safe_dump(moved))
    hangup(daemon)
    wait_until(
        lambda: daemon.value("netmon_config_reload_failures_total") == 2.0,
        20,
        "a listen change to be refused",
    )
    assert "needs a restart" in daemon.log()

    # The baseline book is sized by its policy at start: a change is refused, not ignored.
    daemon.config_path.write_text(yaml.safe_dump({**good, "baseline": {"ratio": 0.75}}))
    hangup(daemon)
    wait_until(
        lambda: daemon.value("netmon_config_reload_failures_total") == 3.0,
        20,
        "a baseline change to be refused",
    )
    assert "baseline: changing this needs a restart" in daemon.log()

    extra = {"name": "extra", "sizes": ["4K"], "interval": "1s", "iters": 2, "warmup": 0}
    daemon.config_path.write_text(yaml.safe_dump({**good, "probes": [*good["probes"], extra]}))
    hangup(daemon)
    wait_until(lambda: runs(daemon, "extra") >= 1, 60, "the added probe to run")
    assert daemon.value("netmon_config_last_reload_successful") == 1.0
    # An added probe's counters start at 0 like those of a probe present at start.
    for reason in ("settling", "disturbed", "noisy"):
        counted = daemon.value("netmon_inconclusive_results_total", probe="extra", reason=reason)
        assert counted is not None, reason
    assert daemon.stop() == 0
    assert daemon.tagged_processes() == []


def _reloads(daemon: DaemonProcess) -> int:
    return daemon.log().count("configuration reloaded")


def test_a_reload_that_leaves_a_probes_schedule_keeps_its_next_run(tmp_path: Path) -> None:
    # An hourly probe that has run once: a SIGHUP with the file unchanged, then with the other
    # probe's sizes changed, must not run it again; one given another interval starts afresh.
    hourly = {"name": "hourly", "sizes": [8], "interval": "1h", "iters": 2, "warmup": 0}
    config = fast_config(tmp_path)
    config["probes"] = [config["probes"][0], hourly]
    process = DaemonProcess(tmp_path, config)
    try:
        wait_until(lambda: runs(process, "hourly") == 1 and runs(process, "small") >= 1, 60, "runs")
        for edit in ({}, {"probes": [{**config["probes"][0], "sizes": [8]}, hourly]}):
            process.config_path.write_text(yaml.safe_dump({**config, **edit}))
            reloads = _reloads(process)
            hangup(process)
            wait_until(lambda r=reloads: _reloads(process) > r, 20, "a reload")
            # The small probe's runs are the clock: 3 more (3 s and more), where a rescheduled
            # hourly probe would have run at 1 s.
            small = runs(process, "small")
            wait_until(lambda s=small: runs(process, "small") >= s + 3, 60, "three more small runs")
            assert runs(process, "hourly") == 1, edit
        moved = {**hourly, "interval": "30m"}
        process.config_path.write_text(
            yaml.safe_dump({**config, "probes": [config["probes"][0], moved]})
        )
        hangup(process)
        wait_until(lambda: runs(process, "hourly") == 2, 60, "the rescheduled probe to run")
        assert process.stop() == 0
    finally:
        if process.proc.poll() is None:
            process.kill_all()
