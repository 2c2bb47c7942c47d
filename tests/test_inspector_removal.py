"""What the Inspector reader removes: only a job directory the layout makes (a Slurm job id or a
pod UID), holding only the plugin's files and the epilog's mark, under a root marked as netmon's,
once it ended `grace` ago or went unchanged for `stale_after` on netmon's monotonic clock. Pure
reads with an injected clock; the real daemon's side is in tests/test_inspector_guard.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netmon.errors import ConfigError
from netmon.inspector import jobdirs
from netmon.inspector.files import DumpReader
from netmon.inspector.settings import InspectorConfig
from tests.inspector_files import marked_root, prom_dump, training_comms

TWO_DAYS = 2 * 86400.0
POD = "0f8fad5b-d9cb-469f-a165-70867728950e"


def _reader(root: Path, **settings: object) -> DumpReader:
    return DumpReader(InspectorConfig(dir=root, **settings))  # type: ignore[arg-type]


def _job(root: Path, job: str, age: float = 0.0, ended: bool = False) -> Path:
    """A job's dump as the plugin writes it, its files (and mark) `age` old by the wall clock."""
    at = time.time() - age
    prom_dump(root / job, training_comms(), lambda _c, _g: 300.0, at, 1, job=job)
    if ended:
        (root / job / ".ended").touch()
    for path in (*(root / job).iterdir(), root / job):
        os.utime(path, (at, at))
    return root / job


def test_an_ended_job_goes_grace_after_netmon_first_saw_its_mark(tmp_path: Path) -> None:
    root = marked_root(tmp_path / "inspector")
    _job(root, "41", age=TWO_DAYS, ended=True)  # marked long ago by the wall clock
    _job(root, "42")
    reader = _reader(root, grace="60s")
    first = reader.read(1000.0)
    assert first.removed == 0, "a directory seen for the first time is never removed"
    assert len(first.collectives) == 2 * 40 and first.directories == {"live": 2}
    assert reader.read(1060.0).removed == 0  # 60 s since netmon saw the mark: not yet over
    reading = reader.read(1060.5)
    assert reading.removed == 1 and sorted(p.name for p in root.iterdir()) == [
        jobdirs.MARKER,
        "42",
    ]


def test_grace_0_still_spares_the_first_read(tmp_path: Path) -> None:
    root = marked_root(tmp_path / "inspector")
    _job(root, POD, ended=True)
    reader = _reader(root, grace=0)
    assert reader.read(5.0).removed == 0
    assert reader.read(5.001).removed == 1 and not (root / POD).exists()


def test_a_wall_clock_step_past_stale_after_removes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = marked_root(tmp_path / "inspector")
    live = _job(root, "7", age=TWO_DAYS)  # by the wall clock, unchanged for two days
    reader = _reader(root, stale_after="1h")
    wall = time.time()
    monkeypatch.setattr(time, "time", lambda: wall + TWO_DAYS)  # the wall clock steps forward
    for step in range(5):
        reading = reader.read(100.0 + step * 600.0)  # 40 minutes on the monotonic clock
        assert reading.removed == 0 and reading.directories == {"live": 1}
    # Written again, it is younger still: an hour is counted from the change netmon saw.
    _job(root, "7", age=TWO_DAYS + 60)
    assert reader.read(3000.0).removed == 0  # seen changed here
    assert reader.read(3000.0 + 3599.0).removed == 0
    assert reader.read(3000.0 + 3601.0).removed == 1 and not live.exists()


@pytest.mark.parametrize(
    ("name", "planted"),
    [
        ("data", None),  # no job id: a data volume's subdirectory
        ("4242.bak", None),
        ("42", "results.csv"),  # a job id, but a file the plugin never writes
        ("43", "subdir/"),
        ("44", "link.prom->"),
        ("45", "hard.prom=>"),
    ],
)
def test_a_directory_that_is_not_netmons_is_kept_and_counted(
    tmp_path: Path, name: str, planted: str | None
) -> None:
    root = marked_root(tmp_path / "inspector")
    job = _job(root, name, age=TWO_DAYS, ended=True)
    if planted is not None:
        if planted.endswith("/"):
            (job / planted).mkdir()
        elif planted.endswith("->"):
            (job / planted[:-2]).symlink_to(tmp_path)
        elif planted.endswith("=>"):
            (tmp_path / "elsewhere").write_text("someone's")
            (job / planted[:-2]).hardlink_to(tmp_path / "elsewhere")
        else:
            (job / planted).write_text("someone's")
    reader = _reader(root, grace=0, stale_after="60s")
    for n in range(4):
        reading = reader.read(n * 3600.0)
        assert reading.removed == 0 and reading.directories == {"foreign": 1}
    assert job.is_dir() and len(list(job.iterdir())) >= 9


def test_a_root_that_lost_its_marker_removes_nothing_and_counts_what_it_would(
    tmp_path: Path,
) -> None:
    root = marked_root(tmp_path / "inspector")
    _job(root, "41", ended=True)
    reader = _reader(root, grace=0)
    reader.read(0.0)
    (root / jobdirs.MARKER).unlink()
    (root / jobdirs.MARKER).symlink_to(tmp_path)  # a link is no marker either
    for n in range(1, 4):
        reading = reader.read(float(n))
        assert reading.removed == 0 and reading.directories == {"removable": 1}
    assert (root / "41").is_dir()


def test_the_names_the_layout_makes() -> None:
    assert all(jobdirs.job_name(n) for n in ("1", "4242", "123_4", POD))
    assert not any(jobdirs.job_name(n) for n in ("", "data", "-1", "1/2", "..", POD.upper()))
    assert jobdirs.inspector_file("nccl_inspector_metrics_a1523c00-1122-3344-0001.prom")
    assert jobdirs.inspector_file("node1-pid4242.log") and jobdirs.inspector_file(".ended")
    assert not any(jobdirs.inspector_file(n) for n in ("notes.log", "x.csv", ".prom", "a b.prom"))


def test_the_daemon_and_check_config_refuse_an_unmarked_root(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    with pytest.raises(ConfigError) as refused:
        jobdirs.check_root(tmp_path / "data")
    assert str(refused.value).startswith("inspector.dir: ")
    assert jobdirs.MARKER in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match=r"^inspector.dir: cannot open .*absent"):
        jobdirs.check_root(tmp_path / "absent")
    jobdirs.check_root(marked_root(tmp_path / "data"))


@pytest.mark.parametrize(
    "directory",
    ["/", "/etc", "/home/alice", "/var", "/var/lib", "/data", "/usr/lib/x", "/tmp/../etc",
     "/var/lib/./x", "/var/lib//x", "/var/lib/x/", "relative/x"],
)  # fmt: skip
def test_a_system_path_or_one_outside_the_allowed_roots_is_refused(directory: str) -> None:
    with pytest.raises(ValueError, match="below one of /run, /var/run, /var/lib"):
        InspectorConfig(dir=directory)  # type: ignore[arg-type]


def test_the_allowed_roots_take_a_directory_of_netmons() -> None:
    for directory in ("/var/lib/netmon-inspector", "/run/netmon/inspector", "/scratch/nccl"):
        assert str(InspectorConfig(dir=directory).dir) == directory  # type: ignore[arg-type]


def _check_config(path: Path) -> str:
    """`netmon check-config FILE`'s one line; it must fail as a usage error (2)."""
    done = subprocess.run(
        [sys.executable, "-m", "netmon", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("NETMON_")},
    )
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    return done.stderr


def test_check_config_refuses_inspector_dir_slash_and_an_unmarked_one(tmp_path: Path) -> None:
    path = tmp_path / "netmon.yaml"
    path.write_text("backend: gloo\ninspector: {dir: /}\n")
    assert "inspector.dir: must be a directory below one of" in _check_config(path)
    data = tmp_path / "data"  # a data volume named by mistake: an allowed root, but unmarked
    (data / "2024").mkdir(parents=True)
    path.write_text(f"backend: gloo\ninspector: {{dir: {data}}}\n")
    line = _check_config(path)
    assert line.startswith(f"netmon: inspector.dir: {data} has no .netmon-inspector"), line
    assert (data / "2024").is_dir()
