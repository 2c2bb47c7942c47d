"""The levels a series is expected at before it has learned its own (netmon.baseline.expect): the
lookup on literal entries, the shipped table as an installed wheel holds it, `expect:` in
netmon.yaml and its errors, and the book the daemon builds on a simulated node and on CPU ranks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from netmon.baseline.expect import (
    TABLE_MIN_SIZE,
    ExpectEntry,
    expectation_for,
    lookup,
    shipped_table,
)
from netmon.config import load_config, parse_config, resolve
from netmon.errors import ConfigError
from netmon.serve.daemon import Daemon
from tests.gpu_node import shipped_node

ROOT = Path(__file__).resolve().parent.parent
H100 = "NVIDIA H100 80GB HBM3"
MIB, GIB = 1 << 20, 1 << 30


def entry(**fields: Any) -> ExpectEntry:
    defaults: dict[str, Any] = {"gpu_model": "H100", "gpus": 8, "size_bytes_min": "64M"}
    return ExpectEntry.model_validate({"busbw": "100G", **defaults, **fields})


def key(size: int, path: str = "default", ranks: int = 8, op: str = "all_reduce") -> Any:
    return ("small", op, size, path, ranks)


# --- the lookup, on literal entries ------------------------------------------------------------


def test_a_model_matches_as_part_of_nvml_name_in_any_case_and_nothing_else() -> None:
    sxm = [entry(gpu_model="h100 80gb hbm3", busbw="300G")]
    assert lookup(sxm, H100, key(64 * MIB)) == 300e9
    assert lookup(sxm, "NVIDIA H100 PCIe", key(64 * MIB)) is None  # another board
    assert lookup(sxm, "NVIDIA H100 NVL", key(64 * MIB)) is None


def test_a_level_holds_from_its_size_up_and_the_nearest_floor_wins() -> None:
    levels = [entry(size_bytes_min="64M", busbw="200G"), entry(size_bytes_min="1G", busbw="250G")]
    assert lookup(levels, H100, key(64 * MIB - 1)) is None  # under every stated size
    assert lookup(levels, H100, key(64 * MIB)) == 200e9
    assert lookup(levels, H100, key(512 * MIB)) == 200e9
    assert lookup(levels, H100, key(GIB)) == 250e9
    assert lookup(levels, H100, key(16 * GIB)) == 250e9


def test_path_ranks_and_op_must_be_the_series_own() -> None:
    levels = [entry(path="nvls", busbw="300G")]
    assert lookup(levels, H100, key(GIB, path="nvls")) == 300e9
    assert lookup(levels, H100, key(GIB, path="default")) is None
    assert lookup(levels, H100, key(GIB, path="nvls", ranks=4)) is None  # gpus: idle took 4
    assert lookup(levels, H100, key(GIB, path="nvls", op="all_gather")) is None


def test_the_most_specific_model_wins_where_both_hold() -> None:
    levels = [entry(gpu_model="A100", busbw="100G"), entry(gpu_model="A100-SXM4", busbw="150G")]
    assert lookup(levels, "NVIDIA A100-SXM4-80GB", key(GIB)) == 150e9
    assert lookup(levels, "NVIDIA A100 80GB PCIe", key(GIB)) == 100e9


def test_site_entries_replace_the_tables_for_the_shapes_they_name() -> None:
    table = [entry(size_bytes_min="64M", busbw="200G"), entry(path="nvls", busbw="260G")]
    site = [entry(gpu_model="H100 80GB", size_bytes_min="1G", busbw="320G")]
    expect = expectation_for(H100, table, site)
    assert expect(key(GIB)) == 320e9
    # The site named this shape from 1G only: the table's 64M level does not come back under it.
    assert expect(key(64 * MIB)) is None
    assert expect(key(GIB, path="nvls")) == 260e9  # a shape the site left to the table
    assert expectation_for("NVIDIA A100-SXM4-80GB", table, site)(key(GIB)) is None


def test_without_a_gpu_model_nothing_is_expected() -> None:
    everything = [entry(gpu_model="a", busbw="1G")]
    assert expectation_for(None, everything, everything)(key(GIB)) is None
    assert expectation_for("", everything, everything)(key(GIB)) is None


# --- the shipped table ------------------------------------------------------------------------


def test_the_shipped_table_states_public_conservative_bandwidth_bound_figures() -> None:
    rows = shipped_table()
    assert {(r.gpu_model, r.gpus, r.path) for r in rows} >= {
        ("H100 80GB HBM3", 8, "nvls"),
        ("H100 80GB HBM3", 8, "default"),
        ("A100-SXM4", 8, "default"),
    }
    for row in rows:
        assert row.source.startswith("https://github.com/"), row
        assert row.size_bytes_min >= TABLE_MIN_SIZE, row  # latency-bound sizes get no entry
        # Conservative: about 70 % of the published figure it was taken from, never the peak.
        assert 0.68 <= row.busbw / row.published_busbw <= 0.72, row
    # Within a shape a larger size never expects less: the published curves rise with size.
    for a in rows:
        for b in rows:
            same = (a.gpu_model, a.gpus, a.op, a.path) == (b.gpu_model, b.gpus, b.op, b.path)
            if same and a.size_bytes_min < b.size_bytes_min:
                assert a.busbw <= b.busbw, (a, b)


def test_a_dgx_h100_expects_nvls_and_ring_safe_default_levels_from_the_table() -> None:
    expect = expectation_for(H100)
    assert expect(key(64 * MIB, path="nvls")) == 262e9
    assert expect(key(GIB, path="nvls")) == 328e9
    # NCCL's default may be Ring where the fabric offers no NVLS: the default floor is Ring's.
    assert expect(key(GIB)) == 259e9
    assert expect(key(64 * MIB)) is None  # no published Ring figure at 64 MiB
    assert expect(key(8)) is None
    assert expectation_for("NVIDIA A100-SXM4-40GB")(key(64 * MIB)) == 143e9


def test_signal_md_renders_every_row_of_the_table_with_its_source() -> None:
    text = (ROOT / "docs" / "SIGNAL.md").read_text()
    section = text.split("## Expected levels", 1)[1].split("\n## ", 1)[0]
    for row in shipped_table():
        line = f"| {row.gpu_model} | {row.gpus} | {row.op} | {row.path} |"
        assert line in section, line
        assert f"{row.busbw / 1e9:g} GB/s" in section
        assert row.source in section


def test_an_installed_wheel_holds_the_table_and_reads_it_from_there(tmp_path: Path) -> None:
    # Built from a copy: setuptools writes build/ and egg-info beside the sources it builds.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "netmon", source / "netmon", ignore=shutil.ignore_patterns("__pycache__")
    )
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("netmon_gpu-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert "netmon/baseline/expected_levels.json" in archive.namelist()
    # The wheel itself on sys.path (zipimport): importlib.resources reads the table from inside
    # it, not from this checkout.
    probe = (
        "import json, netmon; from netmon.baseline.expect import shipped_table; "
        "print(json.dumps([netmon.__file__, len(shipped_table())]))"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(wheel), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    where, rows = json.loads(ran.stdout)
    assert where.startswith(str(wheel)) and rows == len(shipped_table())


# --- expect: in netmon.yaml -------------------------------------------------------------------


def test_expect_entries_are_read_with_sizes_and_rates_as_text() -> None:
    config = parse_config(
        {"expect": [{"gpu_model": "H100", "gpus": 8, "path": "nvls", "size_bytes_min": "256M",
                     "busbw": "350G", "note": "acceptance run, 2026-11"}]}
    )  # fmt: skip
    (level,) = config.expect
    assert (level.size_bytes_min, level.busbw, level.op) == (256 * MIB, 350e9, "all_reduce")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"path": "nvlink"}, "expect[0].path: unknown path 'nvlink'"),
        ({"op": "sendrecv", "path": "ring"}, "expect[0].path: ring does not apply to sendrecv"),
        ({"busbw": "fast"}, "expect[0].busbw: "),
        ({"busbw": 0}, "expect[0].busbw: "),
        ({"gpus": 0}, "expect[0].gpus: "),
        ({"gpus": True}, "expect[0].gpus: True is not a count"),
        ({"size_bytes_min": "1T"}, "expect[0].size_bytes_min: "),
        ({"gpu_model": " "}, "expect[0].gpu_model: give part of the GPU model"),
        ({"source": "https://example.org"}, "expect[0].source: unknown setting; accepted: "),
    ],
)
def test_a_bad_expect_entry_is_one_line_naming_its_field(
    fields: dict[str, Any], message: str
) -> None:
    document = {"gpu_model": "H100", "gpus": 8, "size_bytes_min": "64M", "busbw": "300G"}
    with pytest.raises(ConfigError) as raised:
        parse_config({"expect": [{**document, **fields}]})
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_two_entries_for_one_shape_and_size_are_refused() -> None:
    twice = [{"gpu_model": m, "gpus": 8, "size_bytes_min": s, "busbw": "300G"}
             for m, s in (("H100", "64M"), ("h100", 64 * MIB))]  # fmt: skip
    with pytest.raises(ConfigError, match=r"expect\[1\]: a second entry for h100 x8"):
        parse_config({"expect": twice})


def test_check_config_validates_expect(tmp_path: Path) -> None:
    path = tmp_path / "netmon.yaml"
    path.write_text("expect:\n  - {gpu_model: H100, gpus: 8, size_bytes_min: 64M, busbw: 1x}\n")
    ran = subprocess.run(
        [sys.executable, "-m", "netmon", "check-config", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode != 0
    assert "expect[0].busbw" in ran.stderr and ran.stderr.count("\n") == 1


# --- the daemon's book ------------------------------------------------------------------------


def daemon_config(tmp_path: Path, gpus: int, **updates: Any) -> Any:
    return resolve(load_config(None), gpus).model_copy(
        update={
            "listen": "127.0.0.1:0",
            "state_dir": tmp_path / "state",
            "pause_file": tmp_path / "pause",
            "pause_dir": tmp_path / "pause.d",
            **updates,
        }
    )


def test_the_daemon_on_a_simulated_dgx_expects_the_table_and_the_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped_node(tmp_path, "dgx-h100").activate(monkeypatch)
    site = parse_config(
        {"expect": [{"gpu_model": "H100", "gpus": 8, "size_bytes_min": "64M", "busbw": "280G"}]}
    ).expect
    daemon = Daemon(daemon_config(tmp_path, 8, expect=site))  # NVML's names, from the node file
    try:
        expect = daemon.results.book.expect
        assert expect(("small", "all_reduce", 64 * MIB, "default", 8)) == 280e9  # the site's
        assert expect(("small", "all_reduce", 64 * MIB, "nvls", 8)) == 262e9  # the table's
        assert expect(("small", "all_reduce", 8, "default", 8)) is None
    finally:
        daemon.server.server_close()  # never started: no probe, zygote or serving thread to stop


def test_a_daemon_on_cpu_ranks_expects_nothing(tmp_path: Path) -> None:
    site = parse_config(
        {"expect": [{"gpu_model": "cpu", "gpus": 2, "size_bytes_min": "1M", "busbw": "1G"}]}
    ).expect
    daemon = Daemon(daemon_config(tmp_path, 0, expect=site))
    try:
        assert daemon.config.backend == "gloo"
        assert daemon.results.book.expect(("large", "all_reduce", 16 * MIB, "default", 2)) is None
    finally:
        daemon.server.server_close()  # never started: no probe, zygote or serving thread to stop
