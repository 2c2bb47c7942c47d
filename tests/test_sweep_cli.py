"""`netmon sweep`'s own answers when it cannot sweep: usage errors exit 2 naming the flag or
setting, a scheduler that cannot be asked exits 3 with the JSON report's keys and an error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml


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
    assert {"pairs", "results", "skips", "undecided"} <= set(report)
    assert "could not run" in done.stderr
