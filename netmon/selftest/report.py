"""The selftest's report as a value, and its two renderings: an aligned table for a person and one
JSON document (the file a GPU node's operator sends back to the project)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from netmon.bandwidth import format_size
from netmon.cli.table import aligned, comment
from netmon.selftest.checks import Row, exit_code
from netmon.selftest.versus import SizeRatio

FORMAT = 1  # the JSON report's layout version, for whoever reads reports sent back
_COLUMNS = ("CHECK", "RESULT", "MEASURED", "GOAL", "DETAIL")
# By default the table leaves GOAL out (--wide shows it): a check's detail says why it failed or
# was skipped, which the goal alone does not. Check names and figures wrap past these widths.
_CAPS = {0: 30, 2: 26}


@dataclass(frozen=True)
class Report:
    backend: str
    ranks: int
    devices: tuple[str, ...]
    sizes: tuple[int, ...]
    rows: tuple[Row, ...]
    started_at: float  # unix time
    wall_s: float
    # What ran: netmon, torch, NCCL, Python, host, as the ranks reported them.
    environment: Mapping[str, Any] = field(default_factory=dict)
    ratios: tuple[SizeRatio, ...] = ()  # all_reduce against all_reduce_perf, per size
    error: str | None = None  # why the selftest stopped before its end
    simulated: str | None = None  # the node file of a simulated node (--simulate)

    @property
    def verdict(self) -> str:
        if self.error is not None:
            return "ERROR"
        return "FAIL" if exit_code(self.rows) else "PASS"

    def counts(self) -> dict[str, int]:
        found = Counter(row.status for row in self.rows)
        return {status: found.get(status, 0) for status in ("PASS", "FAIL", "SKIP")}


def _heading(report: Report, wide: bool) -> list[str]:
    env = report.environment
    on = ", ".join(report.devices) if report.devices else "CPU"
    versions = ", ".join(
        f"{name} {env[key]}" for key, name in (("torch", "torch"), ("nccl", "NCCL")) if env.get(key)
    )
    sizes = ",".join(format_size(s) for s in report.sizes)
    heading = f"netmon selftest: {report.backend}, {report.ranks} ranks on {on}, sizes {sizes}"
    heading += f" ({versions})" if versions else ""
    lines = comment(heading, wide, prefix="")
    if report.simulated is not None:
        simulated = f"SIMULATED node {report.simulated}: a rehearsal, no figure measures a GPU"
        lines += comment(simulated, wide, prefix="")
    return lines


def _ratio_table(ratios: Sequence[SizeRatio]) -> list[str]:
    lines = [("SIZE", "NETMON GB/s", "NCCL-TESTS GB/s", "RATIO")]
    for r in ratios:
        theirs = f"{r.nccl_tests / 1e9:.2f}" if r.nccl_tests else "-"
        ratio = f"{r.ratio:.3f}" if r.ratio is not None else "-"
        lines.append((format_size(r.size_bytes), f"{r.netmon / 1e9:.2f}", theirs, ratio))
    return ["", "all_reduce busbw, netmon against all_reduce_perf (in place):", *aligned(lines)]


def table(report: Report, wide: bool = False) -> str:
    """The rows under a heading, then the comparison with nccl-tests and the verdict. Fits
    WIDTH columns (MEASURED and DETAIL wrap, no GOAL) unless `wide`."""
    shown = [i for i, name in enumerate(_COLUMNS) if wide or name != "GOAL"]
    cells = [(row.name, row.status, row.measured, row.goal, row.detail) for row in report.rows]
    lines = [[line[i] for i in shown] for line in [_COLUMNS, *cells]]
    out = [*_heading(report, wide), "", *aligned(lines, wide, _CAPS)]
    if report.ratios:
        out += _ratio_table(report.ratios)
    counts = report.counts()
    out += ["", f"{report.verdict}: " + ", ".join(f"{n} {s}" for s, n in counts.items())]
    if report.error is not None:
        out += comment(f"the selftest stopped early: {report.error}", wide, prefix="")
    return "\n".join(out)


def document(report: Report) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "verdict": report.verdict,
        "counts": report.counts(),
        "backend": report.backend,
        "ranks": report.ranks,
        "devices": list(report.devices),
        "sizes": list(report.sizes),
        "environment": dict(report.environment),
        "started_at": report.started_at,
        "wall_s": round(report.wall_s, 3),
        "rows": [row.as_dict() for row in report.rows],
        "nccl_tests": [r.as_dict() for r in report.ratios],
        "error": report.error,
        "simulated": report.simulated,
    }
