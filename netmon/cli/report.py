"""Renders probe outcomes for people (an nccl-tests-style table) and programs (a JSON document)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from netmon import sim
from netmon.bandwidth import DTYPE_SHORT
from netmon.cli.table import comment, width
from netmon.probe.pairs import PairOutcome
from netmon.probe.spec import ProbeOutcome, SizeResult
from netmon.probe.verdict import LinkVerdict

GB = 1e9
US = 1e6

# (name, unit, width, wide only). By default the columns of nccl-tests' table plus chunks and the
# spread (p10, p90, cv), within table.WIDTH; --wide adds min, max and the sample count (the
# heading says how many samples each size was asked for).
_COLUMNS = (
    ("size", "(B)", 12, False),
    ("count", "(elements)", 12, False),
    ("type", "", 8, False),
    ("chunks", "", 6, False),
    ("time", "(us)", 10, False),
    ("algbw", "(GB/s)", 9, False),
    ("busbw", "(GB/s)", 9, False),
    ("min", "(us)", 10, True),
    ("p10", "(us)", 10, False),
    ("p90", "(us)", 10, False),
    ("max", "(us)", 10, True),
    ("cv", "(%)", 6, False),
    ("n", "", 4, True),
    ("check", "", 6, False),
)


# Left out, in this order, while the default table is wider than the terminal: what a narrow
# terminal does without first (nccl-tests' own count and type, the chunking, then the spread).
_NARROW_DROP = ("count", "type", "chunks", "p90", "p10")


def _shown(wide: bool) -> set[str]:
    shown = [name for name, _, _, extra in _COLUMNS if wide or not extra]
    if wide:
        return set(shown)
    limit = width()
    for name in _NARROW_DROP:
        if sum(w + 1 for n, _, w, _ in _COLUMNS if n in shown) <= limit:
            break
        shown.remove(name)
    return set(shown)


def _row(values: Sequence[str], wide: bool) -> str:
    shown = _shown(wide)
    return " ".join(
        f"{value:>{w}}"
        for value, (name, _, w, _) in zip(values, _COLUMNS, strict=True)
        if name in shown
    )


def _result_row(result: SizeResult, wide: bool) -> str:
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
        ],
        wide,
    )


# A path variant is NCCL's environment (NCCL_P2P_DISABLE=1, NCCL_ALGO=...): gloo runs the same
# path under every name, so its numbers compare nothing (the selftest skips them).
GLOO_PATH_NOTE = (
    "a path variant sets NCCL's environment, which gloo ignores: the default path again"
)


def table(outcome: ProbeOutcome, wide: bool = False) -> str:
    """nccl-tests' layout: comment lines, then one right-aligned row per size. Fits table.WIDTH
    columns unless `wide` (every column, every comment on one line)."""
    spec = outcome.spec
    env = outcome.environment
    timing = f"batched x{spec.batch}" if spec.timing == "batched" else "per_op"
    what = (
        f"netmon probe: {spec.op}, path {spec.path}, backend {spec.backend}, {spec.ranks} ranks, "
        f"{spec.dtype}"
    )
    how = (
        f"timing {timing}, warmup {spec.warmup}, {spec.iters} samples per size "
        f"({spec.rank_stat} over ranks)"
    )
    # Two lines by default: one line would pass table.WIDTH with any op name.
    lines = [f"# {what}, {how}"] if wide else [f"# {what}", f"# {how}"]
    if env is not None:
        lines += comment(
            # No torch: no rank reported one (it failed before, e.g. at spawn).
            f"host {env.host}, torch {env.torch or 'not reported'}, nccl {env.nccl or '-'}, "
            # ", " lets a list of GPU UUIDs wrap between two of them.
            f"devices {(',' if wide else ', ').join(env.devices) or 'cpu'}",
            wide,
        )
    if spec.backend == "gloo" and spec.path != "default":
        lines += comment(f"path {spec.path} on gloo: {GLOO_PATH_NOTE}", wide)
    node = sim.active()
    if node is not None:
        lines += comment(
            f"SIMULATED node {node.path}: gloo on CPU ranks, no figure measures a GPU", wide
        )
    lines.append("#" + _row([name for name, _, _, _ in _COLUMNS], wide)[1:])
    lines.append("#" + _row([unit for _, unit, _, _ in _COLUMNS], wide)[1:])
    lines.extend(_result_row(result, wide) for result in outcome.results)
    if outcome.results:
        average = sum(r.busbw_bytes_per_second for r in outcome.results) / len(outcome.results)
        lines.append(f"# Avg bus bandwidth    : {average / GB:.4f} GB/s")
    lines.append(
        f"# wall {outcome.wall_s:.2f} s, inside timed collectives {outcome.collective_s:.2f} s"
    )
    if outcome.failure is not None:
        lines += comment(f"FAILED: {outcome.failure.describe()}", wide)
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


def _largest(outcome: ProbeOutcome) -> SizeResult | None:
    return max(outcome.results, key=lambda r: r.size_bytes, default=None)


def pairs_table(results: Sequence[PairOutcome], verdict: LinkVerdict, wide: bool = False) -> str:
    lines = [
        "# netmon pair probes: busbw at the largest size, against the median of the "
        "pair's path class",
        f"# {'gpu':>4} {'peer':>4} {'path':>6} {'size':>10} {'busbw(GB/s)':>12} "
        f"{'class med':>10} {'ratio':>6}  verdict",
    ]
    for item in results:
        largest = _largest(item.outcome)
        judged = verdict.pairs.get(item.pair)
        if largest is None or judged is None:
            reason = item.outcome.failure.reason if item.outcome.failure else "no result"
            lines.append(f"  {item.pair[0]:>4} {item.pair[1]:>4} {item.path:>6}  FAILED {reason}")
            continue
        median = f"{judged.class_median / GB:.3f}" if judged.class_median else "-"
        ratio = f"{judged.ratio:.2f}" if judged.ratio is not None else "-"
        mark = "LOW" if judged.low else "ok"
        lines.append(
            f"  {item.pair[0]:>4} {item.pair[1]:>4} {item.path:>6} "
            f"{largest.size_bytes:>10} {largest.busbw_bytes_per_second / GB:>12.3f} "
            f"{median:>10} {ratio:>6}  {mark}"
        )
    lines += comment(verdict.describe(), wide)
    return "\n".join(lines)


def pairs_document(
    results: Sequence[PairOutcome],
    verdict: LinkVerdict,
    rounds: Sequence[Sequence[tuple[int, int]]],
) -> dict[str, Any]:
    """{"pairs": [...], "verdict": {...}, "rounds": [...]}: per pair its results and ratio."""
    pairs = []
    for item in results:
        judged = verdict.pairs.get(item.pair)
        pairs.append(
            {
                "gpu": item.pair[0],
                "peer_gpu": item.pair[1],
                "path": item.path,
                "ok": item.outcome.ok,
                "failure": item.outcome.failure.model_dump(mode="json")
                if item.outcome.failure
                else None,
                "results": [r.model_dump(mode="json") for r in item.outcome.results],
                "class_median_bytes_per_second": judged.class_median if judged else None,
                "ratio": judged.ratio if judged else None,
                "low": judged.low if judged else None,
            }
        )
    return {
        "pairs": pairs,
        "rounds": [[list(pair) for pair in rnd] for rnd in rounds],
        "verdict": {
            "suspect_pairs": [list(pair) for pair in verdict.suspect_pairs],
            "suspect_gpus": list(verdict.suspect_members),
            "summary": verdict.describe(),
        },
    }
