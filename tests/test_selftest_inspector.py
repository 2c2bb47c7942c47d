"""netmon selftest's inspector row: what could not be checked without a real job's dump, read on
the first GPU node with a configuration that has `inspector:`, and judged."""

from __future__ import annotations

import time
from pathlib import Path

from netmon.inspector.settings import InspectorConfig
from netmon.selftest.inspector import inspector_row
from tests.inspector_files import prom_dump, training_comms


def test_without_inspector_settings_the_row_says_so() -> None:
    row = inspector_row(None)
    assert row.status == "SKIP" and "inspector" in row.detail


def test_a_dump_as_the_plugin_writes_it_passes_and_nothing_is_removed(tmp_path: Path) -> None:
    prom_dump(tmp_path / "7", training_comms(), lambda _c, _g: 300.0, time.time(), 1)
    (tmp_path / "7" / ".ended").touch()  # an ended job: the daemon would remove it, not this
    row = inspector_row(InspectorConfig(dir=tmp_path, grace=0))
    assert row.status == "PASS", row
    assert row.figures["collectives"] == 40 and "all_reduce x8" in row.detail
    assert (tmp_path / "7").is_dir()


def test_a_dump_in_another_format_fails_naming_what_could_not_be_read(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "nccl_inspector_metrics_x.prom").write_text(
        'nccl_bus_bandwidth_gbs{collective="AllReduce",nranks="8",n_nodes="1"} 300\n'
        'nccl_bus_bandwidth_gbs{collective="AllToAll",nranks="8",n_nodes="1"} 300\n'
        'nccl_collective_exec_time_microseconds{collective="AllToAll",nranks="8",n_nodes="1"} 9\n'
    )
    row = inspector_row(InspectorConfig(dir=tmp_path))
    assert row.status == "FAIL", row
    assert "1 x incomplete, 1 x unknown_collective" in row.detail and "report it" in row.detail


def test_no_job_output_yet_is_a_skip_not_a_pass(tmp_path: Path) -> None:
    row = inspector_row(InspectorConfig(dir=tmp_path))
    assert row.status == "SKIP" and "while a job" in row.detail
