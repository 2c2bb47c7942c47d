"""Every Inspector read is bounded as a whole, and one job's files cost only that job: a byte and
time budget across all jobs, taken in turn from where the last read stopped; a line that makes a
parser raise, or a defect a job's files find, counted and contained; a device node or FIFO
refused from its lstat, never opened."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from netmon.inspector import promfile
from netmon.inspector.files import DumpReader, Reading
from netmon.inspector.settings import InspectorConfig
from tests.inspector_files import Comm, json_record, marked_root, prom_dump, training_comms

KIB = 1024


def _reader(
    root: Path, clock: Callable[[], float] = time.monotonic, **settings: object
) -> DumpReader:
    return DumpReader(InspectorConfig(dir=root, **settings), clock=clock)  # type: ignore[arg-type]


def _jsonl(directory: Path, size: int, pid: int = 1) -> Path:
    """A JSON lines file of whole, valid records, some `size` bytes long."""
    directory.mkdir(parents=True, exist_ok=True)
    comm = Comm(0x10 + pid, "AllReduce", 64 << 20, 8, 1, tuple(range(8)))
    line = json_record(comm, 0, 300.0, time.time(), 1, '"node1"', pid).rstrip("\n") + "\n"
    path = directory / f"node1-pid{pid}.log"
    path.write_text(line * max(1, size // len(line)))
    return path


def _jobs_read(reading: Reading) -> set[str]:
    return {c.comm.partition("/")[0] for c in reading.collectives}


def test_one_large_job_cannot_starve_the_others_and_each_read_keeps_its_byte_budget(
    tmp_path: Path,
) -> None:
    root = marked_root(tmp_path / "inspector")
    for pid in range(4):  # the large job: four files, each a budget's half
        _jsonl(root / "1", 200 * KIB, pid)
    for job in ("2", "3", "4", "5"):
        _jsonl(root / job, 200 * KIB)
    reader = _reader(root, max_read_bytes=256 * KIB, read_budget_bytes=512 * KIB)
    readings = [reader.read(float(n)) for n in range(5)]
    assert all(r.bytes <= 512 * KIB for r in readings)
    assert [r.files for r in readings] == [2, 2, 2, 2, 0]
    assert [r.rejected["budget_exhausted"] for r in readings] == [1, 1, 1, 0, 0]
    # In turn: the large job's four files, then each other job's, none read twice meanwhile.
    assert [_jobs_read(r) for r in readings[:4]] == [{"1"}, {"1"}, {"2", "3"}, {"4", "5"}]
    lines = sum(path.read_bytes().count(b"\n") for path in root.glob("*/*.log"))
    assert sum(len(r.collectives) for r in readings) == lines


def test_the_time_budget_stops_a_read_and_the_next_ones_go_on_from_there(tmp_path: Path) -> None:
    root = marked_root(tmp_path / "inspector")
    for job in ("11", "12", "13"):
        for pid in range(2):
            _jsonl(root / job, 4 * KIB, pid)
    ticks = iter(float(n) for n in range(10_000))  # each look at the clock: a second later

    def clock() -> float:
        return next(ticks)

    reader = _reader(root, clock, read_budget_seconds=0.5)
    readings = [reader.read(float(n)) for n in range(6)]
    # Past its time after the first file, each read takes one and leaves the rest counted.
    assert all(r.files == 1 and r.rejected["budget_exhausted"] == 1 for r in readings)
    assert [_jobs_read(r) for r in readings] == [{"11"}, {"11"}, {"12"}, {"12"}, {"13"}, {"13"}]


def test_on_the_real_clock_a_read_stops_at_its_time_and_every_job_gets_its_turn(
    tmp_path: Path,
) -> None:
    root = marked_root(tmp_path / "inspector")
    jobs = {str(100 + n) for n in range(24)}
    for job in jobs:
        _jsonl(root / job, 1024 * KIB)  # 24 MiB in all: well within the byte budget
    reader = _reader(root, read_budget_seconds=0.1)
    first = reader.read(0.0)
    # Some tens of milliseconds a file: the time, not the bytes, ends the read.
    assert first.rejected["budget_exhausted"] == 1 and 1 <= first.files < 24
    seen = _jobs_read(first)
    for n in range(1, 24):
        seen |= _jobs_read(reader.read(float(n)))
        if seen == jobs:
            break
    assert seen == jobs, "every job read within as many reads as there are jobs"


def test_the_budgets_have_bounds_and_a_read_takes_at_least_one_file(tmp_path: Path) -> None:
    too_much = ({"max_read_bytes": "100G"}, {"read_budget_bytes": "2G"}, {"read_budget_seconds": 0})
    for bad in too_much:
        with pytest.raises(ValueError, match=next(iter(bad))):
            InspectorConfig(dir=tmp_path, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"read_budget_bytes .* must be >= max_read_bytes"):
        InspectorConfig(dir=tmp_path, max_read_bytes="8M", read_budget_bytes="4M")  # type: ignore[arg-type]
    defaults = InspectorConfig(dir=tmp_path)  # type: ignore[arg-type]
    assert (defaults.read_budget_bytes, defaults.read_budget_seconds) == (64 << 20, 2.0)


def test_a_3000_deep_line_costs_itself_and_the_other_jobs_are_counted(tmp_path: Path) -> None:
    root = marked_root(tmp_path / "inspector")
    hostile = _jsonl(root / "1", 1)
    good = hostile.read_bytes()
    hostile.write_bytes(b"[" * 3000 + b"\n" + good + b"[" * 2000 + b"]" * 2000 + b"\n")
    prom_dump(root / "2", training_comms(), lambda _c, _g: 300.0, time.time(), 1, job="2")
    reading = _reader(root).read(0.0)
    assert reading.rejected["unparsable"] == 2
    assert len([c for c in reading.collectives if c.comm.startswith("2/")]) == 40
    assert len([c for c in reading.collectives if c.comm.startswith("1/")]) == 1


def test_a_defect_one_jobs_files_find_is_counted_and_the_other_jobs_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = marked_root(tmp_path / "inspector")
    for job in ("1", "2"):
        prom_dump(root / job, training_comms(), lambda _c, _g: 300.0, time.time(), 1, job=job)
    parse = promfile.parse

    def broken(data: bytes, source: str, max_line: int) -> Any:
        if source.startswith("1/"):
            raise IndexError("a defect")
        return parse(data, source, max_line)

    monkeypatch.setattr(promfile, "parse", broken)
    caplog.set_level("DEBUG", logger="netmon.inspector.files")
    reading = _reader(root).read(0.0)
    assert reading.rejected["internal"] == 1 and _jobs_read(reading) == {"2"}
    assert "IndexError: a defect" in caplog.text  # the traceback, at debug level


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names every os.open is given while the test runs."""
    names: list[str] = []
    real = os.open

    def recording(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        names.append(os.fsdecode(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording)
    yield names


def test_a_device_node_or_fifo_is_refused_from_its_lstat_and_never_opened(
    tmp_path: Path, opened: list[str]
) -> None:
    root = marked_root(tmp_path / "inspector")
    job = root / "9"
    prom_dump(job, training_comms(), lambda _c, _g: 300.0, time.time(), 1, job="9")
    os.mkfifo(job / "fifo.prom")
    os.mknod(job / "null.prom", stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's
    os.mknod(job / "node1-pid7.log", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    reading = _reader(root).read(0.0)
    assert reading.rejected["not_a_file"] == 3 and len(reading.collectives) == 40
    assert "9" in opened and not {"fifo.prom", "null.prom", "node1-pid7.log"} & set(opened)
    assert reading.directories == {"foreign": 1}  # and never removed
