"""A data volume named as `inspector.dir` by mistake, against the real daemon: unmarked, the
daemon refuses to start in one line; marked, it serves and reads it many times over and removes
only the one directory the layout makes, keeping and counting the rest."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.daemon_harness import DaemonProcess, fast_config, wait_until
from tests.inspector_files import marked_root, prom_dump, training_comms

TWO_DAYS = 2 * 86400.0


def _volume(root: Path) -> dict[Path, list[str]]:
    """Subdirectories of someone's data, two days old; each with an `.ended` file too, so each
    is due for removal at every read after the first (grace 0) were it netmon's."""
    at = time.time() - TWO_DAYS
    for name, extra in (("datasets", "train.bin"), ("4242", "results.csv"), ("4243", "sub/")):
        job = root / name
        prom_dump(job, training_comms(), lambda _c, _g: 300.0, at, 1, job=name)
        if extra.endswith("/"):
            (job / extra).mkdir()
        else:
            (job / extra).write_text("someone's work")
        (job / ".ended").touch()
        for path in (*job.iterdir(), job):
            os.utime(path, (at, at))
    return _contents(root)


def _contents(root: Path) -> dict[Path, list[str]]:
    return {job: sorted(os.listdir(job)) for job in root.iterdir() if job.is_dir()}


def _config(tmp_path: Path, root: Path) -> dict[str, object]:
    config = fast_config(tmp_path, inspector={"dir": str(root), "interval": 1, "grace": 0})
    for probe in config["probes"]:  # type: ignore[attr-defined]
        probe["interval"] = "60s"  # the reads are what this test is about
    return config


def test_an_unmarked_data_volume_is_refused_at_start_and_left_whole(tmp_path: Path) -> None:
    root = tmp_path / "volume"
    made = _volume(root)
    path = tmp_path / "netmon.yaml"
    path.write_text(yaml.safe_dump(_config(tmp_path, root)))
    done = subprocess.run(
        [sys.executable, "-m", "netmon", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"netmon: inspector.dir: {root} has no .netmon-inspector"), line
    assert _contents(root) == made


def test_a_marked_volume_keeps_what_is_not_netmons_over_many_reads(tmp_path: Path) -> None:
    root = marked_root(tmp_path / "volume")
    made = _volume(root)
    ours = root / "4244"  # what the prolog and the plugin make: it goes
    prom_dump(ours, training_comms(), lambda _c, _g: 300.0, time.time() - TWO_DAYS, 1)
    (ours / ".ended").touch()
    daemon = DaemonProcess(tmp_path, _config(tmp_path, root))
    try:
        wait_until(lambda: not ours.exists(), 60, "netmon's own ended job removed")
        reads: set[float] = set()

        def twelve_more_reads() -> bool:
            reads.add(daemon.value("netmon_jobs_last_read_timestamp_seconds") or 0.0)
            return len(reads) > 12

        wait_until(twelve_more_reads, 90, "twelve more reads of the volume")
        assert daemon.value("netmon_jobs_directories", state="foreign") == 3
        assert daemon.value("netmon_jobs_directories", state="removable") == 0
        assert daemon.value("netmon_jobs_directories_removed_total") == 1
        assert "kept 4242, not netmon's: it holds 'results.csv'" in daemon.log()
    finally:
        assert daemon.stop() == 0
    assert _contents(root) == made
