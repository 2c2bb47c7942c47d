"""bench/probe_vs_loop.py runs end to end and prints one JSON document with the promised figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent / "bench" / "probe_vs_loop.py"
SIDES = ("plain_per_op", "netmon_per_op", "plain_batched", "netmon_batched")


def positive(stats: dict[str, float]) -> bool:
    return 0 < stats["min"] <= stats["median"] <= stats["max"]


def test_quick_single_round_prints_a_complete_document() -> None:
    done = subprocess.run(
        # Few samples: this checks the plumbing, not the figures (a full run has 10 rounds).
        [sys.executable, str(BENCH), "--quick", "--rounds=1", "--iters=5", "--batched-iters=4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc: dict[str, Any] = json.loads(done.stdout)  # stdout is the document and nothing else
    assert "round 1" in done.stderr  # progress goes to stderr

    assert doc["setup"]["rounds"] == 1 and doc["setup"]["ranks"] == 2
    assert doc["machine"]["foreign_cpu_share_per_round"]["median"] >= 0
    assert [entry["size_bytes"] for entry in doc["sizes"]] == [8, 1 << 20, 16 << 20]
    for entry in doc["sizes"]:
        for side in SIDES:
            assert positive(entry["latency_s"][side])
            assert positive(entry["busbw_bytes_per_second"][side])
        for timing in ("per_op", "batched"):
            assert positive(entry["ratios"][timing]["busbw"])
            assert positive(entry["ratios"][timing]["latency"])

    assert [t["name"] for t in doc["targets"]] == [
        "busbw_16MiB",
        "latency_8B",
        "latency_8B_same_statistic",
    ]
    for target in doc["targets"]:
        assert target["median_ratio"] > 0 and isinstance(target["met"], bool)
        low, high = target["median_interval"]
        assert 0 < low <= target["median_ratio"] <= high
        assert isinstance(target["conclusive"], bool)
    assert doc["targets_met"] == all(t["met"] for t in doc["targets"])

    fixed = doc["fixed_cost"]
    assert fixed["runs"] == 1
    for key in ("cli_wall_s", "collective_s", "fixed_s", "launcher_outside_collectives_s"):
        assert positive(fixed[key])
    # The whole CLI run is the time inside collectives plus the fixed cost.
    assert fixed["cli_wall_s"]["median"] > fixed["collective_s"]["median"]
    assert positive(fixed["netmon_per_op_phases_s"]["start_and_import"])


def test_both_ways_of_starting_ranks_are_compared_in_each_round() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--quick",
            "--rounds=1",
            "--iters=5",
            "--batched-iters=4",
            "--sizes=8,65536",
            "--rank-start=both",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc: dict[str, Any] = json.loads(done.stdout)
    (round_,) = doc["rounds"]
    assert sorted(round_["order"]) == sorted(
        ["plain", "netmon_per_op", "netmon_batched", "netmon_spawned"]
    )
    compared = doc["fork_vs_spawn"]
    assert [entry["size_bytes"] for entry in compared] == [8, 65536]
    for entry, size in zip(compared, ("8", "65536"), strict=True):
        ratio = entry["forked_over_spawned_busbw"]["median"]
        row = round_["sizes"][size]
        assert ratio == row["netmon_per_op_busbw"] / row["netmon_spawned_busbw"] > 0
    # The CLI's fixed cost is taken as the daemon starts ranks: forked.
    assert "--rank-start=zygote" in doc["fixed_cost"]["command"]
