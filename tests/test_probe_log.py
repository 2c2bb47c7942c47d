"""The daemon's line after each probe: every figure comes with the size it was measured at (busbw at
the largest size, latency at the smallest), in plain text and in JSON."""

from __future__ import annotations

import json
import logging

import pytest

from netmon.config import NetmonConfig, ProbeConfig
from netmon.logs import JsonFormatter, PlainFormatter
from netmon.probe.build import build_spec
from netmon.probe.spec import ProbeOutcome, SizeResult
from netmon.serve.runner import ProbeRunner

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
# Per size: (one op's time in s, busbw in B/s), every figure different from every other.
MEASURED = {8: (21.3e-6, 0.0004e9), 64 * KIB: (35.0e-6, 1.9e9), 1 * GIB: (5.8e-3, 185.2e9)}


def result(size: int) -> SizeResult:
    time_s, busbw = MEASURED[size]
    return SizeResult(
        op="all_reduce",
        size_bytes=size,
        count=size // 4,
        dtype="float32",
        chunks=1,
        time_s=time_s,
        min_s=time_s,
        p10_s=time_s,
        p90_s=time_s,
        max_s=time_s,
        cv=0.0,
        samples=20,
        algbw_bytes_per_second=busbw / 1.75,
        busbw_bytes_per_second=busbw,
        bus_factor=1.75,
    )


def logged(caplog: pytest.LogCaptureFixture, order: list[int]) -> logging.LogRecord:
    probe = ProbeConfig(name="large", sizes=order)
    spec = build_spec(probe, NetmonConfig(backend="gloo"))
    # The results in the order given: the line must not depend on where each size stands.
    outcome = ProbeOutcome(
        spec=spec, results=tuple(result(s) for s in order), started_at=0.0, wall_s=7.5
    )
    with caplog.at_level(logging.INFO, logger="netmon.serve.runner"):
        ProbeRunner._log_outcome(probe, outcome, "default")
    (record,) = [r for r in caplog.records if r.getMessage() == "probe ok"]
    return record


@pytest.mark.parametrize("order", [[8, 64 * KIB, 1 * GIB], [1 * GIB, 8, 64 * KIB]])
def test_busbw_is_the_largest_sizes_and_latency_the_smallests_each_named(
    caplog: pytest.LogCaptureFixture, order: list[int]
) -> None:
    record = logged(caplog, order)
    line = PlainFormatter().format(record)
    assert " busbw_gbps=185.2 busbw_size_bytes=1073741824 " in line, line
    assert line.endswith(" latency_us=21.3 latency_size_bytes=8"), line
    # Earlier releases' field stays what it was, the largest size: log pipelines read it.
    assert " size_bytes=1073741824 " in line, line
    document = json.loads(JsonFormatter().format(record))
    assert (document["busbw_gbps"], document["busbw_size_bytes"]) == (185.2, GIB)
    assert (document["latency_us"], document["latency_size_bytes"]) == (21.3, 8)
    assert document["probe"] == "large" and document["outcome"] == "ok"


def test_one_size_gives_both_figures_at_that_size(caplog: pytest.LogCaptureFixture) -> None:
    document = json.loads(JsonFormatter().format(logged(caplog, [64 * KIB])))
    assert (document["busbw_gbps"], document["busbw_size_bytes"]) == (1.9, 64 * KIB)
    assert (document["latency_us"], document["latency_size_bytes"]) == (35.0, 64 * KIB)
