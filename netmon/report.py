"""Renders probe outcomes for people (an nccl-tests-style table) and programs (a JSON document)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from netmon.bandwidth import DTYPE_SHORT
from netmon.probe.spec import ProbeOutcome, SizeResult

GB = 1e9
US = 1e6

_COLUMNS = (
    ("size", "(B)", 12),
    ("count", "(elements)", 12),
    ("type", "", 8),
    ("chunks", "", 6),
    ("time", "(us)", 10),
    ("algbw", "(GB/s)", 9),
    ("busbw", "(GB/s)", 9),
    ("min", "(us)", 10),
    ("p10", "(us)", 10),
    ("p90", "(us)", 10),
    ("max", "(us)", 10),
    ("cv", "(%)", 6),
    ("n", "", 4),
    ("check", "", 6),
)


def _row(values: Sequence[str]) -> str:
    return " ".join(
        f"{value:>{width}}" for value, (_, _, width) in zip(values, _COLUMNS, strict=False)
    )


def _result_row(result: SizeResult) -> str:
    check = {None: "-", True: "ok", False: "WRONG"}[result.check_ok]
    return _row(
        [
            str(result.size_bytes),
            str(result.count),
            DTYPE_SHORT[result.dtype],
            str(result.chunks),
            f"{result.time_s * US:.2f}",
            f"{result.algbw_bytes_per_second / GB:.3f}",
            f"{result.busbw_bytes_per_second / GB:.3f}",
            f"{result.min_s * US:.2f}",
            f"{result.p10_s * US:.2f}",
            f"{result.p90_s * US:.2f}",
            f"{result.max_s * US:.2f}",
            f"{result.cv * 100:.1f}",
            str(result.samples),
            check,
        ]
    )


def table(outcome: ProbeOutcome) -> str:
    spec = outcome.spec
    env = outcome.environment
    timing = f"batched x{spec.batch}" if spec.timing == "batched" else "per_op"
    lines = [
        f"# netmon probe: {spec.op}, backend {spec.backend}, {spec.ranks} ranks, {spec.dtype}, "
        f"timing {timing}, warmup {spec.warmup}, {spec.iters} samples per size",
    ]
    if env is not None:
        lines.append(
            f"# host {env.host}, torch {env.torch or '?'}, nccl {env.nccl or '-'}, "
            f"devices {','.join(env.devices) or 'cpu'}"
        )
    lines.append("#" + _row([name for name, _, _ in _COLUMNS])[1:])
    lines.append("#" + _row([unit for _, unit, _ in _COLUMNS])[1:])
    lines.extend(_result_row(result) for result in outcome.results)
    if outcome.results:
        average = sum(r.busbw_bytes_per_second for r in outcome.results) / len(outcome.results)
        lines.append(f"# Avg bus bandwidth    : {average / GB:.4f} GB/s")
    lines.append(
        f"# wall {outcome.wall_s:.2f} s, inside timed collectives {outcome.collective_s:.2f} s"
    )
    if outcome.failure is not None:
        lines.append(f"# FAILED: {outcome.failure.describe()}")
    return "\n".join(lines)


def json_document(outcomes: Sequence[ProbeOutcome]) -> dict[str, Any]:
    """{"results": [...], "environment": {...}, "failures": [...], "probes": [...]}."""
    results: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    for outcome in outcomes:
        results.extend(r.model_dump(mode="json") for r in outcome.results)
        if outcome.failure is not None:
            failures.append(
                {
                    "op": outcome.spec.op,
                    "reason": outcome.failure.reason,
                    **outcome.failure.model_dump(mode="json"),
                }
            )
    environment = next((o.environment for o in outcomes if o.environment), None)
    return {
        "results": results,
        "environment": environment.model_dump(mode="json") if environment else {},
        "failures": failures,
        "probes": [
            {
                "spec": o.spec.model_dump(mode="json"),
                "ok": o.ok,
                "wall_s": o.wall_s,
                "collective_s": o.collective_s,
                "peak_device_memory_bytes": o.peak_device_memory_bytes,
            }
            for o in outcomes
        ],
    }
