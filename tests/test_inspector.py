"""The jobs' NCCL Inspector files, read as the plugin writes them (tests/inspector_files.py), and
every kind of file a job's user could leave there instead: counted, logged, never followed out
of the directory, never read whole, never a crash."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from netmon.inspector import files as files_module
from netmon.inspector.files import DumpReader
from netmon.inspector.promfile import parse as parse_prom
from netmon.inspector.settings import InspectorConfig
from tests.inspector_files import (
    Comm,
    json_dump,
    json_record,
    marked_root,
    prom_dump,
    training_comms,
)

NOW = 1_790_000_000.0


def _reader(root: Path, **settings: object) -> DumpReader:
    return DumpReader(InspectorConfig(dir=root, **settings))  # type: ignore[arg-type]


def _flat(_comm: Comm, _gpu: int) -> float:
    return 300.0


def test_a_textfile_dump_reads_back_in_netmons_terms(tmp_path: Path) -> None:
    written = prom_dump(tmp_path / "4242", training_comms(), _flat, NOW, 17)
    reading = _reader(tmp_path).read(NOW)
    assert reading.rejected == {} and reading.files == len(written) == 8
    by_op = {(c.op, c.ranks, c.nodes) for c in reading.collectives}
    assert by_op == {
        ("all_reduce", 8, 1),
        ("all_gather", 2, 1),
        ("reduce_scatter", 4, 4),
        ("all_reduce", 4, 1),
        ("broadcast", 8, 1),
    }
    gather = next(c for c in reading.collectives if c.op == "all_gather")
    # One rank's 8 MiB gathered over 2 ranks: nccl-tests' size is the 16 MiB gathered.
    assert gather.size_bytes == 16 << 20
    for collective in reading.collectives:
        assert collective.busbw == pytest.approx(300e9, rel=0.2)  # integer microseconds
        assert collective.seconds > 0
    # 16 communicators, as many collectives as GPU memberships: 8 + 4x2 + 8 + 2x4 + 8.
    assert len(reading.collectives) == 40


def test_a_dump_already_read_is_not_read_again(tmp_path: Path) -> None:
    reader = _reader(tmp_path)
    prom_dump(tmp_path / "1", training_comms(), _flat, NOW, 1)
    assert len(reader.read(NOW).collectives) == 40
    assert reader.read(NOW + 1).collectives == []
    prom_dump(tmp_path / "1", training_comms(), _flat, NOW + 30, 2)
    assert len(reader.read(NOW + 31).collectives) == 40


def test_json_lines_are_read_from_where_the_last_read_ended_whole_lines_only(
    tmp_path: Path,
) -> None:
    reader = _reader(tmp_path)
    comms = training_comms()
    path = json_dump(tmp_path / "7", comms, _flat, NOW, 1)
    first = reader.read(NOW)
    assert len(first.collectives) == 40 and first.rejected == {}
    line = json_record(comms[0], 0, 250.0, NOW + 30, 2, "node1", 4100)
    with open(path, "a") as out:
        out.write(line[:50])  # the plugin is still writing it
    assert reader.read(NOW + 30).collectives == []
    with open(path, "a") as out:
        out.write(line[50:])
    taken = reader.read(NOW + 31).collectives
    assert len(taken) == 1 and taken[0].busbw == pytest.approx(250e9, rel=0.01)


def test_a_later_releases_aggregated_textfile_is_read_too() -> None:
    # plugins/profiler/inspector (v2.29.7-1 and later): version="v5.1", a size range, no algbw.
    labels = (
        'version="v5.1",slurm_job_id="9",node="n1",gpu="GPU0",comm_name="tp",n_nodes="1",'
        'nranks="8",collective="AllReduce",message_size="64-128MB",algo_proto="RING_SIMPLE"'
    )
    text = (
        f"nccl_bus_bandwidth_gbs{{{labels}}} 350.5\n"
        f"nccl_collective_exec_time_microseconds{{{labels}}} 700\n"
    ).encode()
    parsed = parse_prom(text, "9/x.prom", 4096)
    assert parsed.rejected == {}
    (collective,) = parsed.collectives
    assert (collective.op, collective.size_bytes, collective.ranks) == ("all_reduce", 64 << 20, 8)
    assert collective.busbw == pytest.approx(350.5e9)
    assert collective.algbw == pytest.approx(350.5e9 / (2 * 7 / 8))


def test_point_to_point_and_single_rank_lines_are_no_collective_and_no_error() -> None:
    base = (
        'comm_id="0x1",rank="0",nranks="{n}",n_nodes="1",collective="{c}",coll_sn="1",'
        'message_size="1.00MB"'
    )
    text = "".join(
        f"{metric}{{{base.format(n=n, c=c)}}} 5\n"
        for n, c in ((2, "Send"), (2, "SendRecv"), (1, "AllReduce"))
        for metric in ("nccl_bus_bandwidth_gbs", "nccl_collective_exec_time_microseconds")
    )
    parsed = parse_prom(text.encode(), "x", 4096)
    assert parsed.collectives == [] and parsed.rejected == {}


# -- what a job's user could leave instead ----------------------------------------------------


def _good_dump(root: Path, job: str = "1") -> None:
    prom_dump(root / job, training_comms(), _flat, NOW, 1)


def _expect(
    reading: files_module.Reading, reason: str, caplog: pytest.LogCaptureFixture, good: int = 40
) -> None:
    assert reading.rejected[reason] >= 1, reading.rejected
    assert len(reading.collectives) == good  # the good files beside it are still read
    assert any(reason in r.getMessage() for r in caplog.records), "not logged"


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="netmon.inspector.files")
    return caplog


def test_a_truncated_dump_keeps_its_whole_lines(
    tmp_path: Path, warnings: pytest.LogCaptureFixture
) -> None:
    _good_dump(tmp_path)
    (path, *_) = sorted((tmp_path / "1").iterdir())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])  # cut inside the last line
    reading = _reader(tmp_path).read(NOW)
    # The cut communicator lost its time line; the others on that GPU are whole.
    _expect(reading, "truncated_line", warnings, good=39)
    assert reading.rejected["incomplete"] == 1


def test_a_dump_rewritten_while_it_is_read_is_taken_next_time(
    tmp_path: Path, warnings: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    _good_dump(tmp_path)
    reader = _reader(tmp_path)
    real = os.pread
    rewrites: list[int] = []

    def pread_then_rewrite(fd: int, n: int, offset: int) -> bytes:
        data = real(fd, n, offset)
        if not rewrites:  # the plugin's next dump lands while the first file is read
            rewrites.append(1)
            prom_dump(tmp_path / "1", training_comms(), _flat, NOW + 30, 2)
        return data

    monkeypatch.setattr(os, "pread", pread_then_rewrite)
    first = reader.read(NOW + 30)
    assert first.rejected["changed_during_read"] == 1
    assert len(first.collectives) == 35  # the 7 other GPUs' files
    monkeypatch.setattr(os, "pread", real)
    second = reader.read(NOW + 31)
    assert len(second.collectives) == 5 and second.rejected == {}


def test_a_json_lines_file_replaced_by_a_new_process_is_read_from_its_start(tmp_path: Path) -> None:
    reader = _reader(tmp_path)
    path = json_dump(tmp_path / "1", training_comms(), _flat, NOW, 1)
    assert len(reader.read(NOW).collectives) == 40
    path.unlink()
    json_dump(tmp_path / "1", training_comms()[:1], _flat, NOW + 30, 1)  # same pid, new file
    reading = reader.read(NOW + 30)
    assert reading.rejected["replaced"] == 1 and len(reading.collectives) == 8


def test_a_1_gib_file_is_never_read_whole(
    tmp_path: Path, warnings: pytest.LogCaptureFixture
) -> None:
    _good_dump(tmp_path)
    with open(tmp_path / "1" / "huge.prom", "wb") as out:
        out.truncate(1 << 30)  # sparse: 1 GiB to stat, nothing on disk
    with open(tmp_path / "1" / "huge-pid1.log", "wb") as out:
        out.truncate(1 << 30)
    reader = _reader(tmp_path, max_read_bytes="1M")
    started = time.process_time()
    reading = reader.read(NOW)
    assert time.process_time() - started < 2.0
    _expect(reading, "too_large", warnings)
    assert reading.rejected["backlog_skipped"] == 1  # the JSON lines: only its newest 1 MiB
    assert reading.rejected["oversized_line"] == 1  # ... of zeros, no newline in it


def test_nothing_outside_the_directory_is_read_through_a_symlink(
    tmp_path: Path, warnings: pytest.LogCaptureFixture
) -> None:
    root, outside = tmp_path / "inspector", tmp_path / "outside"
    _good_dump(root)
    _good_dump(outside, "secret")  # valid dumps another user could point at
    secret = next((outside / "secret").iterdir())
    (root / "1" / "linked.prom").symlink_to(secret)
    (root / "2").symlink_to(outside / "secret", target_is_directory=True)
    (root / "3").mkdir()
    (root / "3" / "hard.prom").hardlink_to(secret)
    os.mkfifo(root / "3" / "fifo.prom")  # refused from its lstat, never opened
    reading = _reader(root).read(NOW)
    _expect(reading, "symlink", warnings)
    assert reading.rejected["symlink"] == 2
    assert reading.rejected["hardlink"] == 1 and reading.rejected["not_a_file"] == 1


def test_a_link_planted_in_a_job_directory_keeps_it_and_what_it_points_at(
    tmp_path: Path,
) -> None:
    root, outside = tmp_path / "inspector", tmp_path / "outside"
    _good_dump(marked_root(root))
    outside.mkdir()
    (outside / "keep").write_text("x")
    (root / "1" / "escape").symlink_to(outside, target_is_directory=True)
    (root / "1" / ".ended").touch()
    reader = _reader(root, grace=0)
    for n in range(3):
        reading = reader.read(NOW + n)
    # Not a file the plugin writes: the directory is someone's, never removed (jobdirs).
    assert reading.removed == 0 and reading.directories == {"foreign": 1}
    assert (root / "1" / "escape").is_symlink() and (outside / "keep").read_text() == "x"


def test_non_utf8_bytes_and_a_100_kb_label_cost_only_their_lines(
    tmp_path: Path, warnings: pytest.LogCaptureFixture
) -> None:
    _good_dump(tmp_path)
    (path, *_) = sorted((tmp_path / "1").iterdir())
    data = path.read_bytes()
    huge = b'nccl_bus_bandwidth_gbs{comm_id="' + b"A" * 100_000 + b'"} 1\n'
    path.write_bytes(b'nccl_bus_bandwidth_gbs{comm_id="\xff\xfe"} 1\n' + huge + data)
    (tmp_path / "1" / "x-pid9.log").write_bytes(b'{"header":\xc3\x28}\n' + b"{" * 100_000 + b"\n")
    reading = _reader(tmp_path).read(NOW)
    _expect(reading, "not_utf8", warnings)
    assert reading.rejected["not_utf8"] == 2 and reading.rejected["oversized_line"] == 2


def test_garbage_of_every_kind_is_counted_not_raised(tmp_path: Path) -> None:
    job = tmp_path / "1"
    job.mkdir()
    (job / "a.prom").write_text(
        'nccl_bus_bandwidth_gbs{collective="AllReduce"} not-a-number\n'
        'nccl_bus_bandwidth_gbs{collective="AllToAllv",nranks="2"} 5\n'
        'nccl_collective_exec_time_microseconds{collective="AllToAllv",nranks="2"} 5\n'
        'nccl_bus_bandwidth_gbs{collective="AllReduce",nranks="-3",n_nodes="1"} 5\n'
        'nccl_collective_exec_time_microseconds{collective="AllReduce",nranks="-3",n_nodes="1"} 5\n'
    )
    (job / "b-pid1.log").write_text(
        '[1,2]\n{"header":{"n_ranks":2},"coll_perf":{"coll":"AllReduce","coll_busbw_gbs":"nan"}}\n'
        '{"header":{},"coll_perf":{}}\nnot json\n'
    )
    reading = _reader(tmp_path).read(NOW)
    assert reading.collectives == []
    assert reading.rejected["unparsable"] == 3
    assert reading.rejected["unknown_collective"] == 1
    assert reading.rejected["bad_value"] == 2
    assert reading.rejected["incomplete"] == 1


# -- ended jobs (tests/test_inspector_removal.py) ----------------------------------------------


def test_a_missing_directory_is_counted_and_the_read_goes_on(tmp_path: Path) -> None:
    reading = _reader(tmp_path / "absent").read(NOW)
    assert reading.rejected == {"missing_dir": 1} and reading.collectives == []


def test_too_many_files_are_left_for_later_not_all_opened(tmp_path: Path) -> None:
    job = tmp_path / "1"
    job.mkdir()
    for n in range(50):
        (job / f"f{n}.prom").write_text("")
    reading = _reader(tmp_path, max_files=10).read(NOW)
    assert reading.rejected["too_many_files"] == 1 and reading.files <= 10


def test_a_file_refused_as_a_file_is_counted_once_while_it_stays(tmp_path: Path) -> None:
    _good_dump(tmp_path)
    link = tmp_path / "1" / "linked.prom"
    link.symlink_to("/etc/hostname")
    reader = _reader(tmp_path)
    assert reader.read(NOW).rejected["symlink"] == 1
    assert reader.read(NOW + 30).rejected["symlink"] == 0  # the same link: not again
    link.unlink()
    assert reader.read(NOW + 60).rejected["symlink"] == 0
    link.symlink_to("/etc/hostname")  # planted again: a new one
    assert reader.read(NOW + 90).rejected["symlink"] == 1
