"""netmon's all_reduce busbw against nccl-tests' all_reduce_perf on the same GPUs and sizes: the run
of all_reduce_perf (a subprocess, one size at a time) and the pure comparison of the two."""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netmon.bandwidth import DTYPE_SHORT, format_size
from netmon.errors import one_line
from netmon.probe.nccl_tests import PerfRow, PerfTable, parse_table
from netmon.probe.spec import ProbeSpec, SizeResult
from netmon.selftest.checks import Row, Status, gbps

# The goal: netmon's busbw within 3 % of all_reduce_perf's at every bandwidth size.
TOLERANCE = 0.03
BINARY = "all_reduce_perf"
# Like with like: each timed block is OPS ops back to back, all_reduce_perf's own default (-n 20);
# netmon's sample is one such block (its batch), and all_reduce_perf times CYCLES blocks (-N),
# whose rows are taken at their median as netmon takes its samples'.
OPS = 20
CYCLES = 10
COMPARABLE: dict[str, Any] = {
    "batch": OPS,
    "iters": CYCLES,
    "timing": "batched",
    "cuda_graph": "off",
}
# Each timed block pays the host's launch gap once (an event, then the first launch: 5-20 us on
# current drivers), netmon's and all_reduce_perf's alike, so a size is judged only where that gap
# is under GAP_SHARE of the block: there it cannot make the 3 % by itself.
LAUNCH_GAP_S = 20e-6
GAP_SHARE = 0.01


class NcclTestsError(Exception):
    """all_reduce_perf could not be run, or printed no table; the message says which."""


@dataclass(frozen=True)
class SizeRatio:
    """One size: netmon's busbw and all_reduce_perf's in-place busbw, in bytes per second."""

    size_bytes: int
    netmon: float
    nccl_tests: float | None  # None: all_reduce_perf printed no row of this size
    wrong: int | None = None  # all_reduce_perf's in-place "#wrong" count
    time_s: float | None = None  # all_reduce_perf's in-place time per op (its rows' median)

    @property
    def ratio(self) -> float | None:
        return self.netmon / self.nccl_tests if self.nccl_tests else None

    @property
    def gap_share(self) -> float | None:
        """The launch gap's share of one timed block at this size; None when not known."""
        return LAUNCH_GAP_S / (OPS * self.time_s) if self.time_s else None

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
            "nccl_tests_time_s": self.time_s,
            "launch_gap_share": self.gap_share,
        }


def compare(results: Sequence[SizeResult], rows: Sequence[PerfRow]) -> tuple[SizeRatio, ...]:
    """netmon's all_reduce results against all_reduce_perf's rows, size by size.

    netmon's all_reduce runs in place on one buffer (bandwidth.buffers_for), so its figure is
    held against the in-place half of each row. Both are busbw as nccl-tests defines it, printed
    in decimal GB/s by all_reduce_perf (docs/FACTS.md, "Bandwidth definitions"). A size that
    all_reduce_perf ran for several cycles (-N) is its rows' median, as netmon's is its
    samples'; their wrong values add up.
    """
    by_size: dict[int, list[PerfRow]] = {}
    for row in rows:
        by_size.setdefault(row.size_bytes, []).append(row)
    ratios = []
    for result in sorted(results, key=lambda r: r.size_bytes):
        cycles = [row.in_place for row in by_size.get(result.size_bytes, [])]
        wrong = [m.wrong for m in cycles if m.wrong is not None]
        ratios.append(
            SizeRatio(
                size_bytes=result.size_bytes,
                netmon=result.busbw_bytes_per_second,
                nccl_tests=statistics.median(m.busbw_gbps for m in cycles) * 1e9
                if cycles
                else None,
                wrong=sum(wrong) if wrong else None,
                time_s=statistics.median(m.time_us for m in cycles) * 1e-6 if cycles else None,
            )
        )
    return tuple(ratios)


def comparison_row(
    ratios: Sequence[SizeRatio], tolerance: float = TOLERANCE, note: str = ""
) -> Row:
    """PASS when every judged size is within `tolerance` of all_reduce_perf and it found no wrong
    value; SKIP when no size is judged (the launch gap too large at all of them); `note` ends
    the detail (which NCCL each side ran)."""
    name, goal = "nccl-tests all_reduce", f"|netmon/nccl-tests - 1| <= {tolerance:g}"
    figures = {"sizes": [r.as_dict() for r in ratios], "tolerance": tolerance}
    if not ratios:
        return Row("nccl-tests", name, "FAIL", "", goal, "netmon gave no all_reduce result")
    faults, parts, judged = _judge_sizes(ratios, tolerance)
    worst = max(judged, key=lambda r: abs((r.ratio or 0.0) - 1.0), default=None)
    measured = f"ratio {worst.ratio:.3f} at {format_size(worst.size_bytes)}" if worst else ""
    detail = "; ".join(faults + parts + ([note] if note else []))
    status: Status = "FAIL" if faults else "PASS" if judged else "SKIP"
    if status == "SKIP":
        detail = f"no size where the launch gap is under {GAP_SHARE:.0%} (give larger --sizes); "
        detail += "; ".join(parts)
    return Row("nccl-tests", name, status, measured, goal, detail, figures)


def _judge_sizes(
    ratios: Sequence[SizeRatio], tolerance: float
) -> tuple[list[str], list[str], list[SizeRatio]]:
    """What fails, what each size shows, and the sizes judged."""
    faults: list[str] = []
    parts: list[str] = []
    judged: list[SizeRatio] = []
    for r in ratios:
        size = format_size(r.size_bytes)
        if r.nccl_tests is None:
            faults.append(f"all_reduce_perf printed no row of {size}")
            continue
        if r.ratio is None:
            # all_reduce_perf prints GB/s with two decimals: a small size reads 0.00.
            parts.append(f"{size} not compared: all_reduce_perf printed busbw 0.00 GB/s")
            continue
        if r.wrong:
            faults.append(f"all_reduce_perf found {r.wrong} wrong values at {size}")
        gap = r.gap_share
        if gap is not None and gap > GAP_SHARE:
            parts.append(f"{size} not judged: the launch gap is {gap:.1%} of a block there")
            continue
        judged.append(r)
        parts.append(f"{size} {gbps(r.netmon)}/{gbps(r.nccl_tests)} = {r.ratio:.3f}")
        if not r.wrong and not r.within(tolerance):
            faults.append(f"{size} off by {abs((r.ratio or 0.0) - 1.0):.1%}")
    return faults, parts, judged


def argv(binary: str, spec: ProbeSpec, size: int) -> list[str]:
    """all_reduce_perf on the spec's GPUs at one size, in its one-process form (`-g` GPUs driven by
    one thread: without MPI it has no other), with netmon's dtype and warm-up, its blocks as long
    as netmon's batch (-n) and as many as netmon's samples (-N cycles)."""
    block = spec.batch if spec.timing == "batched" else 1
    return [
        binary,
        *("-b", str(size), "-e", str(size)),
        *("-g", str(spec.ranks)),
        *("-d", DTYPE_SHORT[spec.dtype], "-o", "sum"),
        *("-w", str(spec.warmup), "-n", str(block), "-N", str(spec.iters)),
        *("-c", "1"),
    ]


def environment(spec: ProbeSpec) -> dict[str, str]:
    """The ranks' GPUs, named as netmon named them, and the NCCL settings the probe ran with."""
    gpus = spec.cuda_devices or spec.devices
    found = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": ",".join(gpus),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        **spec.env_dict(),
    }
    # The NCCL torch loads, first: all_reduce_perf links libnccl.so.2 dynamically (nccl-tests'
    # Makefile), so both sides run one library unless its build linked NCCL statically.
    library = torch_nccl_dir()
    if library is not None:
        found["LD_LIBRARY_PATH"] = os.pathsep.join(
            [str(library), *filter(None, [found.get("LD_LIBRARY_PATH")])]
        )
    return found


def torch_nccl_dir() -> Path | None:
    """Where the NCCL of torch's wheel lies (the nvidia-nccl-cu* package: nvidia/nccl/lib), found
    without importing torch; None for a torch built against a system NCCL."""
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        library = Path(location) / "lib"
        if any(library.glob("libnccl.so*")):
            return library
    return None


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
