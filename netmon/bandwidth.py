"""Pure bandwidth maths: units, the nccl-tests bus factors, buffer sizing and sample statistics.

Every number netmon reports is defined here, so that it means exactly what nccl-tests'
doc/PERFORMANCE.md means: algbw = S / t with S as nccl-tests prints it, busbw = algbw x factor.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

OpName = Literal[
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "alltoall",
    "sendrecv",
    "all_gather_object",
]
OPS: tuple[OpName, ...] = get_args(OpName)

DTypeName = Literal["float32", "bfloat16", "float16"]
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
# nccl-tests prints these names in its "type" column.
DTYPE_SHORT: dict[str, str] = {"float32": "float", "bfloat16": "bfloat16", "float16": "half"}

_BINARY = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_DECIMAL = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_DURATION = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

# The grammars of sizes, rates and durations as text. Case is spelt out in classes rather than
# with a flag, so the same patterns serve the JSON schema of netmon.yaml (netmon.schema), whose
# regular expressions take no flags.
SIZE_PATTERN = r"^\s*(\d+(?:\.\d+)?)\s*([KMGTkmgt]?)(?:[iI]?[bB])?\s*$"
RATE_PATTERN = r"^\s*(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*([KMGTkmgt]?)(?:[bB](?:/[sS])?)?\s*$"
DURATION_PATTERN = r"^\s*(\d+(?:\.\d+)?)\s*([mM][sS]|[sSmMhHdD])?\s*$"
_SIZE_RE = re.compile(SIZE_PATTERN)
_RATE_RE = re.compile(RATE_PATTERN)
# A rate without a suffix under this is refused: no interconnect gate means bytes/s that low.
BARE_RATE_FLOOR = 1e6
# The largest size a probe or a sweep pair moves, and the largest size threshold: 16 GiB. A rank
# holds up to twice its size (buffer_budget) beside its CUDA context, so 16G already takes 32 GiB
# of a GPU's (and, with gloo, of the host's) memory; nccl-tests' own sweeps end at 8G or 16G.
# A larger size is a typo (1T for 1G) that would OOM-kill ranks or the node, not a measurement.
MAX_PROBE_SIZE = 16 << 30
# The largest memory amount a setting names (idle.max_memory_used): no GPU holds 1 TiB.
MAX_MEMORY_SIZE = 1 << 40
_DURATION_RE = re.compile(DURATION_PATTERN)


def parse_size(text: str | int) -> int:
    """Bytes from "8", "64K", "16M", "1G" (binary multiples, as nccl-tests: 64K = 65536)."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a size; use bytes with an optional K, M, G suffix")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size {text} is negative; use a byte count >= 0")
        return text
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a size; use bytes with an optional K, M, G suffix (64K)")
    value = float(match.group(1)) * _BINARY[match.group(2).upper()]
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is too large for a size")
    if value != int(value):
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)


def bounded_size(text: str | int, bound: int, why: str) -> int:
    """parse_size, refused above `bound` with a message that names the bound and `why`."""
    size = parse_size(text)
    if size > bound:
        raise ValueError(f"{text!r} is more than {format_size(bound)}, the most {why}")
    return size


def parse_rate(text: str | float) -> float:
    """Bytes per second from "1.5G" or "1.5GB/s" (decimal multiples, as nccl-tests' GB/s)."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a rate; use bytes/s with an optional K, M, G suffix")
    if isinstance(text, (int, float)):
        value, bare = float(text), True
    else:
        match = _RATE_RE.match(str(text))
        if not match:
            raise ValueError(
                f"{text!r} is not a rate; use bytes/s with an optional K, M, G suffix "
                "(1.5G = 1.5e9)"
            )
        value = float(match.group(1)) * _DECIMAL[match.group(2).upper()]
        bare = not match.group(2)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"rate {text!r} must be a finite number >= 0")
    if bare and 0 < value < BARE_RATE_FLOOR:
        # "150" meant as GB/s is 150 B/s, which every link passes: a gate that never fails.
        raise ValueError(
            f"rate {text!r} is {value:g} bytes/s, under 1 MB/s: did you mean {value:g}G? "
            "Give the suffix (K, M, G: 150G = 150e9 B/s)"
        )
    return value


def parse_duration(text: str | float) -> float:
    """Seconds from "500ms", "60s", "15m", "1h" or a bare number of seconds."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration; use a number with ms, s, m or h")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _DURATION_RE.match(str(text))
        if not match:
            raise ValueError(f"{text!r} is not a duration; use a number with ms, s, m or h (15m)")
        value = float(match.group(1)) * _DURATION[(match.group(2) or "s").lower()]
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"duration {text!r} must be a finite number >= 0")
    return value


def size_sweep(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """nccl-tests' -b/-e/-f sweep: min, min*f, ... up to and including max."""
    if min_bytes <= 0 or max_bytes < min_bytes:
        raise ValueError("the sweep needs 0 < min (-b) <= max (-e)")
    if factor < 2:
        raise ValueError("the sweep factor (-f) must be an integer >= 2")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


def format_size(size: int) -> str:
    """The shortest exact binary spelling: 65536 -> "64K"."""
    for suffix in ("T", "G", "M", "K"):
        unit = _BINARY[suffix]
        if size >= unit and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def bus_factor(op: OpName, ranks: int) -> float:
    """The factor busbw = algbw x factor of nccl-tests' doc/PERFORMANCE.md."""
    if ranks < 1:
        raise ValueError("ranks must be >= 1")
    n = ranks
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "alltoall", "all_gather_object"):
        return (n - 1) / n
    return 1.0  # broadcast, sendrecv


@dataclass(frozen=True)
class Buffers:
    """The buffers one rank allocates for one op, in elements, and the size S nccl-tests reports.

    An out_count of 0 means the op works in place on its input (all_reduce, broadcast).
    all_gather_object holds no tensors: its input is a host payload of in_count elements' bytes,
    its output the n payloads gathered.
    """

    in_count: int
    out_count: int
    size_bytes: int  # S in algbw = S / t
    count: int  # the "count" column of nccl-tests
    element_bytes: int

    @property
    def budget_bytes(self) -> int:
        return (self.in_count + self.out_count) * self.element_bytes


def buffers_for(op: OpName, size_bytes: int, ranks: int, dtype: DTypeName) -> Buffers:
    """The buffers of one op for a requested size, rounded down as nccl-tests does, never empty.

    For all_gather and reduce_scatter S is the gathered (total) buffer, so a rank holds S/n and S;
    alltoall splits S evenly between ranks and needs S in and S out, as does sendrecv; all_reduce
    and broadcast run in place on one buffer of S.
    """
    width = DTYPE_BYTES[dtype]
    elements = size_bytes // width
    if op in ("all_gather", "reduce_scatter", "all_gather_object"):
        per_rank = max(1, elements // ranks)
        total = per_rank * ranks
        if op == "reduce_scatter":
            return Buffers(total, per_rank, total * width, total, width)
        return Buffers(per_rank, total, total * width, total, width)
    if op == "alltoall":
        total = max(1, elements // ranks) * ranks
        return Buffers(total, total, total * width, total, width)
    count = max(1, elements)
    if op in ("all_reduce", "broadcast"):
        return Buffers(count, 0, count * width, count, width)
    return Buffers(count, count, count * width, count, width)  # sendrecv


def buffer_budget(op: OpName, size_bytes: int, ranks: int, dtype: DTypeName) -> int:
    """Bytes of the buffers one rank allocates for one op of the requested size.

    In S, the size nccl-tests reports for the op, and n ranks: S for all_reduce and broadcast (in
    place), S/n + S for all_gather, S + S/n for reduce_scatter, 2S for alltoall and sendrecv, and
    for all_gather_object S/n + S of host bytes (torch's pickling stages further copies of its
    own). A probe in chunks allocates for one chunk: pass size // chunks. Tensors live in device
    memory with nccl and in host memory with gloo.
    """
    return buffers_for(op, size_bytes, ranks, dtype).budget_bytes


def algbw(size_bytes: int, seconds: float) -> float:
    return size_bytes / seconds if seconds > 0 else 0.0


def busbw(op: OpName, ranks: int, size_bytes: int, seconds: float) -> float:
    return algbw(size_bytes, seconds) * bus_factor(op, ranks)


@dataclass(frozen=True)
class Spread:
    """Order statistics of per-op times in seconds."""

    median: float
    min: float
    p10: float
    p90: float
    max: float
    mean: float
    cv: float  # coefficient of variation: population stdev / mean
    samples: int


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        raise ValueError("percentile of no samples")
    position = fraction * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    weight = position - low
    return sorted_values[low] * (1 - weight) + sorted_values[high] * weight


# How one sample's time is taken from the ranks' times: max, the slowest rank (a collective is
# done when its last rank is; netmon's default), or mean, nccl-tests' default (`-a 1`), or min.
RankStat = Literal["max", "mean", "min"]
RANK_STATS: tuple[RankStat, ...] = get_args(RankStat)


def combine_ranks(per_rank: Sequence[Sequence[float]], stat: RankStat) -> list[float]:
    """Each sample's time across ranks: per_rank[r][s] is rank r's time of sample s."""
    if not per_rank or len({len(times) for times in per_rank}) != 1:
        raise ValueError("every rank needs the same number of samples")
    columns = list(zip(*per_rank, strict=True))
    if stat == "max":
        return [max(column) for column in columns]
    if stat == "min":
        return [min(column) for column in columns]
    return [statistics.fmean(column) for column in columns]


def rank_medians(per_rank: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """Each rank's median time: a rank far above the others is the slow one."""
    return tuple(statistics.median(times) for times in per_rank)


def spread(samples: Sequence[float]) -> Spread:
    if not samples:
        raise ValueError("spread of no samples")
    ordered = sorted(samples)
    mean = statistics.fmean(ordered)
    # In floats: statistics.pstdev sums exact fractions, a millisecond for 20 samples, paid for
    # every size of every run in the daemon.
    stdev = (
        math.sqrt(statistics.fmean([(x - mean) ** 2 for x in ordered])) if len(ordered) > 1 else 0.0
    )
    return Spread(
        median=statistics.median(ordered),
        min=ordered[0],
        p10=percentile(ordered, 0.10),
        p90=percentile(ordered, 0.90),
        max=ordered[-1],
        mean=mean,
        cv=stdev / mean if mean > 0 else 0.0,
        samples=len(ordered),
    )
