"""Pure parsing of nccl-tests result tables (all_reduce_perf and friends).

Published tables are the ground truth netmon's own numbers must agree with: `row_problems`
re-derives algbw and busbw from each printed row with netmon.bandwidth and says where they differ
by more than the printed rounding allows, and `netmon selftest` reads all_reduce_perf's own run
with `parse_table` to hold netmon's busbw against it.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Literal

from netmon.bandwidth import OpName, algbw, bus_factor

TableFormat = Literal["wrong", "error"]

# Launchers' rank tags. mpirun --tag-output writes "[1,0]<stdout>:", MPICH-style launchers "[0]";
# both land in the middle of rows too, because nccl-tests writes each row in several printf calls.
_TAG_RE = re.compile(r"\[\d+,\d+\]<(?:stdout|stderr)>:|\[\d+\](?=\s|$)")
_VERSION_RE = re.compile(
    r"^nccl-tests version (?P<version>\S+)(?: \(\w+\))? nccl-headers=(?P<headers>\d+)"
    r" nccl-library=(?P<library>\d+)"
)
_STARTING_RE = re.compile(r"^Collective test starting: (?P<test>\S+)")
_NTHREAD_RE = re.compile(r"^nThread \d+ nGpus \d+ ")
_RANK_RE = re.compile(
    r"^Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)\s+"
    r"device\s+(?P<device>\d+)\s+\[(?P<bus>[^\]]*)\]\s*(?P<name>.*?)\s*$"
)
_OOB_RE = re.compile(r"^Out of bounds values\s*:\s*(?P<count>\d+)")
_AVG_RE = re.compile(r"^Avg bus bandwidth\s*:\s*(?P<avg>\S+)")

# nccl-tests binaries and the collective each one times; the others have no netmon OpName.
_TEST_OPS: dict[str, OpName] = {
    "all_reduce_perf": "all_reduce",
    "all_gather_perf": "all_gather",
    "reduce_scatter_perf": "reduce_scatter",
    "broadcast_perf": "broadcast",
    "alltoall_perf": "alltoall",
    "sendrecv_perf": "sendrecv",
}


@dataclass(frozen=True)
class RankInfo:
    """One "Rank N Group G Pid P on HOST device D [bus] NAME" line of the device listing."""

    rank: int
    pid: int
    host: str
    device: int
    bus: str  # "0000:1b:00", or "0x53" in older versions
    name: str  # "NVIDIA H100 80GB HBM3"


@dataclass(frozen=True)
class Measurement:
    """One half (out-of-place or in-place) of a row, with the resolution it was printed at.

    nccl-tests prints each number in a fixed width with as many decimals as fit, so the place
    value of the last printed digit differs from row to row; the *_step fields keep it.
    """

    time_us: float
    algbw_gbps: float  # GB/s = 1e9 bytes/s, as nccl-tests
    busbw_gbps: float
    wrong: int | None  # "#wrong" elements; None for "N/A" (-c 0) and in the old format
    error: float | None  # the old format's maximum error; None in the new format
    time_step_us: float
    algbw_step: float
    busbw_step: float


@dataclass(frozen=True)
class PerfRow:
    size_bytes: int
    count: int
    dtype: str  # nccl-tests' names: float, double, half, bfloat16, int8, ...
    redop: str  # sum, prod, max, min, avg, none
    root: int | None  # -1 when the collective has none; None in the old format (no column)
    out_of_place: Measurement
    in_place: Measurement


@dataclass(frozen=True)
class PerfTable:
    test: str | None  # "all_reduce_perf"; older versions and excerpts do not say
    nccl_tests_version: str | None
    nccl_library: int | None  # NCCL_VERSION_CODE, e.g. 22902 for 2.29.2
    ranks: tuple[RankInfo, ...]
    header: bool  # whether the column header was seen
    format: TableFormat  # "wrong": "#wrong" columns (2.10+); "error": the older error columns
    rows: tuple[PerfRow, ...]
    out_of_bounds: int | None
    avg_busbw_gbps: float | None  # None when the footer is missing: the run was cut short

    @property
    def op(self) -> OpName | None:
        return op_for_test(self.test) if self.test else None

    @property
    def n_ranks(self) -> int | None:
        """Ranks in the device listing; None when the excerpt lacks it."""
        return len({r.rank for r in self.ranks}) or None

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.host for r in self.ranks))

    @property
    def complete(self) -> bool:
        return self.avg_busbw_gbps is not None

    @property
    def peak_busbw_gbps(self) -> float | None:
        values = [m.busbw_gbps for row in self.rows for m in (row.out_of_place, row.in_place)]
        return max(values, default=None)


def op_for_test(test: str) -> OpName | None:
    return _TEST_OPS.get(test)


def _step(text: str) -> float:
    """The place value of the last printed digit: "183.49" -> 0.01, "1.2e+05" -> 1e4."""
    exponent = Decimal(text).as_tuple().exponent
    return 10.0 ** int(exponent) if isinstance(exponent, int) else 0.0


def _measurement(fields: list[str], error_format: bool) -> Measurement:
    time_text, algbw_text, busbw_text, check = fields
    wrong: int | None = None
    error: float | None = None
    if check != "N/A":
        if error_format:
            error = float(check)
        else:
            wrong = int(float(check))  # "%6g" prints large counts as "1e+06"
    return Measurement(
        time_us=float(time_text),
        algbw_gbps=float(algbw_text),
        busbw_gbps=float(busbw_text),
        wrong=wrong,
        error=error,
        time_step_us=_step(time_text),
        algbw_step=_step(algbw_text),
        busbw_step=_step(busbw_text),
    )


@dataclass(frozen=True)
class _Layout:
    root: bool
    per_iter: bool  # -I 1 adds i_min, i_max, i_p99, i_cv% after each half
    error_format: bool


def _layout_for(tokens: list[str]) -> _Layout | None:
    """Without a header (an excerpt), the field count is the only clue to the layout."""
    if len(tokens) == 13:
        return _Layout(root=True, per_iter=False, error_format=False)
    if len(tokens) == 21:
        return _Layout(root=True, per_iter=True, error_format=False)
    if len(tokens) == 12:
        return _Layout(root=False, per_iter=False, error_format=True)
    return None


def _parse_row(tokens: list[str], layout: _Layout) -> PerfRow | None:
    width = 4 + (4 if layout.per_iter else 0)
    start = 5 if layout.root else 4
    # Extra trailing fields (the -T timestamp) are ignored; too few means a cut-off row.
    if len(tokens) < start + 2 * width:
        return None
    try:
        return PerfRow(
            size_bytes=int(tokens[0]),
            count=int(tokens[1]),
            dtype=tokens[2],
            redop=tokens[3],
            root=int(tokens[4]) if layout.root else None,
            out_of_place=_measurement(tokens[start : start + 4], layout.error_format),
            in_place=_measurement(tokens[start + width : start + width + 4], layout.error_format),
        )
    except (ValueError, InvalidOperation):
        return None


@dataclass
class _Section:
    """Mutable state while one run is read; frozen into a PerfTable when the run ends."""

    test: str | None = None
    version: str | None = None
    library: int | None = None
    ranks: list[RankInfo] = field(default_factory=list)
    layout: _Layout | None = None
    header: bool = False
    rows: list[PerfRow] = field(default_factory=list)
    out_of_bounds: int | None = None
    avg: float | None = None

    @property
    def started(self) -> bool:
        return self.header or bool(self.rows)

    def freeze(self) -> PerfTable:
        error_format = self.layout.error_format if self.layout else False
        return PerfTable(
            test=self.test,
            nccl_tests_version=self.version,
            nccl_library=self.library,
            ranks=tuple(self.ranks),
            header=self.header,
            format="error" if error_format else "wrong",
            rows=tuple(self.rows),
            out_of_bounds=self.out_of_bounds,
            avg_busbw_gbps=self.avg,
        )


def parse_tables(text: str) -> tuple[PerfTable, ...]:
    """Every result table in the text, in order; a text may hold several runs back to back."""
    tables: list[PerfTable] = []
    section = _Section()

    def finish() -> None:
        nonlocal section
        if section.started:
            tables.append(section.freeze())
        section = _Section()

    for raw in text.splitlines():
        line = _TAG_RE.sub(" ", raw).strip()
        content = line.lstrip("#").strip()
        tokens = content.split()
        if not tokens:
            continue
        # The preamble of a run (version, name, parameters, devices) starts a new section once a
        # table has begun, so that two runs in one file do not merge.
        version = _VERSION_RE.match(content)
        if version:
            if section.started or section.version or section.test:
                finish()
            section.version = version.group("version")
            section.library = int(version.group("library"))
            continue
        starting = _STARTING_RE.match(content)
        if starting:
            if section.started or section.test:
                finish()
            section.test = starting.group("test")
            continue
        if _NTHREAD_RE.match(content):
            if section.started:
                finish()
            continue
        rank = _RANK_RE.match(content)
        if rank:
            if section.started:
                finish()
            section.ranks.append(
                RankInfo(
                    rank=int(rank.group("rank")),
                    pid=int(rank.group("pid")),
                    host=rank.group("host"),
                    device=int(rank.group("device")),
                    bus=rank.group("bus"),
                    name=rank.group("name"),
                )
            )
            continue
        if tokens[:2] == ["size", "count"]:
            if section.rows:
                finish()
            section.header = True
            section.layout = _Layout(
                root="root" in tokens, per_iter="i_min" in tokens, error_format="error" in tokens
            )
            continue
        oob = _OOB_RE.match(content)
        if oob:
            section.out_of_bounds = int(oob.group("count"))
            continue
        avg = _AVG_RE.match(content)
        if avg:
            # "%g" of a broken run can print "nan" or "inf"; float() takes those, not garbage.
            with contextlib.suppress(ValueError):
                section.avg = float(avg.group("avg"))
            finish()
            continue
        if line.startswith("#") or not tokens[0].isdigit():
            continue
        layout = section.layout or _layout_for(tokens)
        row = _parse_row(tokens, layout) if layout else None
        if row is not None:
            section.rows.append(row)
    finish()
    return tuple(tables)


def parse_table(text: str) -> PerfTable:
    """The one result table in the text."""
    tables = parse_tables(text)
    if len(tables) != 1:
        raise ValueError(f"expected one nccl-tests table, found {len(tables)}")
    return tables[0]


def _algbw_bounds(size_bytes: int, m: Measurement) -> tuple[float, float]:
    """The interval the true algbw (GB/s) lies in, given the printed time and algbw."""
    half_t = m.time_step_us / 2
    slow = algbw(size_bytes, (m.time_us + half_t) * 1e-6) / 1e9
    fast = (
        algbw(size_bytes, (m.time_us - half_t) * 1e-6) / 1e9 if m.time_us - half_t > 0 else math.inf
    )
    half_a = m.algbw_step / 2
    return max(slow, m.algbw_gbps - half_a), min(fast, m.algbw_gbps + half_a)


def _tolerance(value: float) -> float:
    # Binary floating point of both printf and this code: far below any printed digit.
    return 1e-9 * max(1.0, abs(value))


def row_problems(row: PerfRow, op: OpName, ranks: int) -> list[str]:
    """Where a row disagrees with algbw = size / time and busbw = algbw x bus_factor(op, ranks).

    Each printed number is rounded to its last digit, so agreement means the intervals those
    roundings allow overlap; an empty list means the row is consistent.
    """
    problems: list[str] = []
    factor = bus_factor(op, ranks)
    for label, m in (("out-of-place", row.out_of_place), ("in-place", row.in_place)):
        low, high = _algbw_bounds(row.size_bytes, m)
        if low > high + _tolerance(high):
            problems.append(
                f"{row.size_bytes} B {label}: algbw {m.algbw_gbps} GB/s does not match "
                f"size / time = {row.size_bytes} B / {m.time_us} us"
            )
            continue
        half_b = m.busbw_step / 2
        least, most = factor * low - half_b, factor * high + half_b
        if not least - _tolerance(least) <= m.busbw_gbps <= most + _tolerance(most):
            problems.append(
                f"{row.size_bytes} B {label}: busbw {m.busbw_gbps} GB/s is not algbw "
                f"{m.algbw_gbps} x {factor:.4f} ({op}, {ranks} ranks)"
            )
    return problems


def consistent_ranks(
    rows: Iterable[PerfRow], op: OpName, candidates: Iterable[int] = range(2, 4097)
) -> tuple[int, ...]:
    """The rank counts whose bus factor every row agrees with (to recover n from an excerpt)."""
    rows = tuple(rows)
    return tuple(n for n in candidates if not any(row_problems(row, op, n) for row in rows))
