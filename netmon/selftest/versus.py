"""netmon's all_reduce busbw against nccl-tests' all_reduce_perf on the same GPUs and sizes: the run
of all_reduce_perf (a subprocess, one size at a time) and the pure comparison of the two."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from netmon.bandwidth import DTYPE_SHORT, format_size
from netmon.errors import one_line
from netmon.probe.nccl_tests import PerfRow, PerfTable, parse_table
from netmon.probe.spec import ProbeSpec, SizeResult
from netmon.selftest.checks import Row, gbps

# The goal: netmon's busbw within 3 % of all_reduce_perf's at every bandwidth size.
TOLERANCE = 0.03
BINARY = "all_reduce_perf"


class NcclTestsError(Exception):
    """all_reduce_perf could not be run, or printed no table; the message says which."""


@dataclass(frozen=True)
class SizeRatio:
    """One size: netmon's busbw and all_reduce_perf's in-place busbw, in bytes per second."""

    size_bytes: int
    netmon: float
    nccl_tests: float | None  # None: all_reduce_perf printed no row of this size
    wrong: int | None = None  # all_reduce_perf's in-place "#wrong" count

    @property
    def ratio(self) -> float | None:
        return self.netmon / self.nccl_tests if self.nccl_tests else None

    def within(self, tolerance: float = TOLERANCE) -> bool:
        ratio = self.ratio
        # The goal includes its edge: 0.97 is within 3 %, binary floating point or not.
        return ratio is not None and abs(ratio - 1.0) <= tolerance + 1e-12

    def as_dict(self) -> dict[str, Any]:
        return {
            "size_bytes": self.size_bytes,
            "netmon_busbw_bytes_per_second": self.netmon,
            "nccl_tests_busbw_bytes_per_second": self.nccl_tests,
            "ratio": self.ratio,
            "nccl_tests_wrong": self.wrong,
        }


def compare(results: Sequence[SizeResult], rows: Sequence[PerfRow]) -> tuple[SizeRatio, ...]:
    """netmon's all_reduce results against all_reduce_perf's rows, size by size.

    netmon's all_reduce runs in place on one buffer (bandwidth.buffers_for), so its figure is
    held against the in-place half of each row. Both are busbw as nccl-tests defines it, printed
    in decimal GB/s by all_reduce_perf (docs/FACTS.md, "Bandwidth definitions").
    """
    by_size = {row.size_bytes: row for row in rows}
    ratios = []
    for result in sorted(results, key=lambda r: r.size_bytes):
        row = by_size.get(result.size_bytes)
        ratios.append(
            SizeRatio(
                size_bytes=result.size_bytes,
                netmon=result.busbw_bytes_per_second,
                nccl_tests=row.in_place.busbw_gbps * 1e9 if row is not None else None,
                wrong=row.in_place.wrong if row is not None else None,
            )
        )
    return tuple(ratios)


def comparison_row(
    ratios: Sequence[SizeRatio], tolerance: float = TOLERANCE, note: str = ""
) -> Row:
    """PASS when every size is within `tolerance` of all_reduce_perf and it found no wrong value;
    `note` ends the detail (which NCCL each side ran)."""
    name, goal = "nccl-tests all_reduce", f"|netmon/nccl-tests - 1| <= {tolerance:g}"
    figures = {"sizes": [r.as_dict() for r in ratios], "tolerance": tolerance}
    if not ratios:
        return Row("nccl-tests", name, "FAIL", "", goal, "netmon gave no all_reduce result")
    compared = [r for r in ratios if r.ratio is not None]
    worst = max(compared, key=lambda r: abs((r.ratio or 0.0) - 1.0), default=None)
    measured = f"ratio {worst.ratio:.3f} at {format_size(worst.size_bytes)}" if worst else ""
    faults = []
    parts = []
    for r in ratios:
        size = format_size(r.size_bytes)
        if r.nccl_tests is None:
            faults.append(f"all_reduce_perf printed no row of {size}")
            continue
        if r.ratio is None:
            # all_reduce_perf prints GB/s with two decimals: a small size reads 0.00.
            parts.append(f"{size} not compared: all_reduce_perf printed busbw 0.00 GB/s")
            continue
        parts.append(f"{size} {gbps(r.netmon)}/{gbps(r.nccl_tests)} = {r.ratio:.3f}")
        if r.wrong:
            faults.append(f"all_reduce_perf found {r.wrong} wrong values at {size}")
        elif not r.within(tolerance):
            faults.append(f"{size} off by {abs((r.ratio or 0.0) - 1.0):.1%}")
    detail = "; ".join(faults + parts + ([note] if note else []))
    return Row("nccl-tests", name, "FAIL" if faults else "PASS", measured, goal, detail, figures)


def argv(binary: str, spec: ProbeSpec, size: int) -> list[str]:
    """all_reduce_perf on the spec's GPUs at one size, in its one-process form (`-g` GPUs driven by
    one thread), with netmon's dtype, warm-up and number of timed ops."""
    timed_ops = spec.iters * (spec.batch if spec.timing == "batched" else 1)
    return [
        binary,
        *("-b", str(size), "-e", str(size)),
        *("-g", str(spec.ranks)),
        *("-d", DTYPE_SHORT[spec.dtype], "-o", "sum"),
        *("-w", str(spec.warmup), "-n", str(timed_ops)),
        *("-c", "1"),
    ]


def environment(spec: ProbeSpec) -> dict[str, str]:
    """The ranks' GPUs, named as netmon named them, and the NCCL settings the probe ran with."""
    gpus = spec.cuda_devices or spec.devices
    return {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": ",".join(gpus),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        **spec.env_dict(),
    }


def nccl_version(code: int | None) -> str | None:
    """NCCL_VERSION_CODE as all_reduce_perf prints it (22902) in NCCL's spelling ("2.29.2")."""
    if code is None:
        return None
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def version_note(tables: Sequence[PerfTable], ranks_nccl: str | None) -> str:
    """Which NCCL each side ran: a comparison across versions measures the versions too."""
    theirs = nccl_version(tables[0].nccl_library) if tables else None
    if theirs is None or ranks_nccl is None:
        return ""
    if theirs == ranks_nccl.split("+")[0]:
        return f"both ran NCCL {theirs}"
    return f"all_reduce_perf ran NCCL {theirs}, netmon's ranks NCCL {ranks_nccl}"


def run_all_reduce_perf(binary: str, spec: ProbeSpec, timeout: float) -> tuple[PerfTable, ...]:
    """all_reduce_perf's table at every size of the spec (NcclTestsError when one run fails)."""
    tables: list[PerfTable] = []
    for size in spec.sizes:
        command = argv(binary, spec, size)
        try:
            done = subprocess.run(
                command,
                env=environment(spec),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NcclTestsError(f"{' '.join(command)}: {one_line(exc)}") from None
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
        if done.returncode != 0:
            raise NcclTestsError(f"{' '.join(command)} exited with {done.returncode}: {tail}")
        try:
            table = parse_table(done.stdout)
        except ValueError as exc:
            raise NcclTestsError(f"{' '.join(command)}: {exc}: {tail}") from None
        if table.n_ranks is not None and table.n_ranks != spec.ranks:
            raise NcclTestsError(f"all_reduce_perf ran {table.n_ranks} ranks, not {spec.ranks}")
        tables.append(table)
    return tuple(tables)
