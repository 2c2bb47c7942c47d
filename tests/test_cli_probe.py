"""`netmon probe` as users run it: a real subprocess, real ranks, exit codes and documents."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from netmon.cli import report, table
from netmon.config import NetmonConfig, ProbeConfig
from netmon.probe.build import build_spec
from netmon.probe.spec import ProbeEnvironment, ProbeFailure, ProbeOutcome, SizeResult
from tests.terminal import read_all

NETMON = [sys.executable, "-m", "netmon"]
# The probe table's columns: by default, and with --wide.
COLUMNS = ["size", "count", "type", "chunks", "time", "algbw", "busbw", "p10", "p90", "cv"]
COLUMNS += ["check"]
WIDE = ["size", "count", "type", "chunks", "time", "algbw", "busbw", "min", "p10", "p90", "max"]
WIDE += ["cv", "n", "check"]


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NETMON, *args], capture_output=True, text=True, timeout=timeout)


def test_acceptance_command_prints_one_json_document() -> None:
    done = run(
        "probe",
        "--backend",
        "gloo",
        "--ranks",
        "2",
        "--op",
        "all_reduce",
        "--sizes",
        "8,64K,16M",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    assert [r["size_bytes"] for r in doc["results"]] == [8, 65536, 16 << 20]
    for result in doc["results"]:
        for key in (
            "op",
            "size_bytes",
            "time_s",
            "algbw_bytes_per_second",
            "busbw_bytes_per_second",
            "cv",
            "samples",
        ):
            assert key in result
        assert result["op"] == "all_reduce" and result["time_s"] > 0 and result["samples"] == 20
        assert result["busbw_bytes_per_second"] == pytest.approx(result["algbw_bytes_per_second"])
    env = doc["environment"]
    assert env["backend"] == "gloo" and env["ranks"] == 2 and env["torch"] and env["host"]
    assert "nccl" in env
    assert doc["failures"] == []
    # Progress goes to stderr, never into the document.
    assert "[3/3]" in done.stderr


def test_rank_stat_mean_is_named_in_the_table_and_every_ranks_median_is_in_the_json() -> None:
    common = ("probe", "--backend", "gloo", "--ranks", "3", "--sizes", "1K", "-n", "3", "-w", "1")
    done = run(*common, "--rank-stat", "mean")
    assert done.returncode == 0, done.stderr
    # The heading's second line says how a size was timed (one line with --wide).
    assert done.stdout.splitlines()[1].endswith("(mean over ranks)")
    doc = json.loads(run(*common, "--json").stdout)
    assert len(doc["results"][0]["rank_medians_s"]) == 3
    wrong = run(*common, "--rank-stat", "median")
    assert wrong.returncode == 2 and "--rank-stat" in wrong.stderr


def test_table_looks_like_nccl_tests() -> None:
    common = ("probe", "--backend", "gloo", "--sizes", "1K,4K", "-n", "3", "-w", "1", "-c")
    done = run(*common)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if "algbw" in line)
    assert header.split() == ["#", *COLUMNS]
    rows = [line.split() for line in lines if not line.startswith("#") and line.strip()]
    assert [row[0] for row in rows] == ["1024", "4096"]
    assert all(row[2] == "float" and row[-1] == "ok" for row in rows)
    assert "Avg bus bandwidth" in done.stdout
    assert max(len(line) for line in lines) <= table.WIDTH
    wide = run(*common, "--wide", "-q")
    assert wide.returncode == 0, wide.stderr
    header = next(line for line in wide.stdout.splitlines() if "algbw" in line)
    assert header.split() == ["#", *WIDE]
    rows = [line.split() for line in wide.stdout.splitlines() if not line.startswith("#")]
    assert [row[12] for row in rows if row] == ["3", "3"]  # n: the samples of each size


# ---- the tables from made-up outcomes: long cells, the 120 columns and --wide ----


def made_up_outcome(failed: bool = False) -> ProbeOutcome:
    """An 8-GPU NCCL probe's outcome, with each GPU named by UUID and a long failure."""
    node = NetmonConfig(backend="nccl", devices=[str(i) for i in range(8)])
    spec = build_spec(ProbeConfig(name="cli", op="reduce_scatter", sizes=[8, 1 << 30]), node)
    uuids = tuple(f"GPU-{i}a3c5e7f-1b2d-4f6a-8c9e-0123456789ab" for i in range(8))
    environment = ProbeEnvironment(
        netmon="0.1.0",
        torch="2.13.0",
        backend="nccl",
        nccl="2.27.5",
        ranks=8,
        host="dgx-h100-node-0042.cluster.example.org",
        devices=uuids,
    )
    results = tuple(
        SizeResult(
            op="reduce_scatter",
            size_bytes=size,
            count=size // 4,
            dtype="float32",
            chunks=1,
            time_s=time_s,
            min_s=time_s * 0.9,
            p10_s=time_s,
            p90_s=time_s * 1.1,
            max_s=time_s * 1.5,
            cv=0.02,
            samples=20,
            algbw_bytes_per_second=size / time_s,
            busbw_bytes_per_second=size / time_s * 7 / 8,
            bus_factor=7 / 8,
        )
        for size, time_s in ((8, 21.3e-6), (1 << 30, 12345.678e-3))
    )
    failure = ProbeFailure(
        phase="measure",
        rank=5,
        cause="exception",
        detail="RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error "
        "(run with NCCL_DEBUG=INFO for details), NCCL version 2.27.5; last error: socket "
        "connect to 10.0.0.17<43211> failed: connection refused",
    )
    return ProbeOutcome(
        spec=spec,
        results=results,
        started_at=0.0,
        wall_s=30.0,
        collective_s=24.7,
        environment=environment,
        failure=failure if failed else None,
    )


def test_the_table_fits_120_columns_and_wide_shows_every_column_on_one_line() -> None:
    outcome = made_up_outcome(failed=True)
    assert outcome.environment is not None
    uuids = outcome.environment.devices
    lines = report.table(outcome).splitlines()
    assert max(len(line) for line in lines) <= table.WIDTH, lines
    assert next(line for line in lines if "algbw" in line).split()[1:] == COLUMNS
    # Every device and the whole failure are still there, wrapped into "#" lines.
    text = " ".join(line.lstrip("# ") for line in lines if line.startswith("#"))
    assert all(uuid in text.split(", ") for uuid in uuids[1:-1])
    assert "connect to 10.0.0.17<43211> failed: connection refused" in text
    assert lines[0].startswith("# netmon probe: reduce_scatter, path default, backend nccl")
    assert lines[1].startswith("# timing batched x5, warmup 5, 20 samples per size")
    wide = report.table(outcome, wide=True).splitlines()
    assert wide[0].endswith(
        ", float32, timing batched x5, warmup 5, 20 samples per size (max over ranks)"
    )
    header = next(line for line in wide if "algbw" in line).split()
    assert header[1:] == WIDE
    assert any(",".join(uuids) in line for line in wide)
    assert wide[-1].startswith("# FAILED: ") and "connection refused" in wide[-1]
    row = next(line for line in wide if line.strip().startswith("1073741824")).split()
    assert row[7:9] == ["11111110.20", "12345678.00"]  # min and p10, in us
    assert max(len(line) for line in wide) > table.WIDTH


def test_default_backend_is_announced_on_stderr() -> None:
    done = run("probe", "--sizes", "8", "-n", "2", "-w", "0", "--json")
    assert done.returncode == 0, done.stderr
    assert "using gloo with 2 CPU ranks" in done.stderr
    assert json.loads(done.stdout)["environment"]["ranks"] == 2


def test_health_gate_exit_codes() -> None:
    healthy = run("probe", "--backend", "gloo", "--sizes", "8,1M", "-n", "3", "--min-busbw", "1K")
    assert healthy.returncode == 0, healthy.stderr
    sick = run("probe", "--backend", "gloo", "--sizes", "8,1M", "-n", "3", "--min-busbw", "1T")
    assert sick.returncode == 1
    assert "UNHEALTHY" in sick.stderr and "1M" in sick.stderr


def test_sweep_flags_like_nccl_tests() -> None:
    done = run(
        "probe", "--backend", "gloo", "-b", "1K", "-e", "16K", "-f", "4", "-n", "2", "--json"
    )
    assert done.returncode == 0, done.stderr
    assert [r["size_bytes"] for r in json.loads(done.stdout)["results"]] == [1024, 4096, 16384]


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--sizes", "8,1X"], "--sizes"),
        (["--op", "allreduce"], "--op"),
        (["--min-busbw", "fast"], "--min-busbw"),
        (["--min-busbw", "150"], "--min-busbw: rate '150' is 150 bytes/s, under 1 MB/s"),
        (["--env", "NOEQUALS"], "--env"),
        (["--ranks", "0"], "--ranks"),
        (["--timeout", "soon"], "--timeout"),
        (["--sizes", "8", "-b", "8"], "--sizes"),
        (["--dtype", "int8"], "--dtype"),
        (["--iters", "0"], "--iters"),
    ],
)
def test_usage_errors_are_one_line_naming_the_flag(args: list[str], names: str) -> None:
    done = run("probe", "--backend", "gloo", *args, timeout=30)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert names in lines[0] and "Traceback" not in done.stderr


def test_a_probe_that_cannot_finish_exits_3() -> None:
    done = run(
        "probe", "--backend", "gloo", "--sizes", "64M", "-n", "200", "--timeout", "4s", "--json"
    )
    assert done.returncode == 3
    doc = json.loads(done.stdout)
    assert doc["failures"][0]["cause"] == "timeout"
    assert "failed" in done.stderr


def test_textfile_is_prometheus_text_written_atomically(tmp_path: Path) -> None:
    target = tmp_path / "netmon.prom"
    done = run(
        "probe",
        "--backend",
        "gloo",
        "--sizes",
        "8,64K",
        "-n",
        "2",
        "-q",
        "--textfile",
        str(target),
        "--name",
        "slurm_check",
        "--min-busbw",
        "1K",
    )
    assert done.returncode == 0, done.stderr
    samples = {
        (s.name, s.labels.get("size_bytes")): s.value
        for family in text_string_to_metric_families(target.read_text())
        for s in family.samples
    }
    assert samples[("netmon_busbw_bytes_per_second", "65536")] > 0
    assert samples[("netmon_busbw_threshold_bytes_per_second", "65536")] == 1000.0
    assert samples[("netmon_probe_runs_total", None)] == 1.0
    assert [p.name for p in tmp_path.iterdir()] == ["netmon.prom"]  # no temporary left
    unwritable = run(
        "probe",
        "--backend",
        "gloo",
        "--sizes",
        "8",
        "-n",
        "1",
        "-q",
        "--textfile",
        str(tmp_path / "missing" / "x.prom"),
    )
    assert unwritable.returncode == 2 and "--textfile" in unwritable.stderr
    assert "warning" not in done.stderr + unwritable.stderr  # both end in .prom
    # A name node_exporter's collector never reads: written, with a warning first; and with no
    # --backend (gloo here) under -q, nothing else on stderr.
    unread = run(
        "probe", "--sizes", "8", "-n", "1", "-q",
        "--textfile", str(tmp_path / "netmon.txt"),
    )  # fmt: skip
    assert unread.returncode == 0 and (tmp_path / "netmon.txt").is_file(), unread.stderr
    assert unread.stderr.startswith("netmon: warning: --textfile ") and ".prom" in unread.stderr
    assert unread.stderr.count("\n") == 1, unread.stderr


def test_textfile_labels_each_path_variant_with_its_own_path(tmp_path: Path) -> None:
    target = tmp_path / "netmon.prom"
    done = run(
        "probe",
        "--backend",
        "gloo",
        "--ranks",
        "2",
        "--sizes",
        "1K",
        "--paths",
        "default,pcie",
        "-n",
        "2",
        "-w",
        "1",
        "-q",
        "--textfile",
        str(target),
    )
    assert done.returncode == 0, done.stderr
    samples = [
        sample
        for family in text_string_to_metric_families(target.read_text())
        for sample in family.samples
        if sample.name == "netmon_busbw_bytes_per_second"
    ]
    # One sample per path, as the daemon exports them: not two samples both labelled "default".
    assert sorted(s.labels["path"] for s in samples) == ["default", "pcie"]
    assert all(s.labels["size_bytes"] == "1024" and s.value > 0 for s in samples)


def test_path_variants_in_one_call_and_a_plot(tmp_path: Path) -> None:
    picture = tmp_path / "busbw.png"
    done = run(
        "probe",
        "--backend",
        "gloo",
        "--sizes",
        "1K,64K",
        "-n",
        "2",
        "-w",
        "1",
        "--paths",
        "default,pcie",
        "--json",
        "-q",
        "--plot",
        str(picture),
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert sorted({(r["path"], r["size_bytes"]) for r in doc["results"]}) == [
        ("default", 1024),
        ("default", 65536),
        ("pcie", 1024),
        ("pcie", 65536),
    ]
    pcie = next(p for p in doc["probes"] if p["spec"]["path"] == "pcie")
    assert dict(pcie["spec"]["env"])["NCCL_P2P_DISABLE"] == "1"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # As a table, the pcie variant says what it is on gloo: the default path again.
    shown = run("probe", "--backend", "gloo", "--sizes", "1K", "-n", "2", "-w", "1", "--paths",
                "default,pcie", "-q")  # fmt: skip
    default, pcie_table = shown.stdout.split("\n\n")
    assert "gloo ignores" not in default and "path pcie on gloo" in pcie_table
    bad = run("probe", "--backend", "gloo", "--paths", "default,warp", timeout=30)
    assert bad.returncode == 2 and "--paths" in bad.stderr


def test_plot_without_matplotlib_fails_before_measuring_with_a_hint_that_works() -> None:
    # As on an install without the plot extra: matplotlib cannot be imported.
    code = (
        "import sys; sys.modules['matplotlib'] = None; from netmon.cli.main import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "probe",
            "--backend",
            "gloo",
            "--sizes",
            "256M",
            "-n",
            "50",
            "--plot",
            "/tmp/never.png",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 20  # 50 x 256 MiB on gloo would take minutes
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "--plot: needs matplotlib" in line and "pip install matplotlib" in line
    assert "netmon-gpu[plot]" not in line  # not on PyPI: the hint must work as written


def test_on_an_80_column_terminal_the_table_fits_it(tmp_path: Path) -> None:
    import os
    import pty

    leader, follower = pty.openpty()  # stdout is a terminal, as a person's shell gives
    env = {**os.environ, "COLUMNS": "80"}
    done = subprocess.run(
        [sys.executable, "-m", "netmon", "probe", "--backend", "gloo", "--sizes", "8,1M", "-q"],
        stdout=follower,
        stderr=subprocess.PIPE,
        env=env,
        timeout=120,
    )
    os.close(follower)
    output = read_all(leader)
    assert done.returncode == 0, done.stderr
    lines = output.decode().replace("\r\n", "\n").splitlines()
    assert any(line.strip().startswith("1048576") for line in lines), lines
    assert max(len(line) for line in lines) <= 80, lines
    heading = next(line for line in lines if "busbw" in line and "size" in line)
    assert "p10" in heading and "count" not in heading  # the spread kept, nccl-tests' count not
