"""bench/daemon_bench.py --quick runs end to end and its JSON document makes sense."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "daemon_bench.py"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    # About 30 s on an idle 2-core machine, 50 s on a busy one; the bound is generous.
    bench = subprocess.Popen(
        [sys.executable, str(BENCH), "--quick"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = bench.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        # SIGTERM first: the bench then stops the daemon and servers it started.
        bench.terminate()
        try:
            bench.communicate(timeout=30)
        finally:
            bench.kill()
            bench.communicate()
        raise AssertionError("bench/daemon_bench.py --quick took over 150 s") from None
    assert bench.returncode == 0, stderr[-3000:]
    result: dict[str, Any] = json.loads(stdout)
    return result


def test_top_level(document: dict[str, Any]) -> None:
    assert document["benchmark"] == "daemon"
    assert document["quick"] is True
    assert {"machine", "memory", "metrics", "duty_cycle", "elapsed_s"} <= set(document)
    assert document["machine"]["cpus"] >= 1


def test_memory_of_the_daemon(document: dict[str, Any]) -> None:
    memory = document["memory"]
    rss = memory["rss_kib"]
    assert 0 < rss["start"] <= rss["max"] and 0 < rss["end"] <= rss["max"]
    assert rss["growth"] == rss["end"] - rss["start"]
    assert memory["hwm_kib"]["end"] >= rss["max"]
    # The daemon never maps torch or CUDA, while the ranks it starts do (the check can see it).
    assert memory["torch_or_cuda_mapped"] == []
    assert memory["maps_checked"] >= 10
    assert memory["control_rank_mapped"], "no rank was caught with torch mapped"
    assert sum(memory["runs"].values()) >= 1
    assert set(memory["runs"]) == {"small", "large"}
    assert memory["scrapes"]["count"] >= 10 and memory["scrapes"]["series_lines"] > 0
    assert memory["exit_code"] == 0
    assert memory["leftover_processes"] == []
    assert len(memory["samples"]) == memory["maps_checked"]


def test_metrics_latency(document: dict[str, Any]) -> None:
    metrics = document["metrics"]
    assert metrics["node"]["series_points"] == 2 * (4 + 3) + 28 * 2 * 2
    assert metrics["series_lines"] > 1000
    assert metrics["series_lines"] == sum(metrics["lines_by_metric"].values())
    assert metrics["response_bytes"] > 0
    assert metrics["in_process"]["generate_latest_s"]["p50"] > 0
    linked = metrics["exporter_pair_model"]
    assert linked["series_lines"] == sum(linked["lines_by_metric"].values()) > 0
    assert linked["lines_by_metric"]["netmon_link_busbw_bytes_per_second"] == 2 * 28 * 2
    assert linked["in_process_generate_latest_s"]["p50"] > 0
    both = [*metrics["levels"], *metrics["levels_rendered_per_scrape"]]
    assert [level["concurrency"] for level in both] == [1, 4, 16] * 2
    assert len(metrics["p50_ratio_per_scrape_vs_per_snapshot"]) == 3
    for level in both:
        assert level["error_count"] == 0
        assert level["requests"] > 0 and level["requests_per_second"] > 0
        latency = level["latency_s"]
        assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
        # Served from the same snapshot as the in-process rendering.
        assert level["response_bytes"] == [metrics["response_bytes"]]


def test_duty_cycle(document: dict[str, Any]) -> None:
    duty = document["duty_cycle"]
    assert duty["failures"] == []
    # As the daemon runs them: every rank forked by a rank zygote started beforehand.
    assert duty["rank_start"] == "zygote"
    assert duty["ranks_started"]["spawn"] == 0 and duty["ranks_started"]["fork"] >= 4
    assert set(duty["probes"]) == {"small", "large"}
    for probe in duty["probes"].values():
        assert probe["wall_s_median"] > 0 and probe["interval_s"] > 0
        assert probe["duty"] == pytest.approx(probe["wall_s_median"] / probe["interval_s"])
    assert 0 < duty["duty"] < 1
    assert duty["device_seconds_per_hour"] > 0
    reference = duty["gpu_default_reference"]
    assert reference["run"] is False
    assert [p["name"] for p in reference["schedule"]] == ["small", "large"]
