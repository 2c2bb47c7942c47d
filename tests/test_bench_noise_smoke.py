"""bench/noise_bench.py runs end to end on a short window: a real daemon, the load switched on
and off beside it, every result recorded, nothing left behind (the 30-minute figures are in
docs/BENCHMARKS.md; tests/test_signal_replay.py replays the full run's streams)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "noise_bench.py"


def test_the_noise_bench_records_every_series_with_the_load_on_and_off(tmp_path: Path) -> None:
    streams = tmp_path / "streams.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--minutes", "0.75", "--period", "15", "--streams", streams],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)
    assert document["exit_code"] == 0 and document["leftover_processes"] == []
    assert len(document["series"]) == 5
    # Latency-bound sizes (under 1 MiB) are shown, not judged, by default.
    assert document["series_judged"] == [
        "large/all_reduce/1048576/default/2",
        "large/all_reduce/16777216/default/2",
    ]
    assert document["scrapes"] >= 4
    # The first results of each judged series after the start settle.
    assert document["counters"]["netmon_inconclusive_results_total"]["large/settling"] >= 2
    recorded = json.loads(streams.read_text())["streams"]
    assert set(recorded) == set(document["series"])
    loads = {sample["load"] for samples in recorded.values() for sample in samples}
    assert loads == {True, False}, "the load was never switched on, or never off"
