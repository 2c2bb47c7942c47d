"""bench/replay_bench.py runs end to end and prints one JSON document with the promised figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "replay_bench.py"


def test_quick_run_prints_cpu_memory_and_the_cost_per_result() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc: dict[str, Any] = json.loads(done.stdout)  # stdout is the document and nothing else
    assert "month this run 1" in done.stderr  # progress goes to stderr
    streams = doc["streams"]
    assert set(streams) == {"month", "week20"} and all(set(s) == {"this"} for s in streams.values())
    month, week = streams["month"]["this"], streams["week20"]["this"]
    assert month["results"] == 1440  # a day of one series, a result a minute
    assert month["summary_cpu_s"] > 0 and month["observe_us"] > 0
    (run,) = month["runs"]
    assert run["observe"]["netmon"] == str(ROOT / "netmon")  # this checkout's, measured
    for figures in (month, week):
        assert figures["json_cpu_s"] > 0
        assert 10 < figures["max_rss_mb"] < 1000
