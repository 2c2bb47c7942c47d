"""Verdicts on production-shaped streams, through `netmon replay` (issue 33's acceptance).

Streams come from bench/streams.py with seeds the bench's table does not use (its seeds start
at 1; these at 101): a daily swing starting at its peak, trough or mean; a slow AR(1) wander; a
25 % cut held a day, with a restart in the middle; a healthy 15 % step held three days; a link
at half bandwidth in 2 of every 5 results for two days; a 0.5 %/h decline. One result a minute
and 5 % noise, the default policy. bench/verdict_streams.py runs the same rows over many seeds
(docs/BENCHMARKS.md has its table). The command itself is tested at the end: its JSON lines,
its summary, a Prometheus query_range answer as input, and its one-line errors.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import streams as s

from netmon.baseline import BaselinePolicy
from netmon.serve import replay

H = 3600.0
SEED = 101


def replayed(results: list[dict[str, Any]]) -> list[replay.Replayed]:
    parsed = [replay.parse_result(r, f"result {i}") for i, r in enumerate(results)]
    return list(replay.replay(parsed, BaselinePolicy()))


def index_at(results: list[dict[str, Any]], seconds: float) -> int:
    return next(i for i, r in enumerate(results) if r["t"] - s.T0 >= seconds)


@pytest.mark.parametrize("phase", ["peak", "trough", "mean"])
def test_a_healthy_daily_swing_is_never_paged_whatever_its_start(phase: str) -> None:
    results = list(s.stream(s.Shape(s.swing(0.10, phase), s.no_fault), SEED, days=7))
    flags = [r.verdict.degraded for r in replayed(results)]
    assert sum(flags) / len(flags) < 0.005
    assert max(s.episodes(flags), default=0) < 10  # no episode a 10-minute alert would page on
    assert replayed(results[-1:])  # the stream is not empty


def test_a_healthy_slow_wander_is_degraded_under_1_percent() -> None:
    """Six weeks of wander, a week each. A reference learned on one day of a process that
    wanders on a six-hour timescale can be a few percent off its mean, and the process itself
    dips 2-3 sd for hours now and then: about 2 weeks in 100 are degraded over 1 % of the time
    (docs/SIGNAL.md, "A slow decline against a slow wander"). The first seed is one of them."""
    shares = []
    for seed in range(SEED, SEED + 6):
        rng = random.Random(f"wander/{seed}")
        results = list(s.stream(s.Shape(s.ar1(0.05, 6 * H, 60, rng), s.no_fault), seed, days=7))
        flags = [r.verdict.degraded for r in replayed(results)]
        shares.append(sum(flags) / len(flags))
    assert sum(shares) / len(shares) < 0.01, shares
    assert sum(share >= 0.01 for share in shares) <= 1, shares


@pytest.mark.parametrize("restart", [False, True], ids=["plain", "restart-mid-cut"])
def test_a_25_percent_cut_held_a_day_is_flagged_held_and_cleared(restart: bool) -> None:
    start = 30 * H
    middle = int((start + 12 * H) / 60)
    shape = s.Shape(s.flat, s.held(0.25, start, 24), frozenset({middle} if restart else set()))
    results = list(s.stream(shape, SEED, days=(start + 30 * H) / 86400))
    out = replayed(results)
    begin, end = index_at(results, start), index_at(results, start + 24 * H)
    during = [r.verdict.degraded for r in out[begin:end]]
    assert not any(r.verdict.degraded for r in out[:begin])
    assert during.index(True) < 10
    assert sum(during) / len(during) >= 0.99
    assert [r.verdict.degraded for r in out[end:]].index(False) < 30
    if restart:
        assert results[middle].get("restart") and out[middle].verdict.degraded


def test_a_healthy_step_down_inside_the_tolerance_does_not_stick() -> None:
    start = 30 * H
    results = list(
        s.stream(s.Shape(s.flat, s.held(0.15, start, 1e9)), SEED, (start + 72 * H) / 86400)
    )
    out = replayed(results)
    last_48h = [r.verdict.degraded for r in out[index_at(results, start + 24 * H) :]]
    assert sum(last_48h) / len(last_48h) < 0.01


def test_a_link_flapping_2_of_5_results_is_flagged_flapping_and_held() -> None:
    start = 30 * H
    rng = random.Random(f"flap/{SEED}")
    shape = s.Shape(s.flat, s.flapping(start, 48, 0.5, rng))
    results = list(s.stream(shape, SEED, (start + 50 * H) / 86400))
    out = replayed(results)
    begin, end = index_at(results, start), index_at(results, start + 48 * H)
    during = out[begin:end]
    first = next(i for i, r in enumerate(during) if r.verdict.reason == "flapping")
    assert first < 120  # within 2 hours
    assert sum(r.verdict.degraded for r in during) / len(during) >= 0.9
    # Never 3 bad in a row: the stream is what the issue describes.
    bad = [r.busbw < 0.75 * s.BUSBW for r in (x.result for x in during)]
    assert not any(all(bad[i : i + 3]) for i in range(len(bad) - 2))


@pytest.mark.parametrize("start_h", [30, 75])
def test_a_slow_decline_is_flagged_before_12_percent_and_not_before_8(start_h: float) -> None:
    start = start_h * H
    results = list(
        s.stream(s.Shape(s.flat, s.decline(0.005, start)), SEED, (start + 72 * H) / 86400)
    )
    out = replayed(results)
    first = next(i for i, r in enumerate(out) if r.verdict.degraded)
    loss = 0.005 * (results[first]["t"] - s.T0 - start) / H
    assert 0.08 <= loss < 0.12, loss


# --- the command


def run_replay(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "netmon", "replay", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_replay_prints_a_json_line_per_result_in_input_order(tmp_path: Path) -> None:
    start = 3 * H
    results = list(s.stream(s.Shape(s.flat, s.held(0.4, start, 1)), SEED, days=0.25))
    other = [{**r, "size": 1 << 20, "probe": "small"} for r in results[::2]]
    stream = [*results[: len(results) // 2], *other, *results[len(results) // 2 :]]
    path = tmp_path / "stream.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in stream))
    done = run_replay(str(path), "--json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == len(stream)
    assert [line["t"] for line in lines] == [r["t"] for r in stream]
    assert {"t", "series", "verdict", "reason", "expected", "reference", "low_line"} <= set(
        lines[0]
    )
    assert {line["verdict"] for line in lines} <= {
        "learning",
        "young",  # a baseline, but fewer than a window of results: checked for a cut
        "healthy",
        "degraded",
        "inconclusive",
    }
    large = [line for line in lines if line["series"].startswith("large/")]
    assert [line["verdict"] for line in large[:2]] == ["inconclusive", "inconclusive"]
    assert large[0]["reason"] == "settling"
    cut = [line for line in large if line["t"] - s.T0 >= start][:10]
    assert any(line["verdict"] == "degraded" and line["reason"] in ("low", "drift") for line in cut)
    # The same stream as a summary: a line per series.
    summary = run_replay(str(path))
    assert summary.returncode == 0, summary.stderr
    assert len(summary.stdout.splitlines()) == 2
    assert "large/all_reduce/268435456/default/8:" in summary.stdout and "[low" in summary.stdout


def test_replay_reads_prometheus_range_queries_appended_and_stdin() -> None:
    results = list(s.stream(s.Shape(s.flat, s.no_fault), SEED, days=0.05))
    labels = {"probe": "large", "op": "all_reduce", "size_bytes": "268435456", "path": "default"}

    def answer(part: list[dict[str, Any]]) -> str:
        # Scraped every 15 s: each result repeats until the next one.
        values = [[r["t"] + 15 * k, repr(r["busbw"])] for r in part for k in range(4)]
        metric = {"__name__": "netmon_busbw_bytes_per_second", **labels, "ranks": "8"}
        document = {"resultType": "matrix", "result": [{"metric": metric, "values": values}]}
        return json.dumps({"status": "success", "data": document})

    half = len(results) // 2
    # A long range fetched in two chunks, one answer a line, the later chunk first.
    done = run_replay("-", "--json", stdin=f"{answer(results[half:])}\n{answer(results[:half])}\n")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == len(results)  # one per result, not one per scrape
    assert [line["t"] for line in lines] == [r["t"] for r in results]  # in time order
    assert lines[-1]["verdict"] == "healthy"
    # One answer alone, pretty-printed over many lines, is read whole.
    pretty = json.dumps(json.loads(answer(results)), indent=2)
    assert len(run_replay("-", "--json", stdin=pretty).stdout.splitlines()) == len(results)
    # Two nodes' series in one answer would be replayed as one: refused.
    both = json.loads(answer(results))
    both["data"]["result"] *= 2
    refused = run_replay("-", stdin=json.dumps(both))
    assert refused.returncode == 2 and "query one instance at a time" in refused.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '{"t": 1, "probe": "p", "op": "all_reduce", "size": 8, "ranks": 2, "path": "d"}\n',
            "busbw",
        ),
        (
            '{"t": 1, "probe": "p", "op": "o", "size": -1, "ranks": 2, "path": "d", "busbw": 1}\n',
            "size",
        ),
        ("not json\n", "not JSON"),
        ("", "no results"),
        (
            '{"t": 1, "probe": "p", "op": "o", "size": 8, "ranks": 2, "path": "d", "busbw": 1, '
            '"cpu": 2}\n',
            "cpu",
        ),
    ],
)
def test_replay_refuses_bad_input_in_one_line_naming_the_field(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "stream.jsonl"
    path.write_text(content)
    done = run_replay(str(path))
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert message in line and (not content or "stream.jsonl:1" in line), line


def test_replay_reads_json_lines_from_stdin_as_from_a_file(tmp_path: Path) -> None:
    # Read twice (the intervals, then the replay): stdin goes to a temporary file first.
    results = list(s.stream(s.Shape(s.flat, s.held(0.4, 0.5 * H, 1)), SEED, days=0.1))
    text = "".join(json.dumps(r) + "\n" for r in results)
    path = tmp_path / "stream.jsonl"
    path.write_text(text)
    from_file = run_replay(str(path), "--json")
    from_stdin = run_replay("-", "--json", stdin=text)
    assert from_file.returncode == 0 and from_stdin.returncode == 0, from_stdin.stderr
    assert len(from_file.stdout.splitlines()) == len(results)
    assert from_stdin.stdout == from_file.stdout


def test_replay_checks_every_line_before_it_prints_one(tmp_path: Path) -> None:
    # The results are replayed as they are read, but only once all of them have been checked.
    results = list(s.stream(s.Shape(s.flat, s.no_fault), SEED, days=0.1))
    bad = {**results[-1], "busbw": -1}
    path = tmp_path / "stream.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*results, bad]))
    done = run_replay(str(path), "--json")
    assert done.returncode == 2
    assert done.stdout == ""
    assert f"stream.jsonl:{len(results) + 1}" in done.stderr and "busbw" in done.stderr


def test_a_result_checked_plainly_is_one_the_model_takes_as_it_is() -> None:
    # The first reading checks a plain result without a model (replay.plain): only what
    # StreamResult takes unchanged may pass; anything else goes to the model and its errors.
    rng = random.Random(SEED)
    base = next(s.stream(s.Shape(s.flat, s.no_fault), SEED, days=0.01))
    assert replay.plain(base)  # what bench/streams.py and the export write
    values: list[object] = [None, True, 0, 1, -1, 0.0, -0.0, 0.5, 1.0, 2.0, -1.5, float("nan")]
    values += [float("inf"), "", "p", 2**70, [], {}]
    for _ in range(3000):
        document = dict(base)
        for key in rng.sample([*base, "cpu", "cv", "restart", "time_s"], rng.randint(1, 3)):
            if rng.random() < 0.2:
                document.pop(key, None)
            else:
                document[key] = rng.choice(values)
        if not replay.plain(document):
            continue
        parsed = replay.parse_result(document, "result")  # never refused
        given = {k: v for k, v in document.items() if k in replay.StreamResult.model_fields}
        assert {k: getattr(parsed, k) for k in given} == given, document
        assert all(type(getattr(parsed, k)) is type(v) for k, v in given.items()), document
