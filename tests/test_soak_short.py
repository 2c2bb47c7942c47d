"""The soak benchmark's short variant: 45 s of one-second probes, and no growth past bounds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parent.parent / "bench" / "soak.py"


def test_45_seconds_of_one_second_probes_grow_nothing() -> None:
    done = subprocess.run(
        [sys.executable, str(SOAK), "--minutes", "0.75", "--every", "1", "--warmup", "15"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["counters"]["runs"] >= 5, report["counters"]
    assert report["daemon_exit_status"] == 0
    assert report["within_bounds"] == dict.fromkeys(report["bounds"], True), report[
        "growth_after_warmup"
    ]
    assert report["passed"]
    assert len(report["samples"]) >= 10
