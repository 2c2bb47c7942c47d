"""Healthy streams recorded on a busy node replayed through the verdict (issue 16).

tests/fixtures/healthy_streams.json holds every result of every series of a healthy daemon
(gloo, 2 CPU ranks, `small` [8, 1K, 64K] every 5 s and `large` [1M, 16M] every 10 s) over
30 minutes, with a CPU-bound process beside it switched on and off every 2 minutes: recorded by
`python bench/noise_bench.py --streams tests/fixtures/healthy_streams.json`. Replayed through
the default policy they give no verdict, and Prometheus, fed the replayed `netmon_degraded`
(with each result's `netmon_measurement_timestamp_seconds`, which the alert checks for age),
fires no NetmonBusbwDegraded; the same stream with its link cut to 60% does both.

Issue 23: the same streams again, round and round, with the link cut to 0.75x or 0.6x and held
for 1,000 results: flagged, never cleared while held, cleared once the cut ends, and the reference
never moves; Prometheus fires NetmonBusbwDegraded once the verdict has held for 10 minutes and 2
of its probe's intervals (netmon_degraded_since_timestamp_seconds) and keeps firing to the end.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from netmon.baseline import BaselineBook, BaselineKey, BaselinePolicy, Verdict
from netmon.config import parse_config
from tests.tools import RULES, promtool, run

STREAMS = Path(__file__).resolve().parent / "fixtures" / "healthy_streams.json"
# Issue 23: a second recording, with the rule of that issue and its foreign-CPU definition.
STREAMS_2 = STREAMS.with_name("healthy_streams_2.json")
# Issue 33: a third, on which the daemon itself paged (the baseline learned only the results
# over its healthy line, and a long upper tail raised it): replayed, it must not.
STREAMS_3 = STREAMS.with_name("healthy_streams_3.json")
RECORDINGS = {"1": STREAMS, "2": STREAMS_2, "3": STREAMS_3}
STEP_S = 10  # the scrape interval the promtool test uses
LARGEST = "large/all_reduce/16777216/default/2"


def streams(path: Path = STREAMS) -> dict[str, list[dict[str, Any]]]:
    document: dict[str, Any] = json.loads(path.read_text())
    recorded: dict[str, list[dict[str, Any]]] = document["streams"]
    return recorded


def key_of(series: str) -> BaselineKey:
    probe, op, size, path, ranks = series.split("/")
    return (probe, op, int(size), path, int(ranks))


def replay(
    samples: list[dict[str, Any]], key: BaselineKey, policy: BaselinePolicy | None = None
) -> Iterator[tuple[dict[str, Any], Verdict]]:
    # Recorded on CPU ranks: judged as the daemon there judges (BaselinePolicy.for_ranks).
    book = BaselineBook(policy or BaselinePolicy().for_ranks("gloo"))
    for sample in samples:
        yield sample, book.observe(key, sample["busbw"], sample["cv"], sample["foreign_cpu"])


def cut(samples: list[dict[str, Any]], to: float, results: int) -> list[dict[str, Any]]:
    """The stream, then `results` more quiet results of its link at `to` of its rate."""
    # The latest quiet results, again and again: the machine's own level drifts over half an
    # hour, and the cut is of the link as it is now.
    quiet = itertools.cycle([s for s in samples if not s["load"]][-10:])
    last = samples[-1]["t"]
    return samples + [
        {**s, "t": last + 10 * (i + 1), "busbw": s["busbw"] * to, "load": False}
        for i, s in zip(range(results), quiet, strict=False)
    ]


def test_the_fixture_is_a_long_healthy_run_with_the_load_on_and_off() -> None:
    recorded = streams()
    assert set(recorded) >= {LARGEST, "small/all_reduce/8/default/2"}
    for series, samples in recorded.items():
        minutes = (samples[-1]["t"] - samples[0]["t"]) / 60
        assert minutes >= 25, (series, minutes)
        under_load = [s for s in samples if s["load"]]
        assert len(under_load) >= len(samples) / 3, series
        assert not any(s["degraded"] for s in samples), f"the daemon itself paged on {series}"
        if key_of(series)[2] >= 1 << 20:
            # The load shows in the recorded figure: other processes held a core's worth or so.
            # (Smaller sizes measure for under 0.1 s: too short for /proc/stat's clock ticks.)
            disturbed = [s for s in under_load if (s["foreign_cpu"] or 0.0) >= 0.25]
            assert len(disturbed) >= len(under_load) * 0.8, series


@pytest.mark.parametrize(
    ("recording", "series"),
    [
        pytest.param(path, series, id=f"{name}-{series}")
        for name, path in RECORDINGS.items()
        for series in sorted(json.loads(path.read_text())["streams"])
    ],
)
def test_a_healthy_stream_replayed_gives_no_verdict(recording: Path, series: str) -> None:
    replayed = list(replay(streams(recording)[series], key_of(series)))
    assert not any(v.degraded for _, v in replayed), [
        v.explain() for _, v in replayed if v.degraded
    ]
    # Results under the load are inconclusive ("disturbed"), never low and never learned.
    disturbed = [
        v for s, v in replayed if (s["foreign_cpu"] or 0.0) >= 0.25 and v.inconclusive != "settling"
    ]
    assert all(v.inconclusive == "disturbed" for v in disturbed)
    if key_of(series)[2] >= 1 << 20:
        assert disturbed, "the load beside this series was never seen"


def test_the_same_stream_cut_to_60_percent_degrades_within_five_results() -> None:
    samples = streams()[LARGEST]
    replayed = [v for _, v in replay(cut(samples, 0.6, 5), key_of(LARGEST))]
    assert not any(v.degraded for v in replayed[: len(samples)])
    assert any(v.degraded for v in replayed[len(samples) :]), [
        v.explain() for v in replayed[len(samples) :]
    ]


JUDGED = sorted(
    name
    for name in json.loads(STREAMS.read_text())["streams"]
    if BaselinePolicy().for_ranks("gloo").judges(key_of(name)[2])
)
HELD = 1000  # results a cut is held for
AFTER = 80  # results after it ends (half may be disturbed: the recording's load)


def held_cut(
    samples: list[dict[str, Any]], to: float, offset: int, held: int = HELD, after: int = AFTER
) -> list[dict[str, Any]]:
    """The healthy stream, then the same stream again from `offset`, round and round, with its
    link at `to` of its rate for `held` results (its own noise, its busy periods included:
    those stay disturbed), then `after` results of it restored."""
    again = [samples[(offset + i) % len(samples)] for i in range(held + after)]
    last = samples[-1]["t"]
    return samples + [
        {
            **s,
            "t": last + STEP_S * (i + 1),
            "busbw": s["busbw"] * (to if i < held else 1.0),
            "degraded": False,
        }
        for i, s in enumerate(again)
    ]


def conclusive_until(verdicts: list[Verdict], done: Any) -> int | None:
    """How many conclusive results it took until `done(verdict)`; None if never."""
    count = 0
    for verdict in verdicts:
        count += verdict.inconclusive is None
        if done(verdict):
            return count
    return None


def held_cut_trial(
    series: str, to: float, offset: int, recording: Path = STREAMS
) -> dict[str, Any]:
    samples = streams(recording)[series]
    replayed = [v for _, v in replay(held_cut(samples, to, offset), key_of(series))]
    healthy, during = replayed[: len(samples)], replayed[len(samples) : len(samples) + HELD]
    after = replayed[len(samples) + HELD :]
    flagged = next((i for i, v in enumerate(during) if v.degraded), None)
    reference = healthy[-1].reference or 0.0  # as the cut begins (a young one follows before)
    return {
        "offset": offset,
        "false": sum(v.degraded for v in healthy),
        "flag": conclusive_until(during, lambda v: v.degraded),
        "held": flagged is not None and all(v.degraded for v in during[flagged:]),
        "clear": conclusive_until(after, lambda v: not v.degraded),
        "reference": min(v.reference or 0.0 for v in during) / reference,
    }


@pytest.mark.parametrize("to", [0.75, 0.6])
@pytest.mark.parametrize("series", JUDGED)
# Not the third: its 16 MiB series ran 15 % under its last hour for most of the recording, so
# a cut that ends there comes back to 0.85x of the baseline it left and clears only by
# acceptance, hours later (the machine's drift, not the rule's; docs/BENCHMARKS.md).
@pytest.mark.parametrize(("recording", "every"), [(STREAMS, 2), (STREAMS_2, 4)], ids=["1", "2"])
def test_a_cut_held_for_a_thousand_results_is_flagged_and_stays_flagged(
    recording: Path, every: int, series: str, to: float
) -> None:
    """Issues 23 and 33: the default policy, a recorded stream's real noise, the cut begun at
    every second (fourth) point of it. A held cut is flagged, never cleared while held, cleared
    within 30 conclusive results once it ends, and the reference never moves."""
    samples = streams(recording)[series]
    trials = [
        held_cut_trial(series, to, offset, recording) for offset in range(0, len(samples), every)
    ]
    assert not any(t["false"] for t in trials)
    assert all(t["held"] for t in trials), [t for t in trials if not t["held"]]
    if recording == STREAMS:
        assert all(t["clear"] is not None and t["clear"] <= 30 for t in trials), trials
    else:
        # The second recording's level ran 10-15 % higher in its second half: a cut that ends
        # in the lower half must climb back within 10 % of the higher baseline it left, which
        # can take the machine's own time (docs/BENCHMARKS.md has the figures).
        assert all(t["clear"] is not None and t["clear"] <= 40 for t in trials), trials
    assert all(t["reference"] >= 0.95 for t in trials)
    flags = sorted(t["flag"] for t in trials)
    # Within 10 conclusive results, except where the cut begins in or just before the
    # recording's fast stretch (results at 1.2-1.3x its median for ~10 runs): cut to 0.75x
    # those still read 0.9x, healthy, and are learned before the stretch ends (docs/SIGNAL.md:
    # 26 at the worst point of it).
    within = sum(f <= 10 for f in flags) / len(flags)
    assert within >= (0.65 if to > 0.7 else 1.0), flags
    assert flags[-1] <= 30, flags
    # The cut as the recording continues: its latest quiet results first. On the first
    # recording's 16 MiB series that is its fast stretch's end, where a 0.75x cut reads 0.8x
    # of the expected level, on the line (26 results, as at the worst offset above).
    natural = held_cut_trial(series, to, _last_quiet_stretch(samples), recording)
    assert natural["flag"] <= (10 if to < 0.7 else 30) and natural["held"], natural


def _last_quiet_stretch(samples: list[dict[str, Any]]) -> int:
    """Where the recording's last stretch without the load begins."""
    index = len(samples) - 1
    while index > 0 and not samples[index - 1]["load"]:
        index -= 1
    return index


def on_grid(samples: list[dict[str, Any]], values: list[str]) -> str:
    """Per-result values on a STEP_S grid from the first result (promtool's time 0), each point
    holding the latest result's value by then, in promtool's value notation."""
    grid: list[str] = []
    current = values[0]
    index = 0
    t = samples[0]["t"]
    while t <= samples[-1]["t"]:
        while index < len(samples) and samples[index]["t"] <= t:
            current = values[index]
            index += 1
        grid.append(current)
        t += STEP_S
    return " ".join(grid)


def degraded_series(samples: list[dict[str, Any]], key: BaselineKey) -> str:
    """The replayed netmon_degraded."""
    return on_grid(samples, ["1" if v.degraded else "0" for _, v in replay(samples, key)])


def since_series(samples: list[dict[str, Any]], key: BaselineKey) -> str:
    """netmon_degraded_since_timestamp_seconds: the time of the result that turned the replayed
    verdict degraded, in promtool's time; no sample while it is not (the alert reads it only
    beside netmon_degraded 1)."""
    since: list[str] = []
    turned: str | None = None
    for sample, verdict in replay(samples, key):
        if verdict.degraded and turned is None:
            turned = f"{sample['t'] - samples[0]['t']:.2f}"
        elif not verdict.degraded:
            turned = None
        since.append(turned or "_")
    return on_grid(samples, since)


def measured_series(samples: list[dict[str, Any]]) -> str:
    """netmon_measurement_timestamp_seconds: when the latest result came, in promtool's time.
    The alert counts only verdicts measured within 3 of their probe's intervals."""
    return on_grid(samples, [f"{s['t'] - samples[0]['t']:.2f}" for s in samples])


def probe_intervals(path: Path = STREAMS) -> dict[str, float]:
    """Each probe's interval in the configuration of the recorded daemon."""
    probes = parse_config(json.loads(path.read_text())["setup"]["config"]).probes
    assert probes, "the recording names its probes"
    return {probe.name: probe.interval for probe in probes}


def rendered_annotations(labels: dict[str, str]) -> dict[str, str]:
    """NetmonBusbwDegraded's annotations as Prometheus renders them for `labels`."""
    rules = yaml.safe_load(RULES.read_text())["groups"]
    rule = next(r for g in rules for r in g["rules"] if r.get("alert") == "NetmonBusbwDegraded")
    return {
        name: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m[1]], text)
        for name, text in rule["annotations"].items()
    }


def test_prometheus_fed_the_replay_never_fires_and_fires_on_the_cut(tmp_path: Path) -> None:
    recorded = streams()
    labels = 'instance="node1:19464", job="netmon"'
    healthy = [
        {
            "series": f'{metric}{{{labels}, probe="{k[0]}", op="{k[1]}", '
            f'size_bytes="{k[2]}", path="{k[3]}", ranks="{k[4]}"}}',
            "values": degraded_series(samples, k) if degraded else measured_series(samples),
        }
        for series, samples in sorted(recorded.items())
        for k in [key_of(series)]
        for metric, degraded in [
            ("netmon_degraded", True),
            ("netmon_measurement_timestamp_seconds", False),
        ]
    ]
    intervals = probe_intervals()
    # Then the link is cut to 0.75x and stays cut for a thousand results (nearly 3 hours).
    samples = recorded[LARGEST]
    broken = held_cut(samples, 0.75, _last_quiet_stretch(samples), after=0)
    cut_key = ("cut", *key_of(LARGEST)[1:])
    grid = len(healthy[0]["values"].split())
    assert len(healthy[1]["values"].split()) == grid  # the timestamps beside the verdicts
    cut_values = degraded_series(broken, cut_key)  # type: ignore[arg-type]
    flags = cut_values.split()
    assert flags[:grid].count("1") == 0
    first = flags.index("1")
    assert set(flags[first:]) == {"1"}  # held to the end
    minutes = grid * STEP_S // 60
    # The alert fires once the verdict has held for 10 minutes (over 2 of the probe's
    # intervals, 20 s here) and a result since has kept it: within 11 minutes of the first 1;
    # from then on to the end.
    firing = range((first * STEP_S) // 60 + 11, len(flags) * STEP_S // 60, 20)
    fired = {
        "severity": "warning",
        "instance": "node1:19464",
        "job": "netmon",
        "probe": "cut",
        "op": "all_reduce",
        "size_bytes": "16777216",
        "path": "default",
        "ranks": "2",
    }
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "10s",
        "tests": [
            {
                "interval": f"{STEP_S}s",
                "input_series": [
                    *healthy,
                    {
                        "series": f'netmon_degraded{{{labels}, probe="cut", op="all_reduce", '
                        'size_bytes="16777216", path="default", ranks="2"}',
                        "values": cut_values,
                    },
                    {
                        "series": f"netmon_measurement_timestamp_seconds{{{labels}, "
                        'probe="cut", op="all_reduce", size_bytes="16777216", path="default", '
                        'ranks="2"}',
                        "values": measured_series(broken),
                    },
                    {
                        "series": f"netmon_degraded_since_timestamp_seconds{{{labels}, "
                        'probe="cut", op="all_reduce", size_bytes="16777216", path="default", '
                        'ranks="2"}',
                        "values": since_series(broken, cut_key),  # type: ignore[arg-type]
                    },
                    # The cut is the largest size's probe, renamed.
                    *(
                        {
                            "series": f'netmon_probe_interval_seconds{{{labels}, probe="{p}"}}',
                            "values": f"{interval:g}x{len(flags)}",
                        }
                        for p, interval in [*intervals.items(), ("cut", intervals["large"])]
                    ),
                ],
                "alert_rule_test": [
                    *(
                        {"eval_time": f"{m}m", "alertname": "NetmonBusbwDegraded", "exp_alerts": []}
                        for m in range(0, minutes + 1, 2)
                    ),
                    *(
                        {
                            "eval_time": f"{m}m",
                            "alertname": "NetmonBusbwDegraded",
                            "exp_alerts": [
                                {
                                    "exp_labels": fired,
                                    "exp_annotations": rendered_annotations(fired),
                                }
                            ],
                        }
                        for m in firing
                    ),
                ],
            }
        ],
    }
    path = tmp_path / "replay.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    output = run(promtool(), "test", "rules", path.name, cwd=tmp_path)
    assert "SUCCESS" in output
