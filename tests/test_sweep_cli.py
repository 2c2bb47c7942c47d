"""`netmon sweep`'s own answers when it cannot sweep: usage errors exit 2 naming the flag or
setting, a scheduler that cannot be asked exits 3 with the JSON report's keys and an error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from netmon.cli import sweep_command, table
from netmon.sweep import report as sweep_report
from netmon.sweep.delivery import textfile
from netmon.sweep.locate.plan import PairPlan
from netmon.sweep.settings import SweepConfig
from netmon.sweep.slurm.scheduler import SlurmScheduler


def _sweep(
    tmp_path: Path, *args: str, config: dict[str, object] | None = None
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "netmon.yaml"
    path.write_text(yaml.safe_dump({"state_dir": str(tmp_path), **(config or {})}))
    # A cluster whose controller refuses every connection: Slurm's clients fail at once.
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=gone\nSlurmctldHost=ctl(127.0.0.1)\nSlurmctldPort=1\nMessageTimeout=2\n"
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    return subprocess.run(
        [sys.executable, "-m", "netmon", "sweep", "--config", str(path), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_without_a_partition_it_says_which_flag(tmp_path: Path) -> None:
    done = _sweep(tmp_path)
    assert done.returncode == 2
    assert "--partition" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_bad_setting_is_named(tmp_path: Path) -> None:
    done = _sweep(tmp_path, "--partition", "p", config={"sweep": {"cohort_ratio": 2}})
    assert done.returncode == 2 and "sweep.cohort_ratio" in done.stderr
    short = tmp_path / "short.secret"
    short.write_text("tiny\n")
    done = _sweep(tmp_path, "--partition", "p", config={"sweep": {"secret_file": str(short)}})
    assert done.returncode == 2 and "sweep.secret_file" in done.stderr
    done = _sweep(tmp_path, "--partition", "p", config={"sweep": {"daemon_username": "u"}})
    assert done.returncode == 2 and "sweep.daemon_password_file" in done.stderr


def test_no_controller_is_exit_3_with_a_json_error(tmp_path: Path) -> None:
    done = _sweep(tmp_path, "--partition", "p", "--json")
    assert done.returncode == 3, done.stderr
    assert "Unable to contact slurm controller" in done.stderr
    report = json.loads(done.stdout)
    assert report["error"] and report["rounds"] == 0 and report["suspects"] == []
    # Every key of a full report (docs/SWEEPS.md says so), and the error.
    assert set(report) == {*sweep_report.KEYS, "error"}
    assert report["partition"] == "p" and report["delivered"] == {} and report["nodes"] == []
    assert "could not run" in done.stderr
    # The history's directory it made for the sweep is gone with the sweep that wrote nothing.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["netmon.yaml", "slurm.conf"]


def test_a_sweep_that_could_not_run_says_so_in_its_textfile(tmp_path: Path) -> None:
    """exit 3 in the textfile too: a sweep host whose sweeps stopped running is visible."""
    prom = tmp_path / "sweep.prom"
    done = _sweep(tmp_path, "--partition", "p", "--textfile", str(prom))
    assert done.returncode == 3
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    assert families["netmon_sweep_report_exit_code"].samples[0].value == 3
    assert families["netmon_sweep_report_suspect"].samples == []


def test_the_textfile_names_every_kind_of_suspect_and_what_is_undecided() -> None:
    whole = {
        "rounds": 5,
        "pairs": [{"outcome": "pass"}, {"outcome": "pass"}, {"outcome": "fail"}],
        "suspects": [
            {"kind": "node", "node": "n3", "rails": [0, 2]},
            {"kind": "path", "node": "n1", "peer": "n2", "rails": [1]},
            {"kind": "uplink", "uplink": "su1/rail0~spine2/rail0", "rails": [0]},
            {"kind": "switch", "switch": "spine4/rail1", "level": "spine", "rails": [1]},
        ],
        "undecided": ["n7"],
        "undecided_uplinks": ["su2/rail1~spine1/rail1"],
    }
    text = generate_latest(textfile.registry_of(whole, 1, 1700000000.0)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    suspects = {
        (s.labels["kind"], s.labels["subject"], s.labels["peer"], s.labels["rail"])
        for s in families["netmon_sweep_report_suspect"].samples
    }
    assert suspects == {
        ("node", "n3", "", "0"),
        ("node", "n3", "", "2"),
        ("path", "n1", "n2", "1"),
        ("uplink", "su1/rail0~spine2/rail0", "", "0"),
        ("switch", "spine4/rail1", "spine", "1"),
    }
    undecided = {
        (s.labels["kind"], s.labels["subject"])
        for s in families["netmon_sweep_report_undecided"].samples
    }
    assert undecided == {("node", "n7"), ("uplink", "su2/rail1~spine1/rail1")}
    pairs = {s.labels["outcome"]: s.value for s in families["netmon_sweep_report_pairs"].samples}
    assert pairs == {"pass": 2, "fail": 1}


def _whole() -> dict[str, Any]:
    """A sweep's report as the runner makes it (netmon.sweep.report.whole), with long node
    names, a long detail and a long note."""
    nodes = [
        f"gpu-h100-rack{r:02d}-node{n:03d}.cluster.example.org" for r in (1, 2) for n in (7, 8)
    ]
    failed = "srun exit 1 (rank 0 on the second node): " + "NCCL WARN NET/IB : Got completion " * 4
    pairs = [
        {"round": 1, "nodes": nodes[:2], "outcome": "ok", "busbw": 48.2e9, "detail": ""},
        {"round": 1, "nodes": nodes[2:], "outcome": "error", "busbw": None, "detail": failed},
        {
            "round": 2,
            "nodes": [nodes[0], nodes[3]],
            "outcome": "low",
            "busbw": 12.5e9,
            "detail": "",
        },
    ]
    return {
        "sweep": "sweep-20260101-000000-abcd",
        "nodes": nodes,
        "rounds": 2,
        "wall_seconds": 812.4,
        "pairs": pairs,
        "suspects": [{"kind": "node", "node": nodes[3], "rails": [0, 1, 2, 3, 4, 5, 6, 7]}],
        "undecided_uplinks": [],
        "notes": ["not delivered to the daemons: sweep.secret_file is not set; " * 3],
    }


def test_the_human_report_fits_120_columns_and_wide_keeps_each_pair_on_one_line() -> None:
    whole = _whole()
    pairs = whole["pairs"]
    lines = sweep_command.human(whole).splitlines()
    assert max(len(line) for line in lines) <= table.WIDTH, lines
    assert lines[1].split() == ["round", "pair", "outcome", "busbw", "GB/s", "detail"]
    # Nothing is cut: the wrapped pieces of each cell are all there, in their column.
    at = lines[1].index("detail")
    table_lines = lines[2 : next(n for n, line in enumerate(lines) if line.startswith("SUSPECT"))]
    assert [line.split()[0] for line in table_lines if line[:5].strip()] == ["1", "1", "2"]
    assert len(table_lines) > 3  # the long cells wrapped
    detail = " ".join(line[at:] for line in table_lines if line[at:])
    assert detail == pairs[1]["detail"].strip()
    nodes = whole["nodes"]
    assert f"  {nodes[0]} -  " in lines[2] and lines[3].strip() == nodes[1]
    note = next(n for n, line in enumerate(lines) if line.startswith("note: "))
    assert lines[note + 1].startswith("  ") and len(lines) == note + 2  # the note, wrapped once
    wide = sweep_command.human(whole, wide=True).splitlines()
    for line, pair in zip(wide[2:5], pairs, strict=True):
        assert " - ".join(pair["nodes"]) in line
        busbw = f"{pair['busbw'] / 1e9:.3f}" if pair["busbw"] else "-"
        assert line.rstrip().endswith(f"{busbw}  {pair['detail']}".rstrip())
    assert wide[5] == f"SUSPECT {nodes[3]}, rails [0, 1, 2, 3, 4, 5, 6, 7]"
    assert max(len(line) for line in wide) > table.WIDTH


def test_a_confirming_pairs_srun_may_take_its_repeats_times_the_pair_timeout(
    tmp_path: Path,
) -> None:
    """The pair's srun --time and its ranks' budget: the launch time, then the run; a locate
    pair measuring 3 times as long gets 3 pair timeouts, so it is not cut as `timeout` exactly
    when its failure would name. No --immediate: a busy queue starts a pair only by backfill."""
    srun = tmp_path / "srun"
    srun.write_text('#!/bin/sh\necho "$NETMON_SWEEP_DEADLINE $NETMON_SWEEP_RUN_S $*"\n')
    srun.chmod(0o755)
    environ = {"PATH": f"{tmp_path}:{os.environ['PATH']}"}
    settings = SweepConfig(pair_timeout=600, launch_timeout=120)
    scheduler = SlurmScheduler(settings, "s", "sweep", environ=environ)
    hard = time.time() + 86400
    launches = [
        scheduler._launch(PairPlan(("a", "b"), 1, 1), 0, hard),
        scheduler._launch(PairPlan(("a", "c"), 2, 1, "locate", repeats=3), 1, hard),
    ]
    for launch, run_s in zip(launches, (600, 1800), strict=True):
        assert launch.process.wait(10) == 0
        deadline, budget, argv = launch.text()[0].split(" ", 2)
        assert float(deadline) == pytest.approx(hard, abs=0.01)
        assert float(budget) == 120 + run_s and launch.clocks.run_s == run_s
        assert f"--time={(120 + run_s + 59) // 60}" in argv.split()
        assert not any(arg.startswith("--immediate") for arg in argv.split())
        assert launch.clocks.launch - launch.submitted_at == pytest.approx(120, abs=1)
