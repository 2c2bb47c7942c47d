"""bench/inspector_bench.py runs end to end and prints one JSON document with its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent / "bench" / "inspector_bench.py"


def test_a_short_run_prints_every_figure() -> None:
    done = subprocess.run(
        # Few reads, one hour, short daemons: the plumbing, not the figures.
        [sys.executable, str(BENCH), "--reads=5", "--hours=1", "--daemon-s=3"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc: dict[str, Any] = json.loads(done.stdout)
    for mode in ("prom", "json"):
        read = doc["read"][mode]
        assert read["collectives_per_read"] == 40
        assert 0 < read["cpu_s_per_read"]["median"] <= read["cpu_s_per_read"]["max"]
    assert doc["read"]["ratio_prom_over_json"] > 0
    assert doc["daemon"]["with_inspector"]["dumps"] >= 2
    (hour,) = doc["memory"]["kept_bytes_each_hour"]
    assert set(hour) == {"inspector", "book", "other"} and hour["inspector"] > 0
