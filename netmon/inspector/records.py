"""One collective as NCCL Inspector recorded it, in netmon's terms: the op in netmon's spelling,
sizes in bytes, rates in bytes per second. Pure: the parsers (promfile, jsonlines) build these.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

# Inspector's collective names (ncclFuncToString in NCCL's src/collectives.cc, which the
# plugin prints) in netmon's spelling; the plugin records no other collective kind.
OPS = {
    "AllReduce": "all_reduce",
    "AllGather": "all_gather",
    "ReduceScatter": "reduce_scatter",
    "Broadcast": "broadcast",
    "Reduce": "reduce",
}

# The plugin prints a message size in binary units with two decimals ("2.00GB", "512.00KB") or
# as bytes ("96B"): inspector_prom.cc. 1 KB there is 1024 bytes.
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB)\s*$")
_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}

GB = 1e9  # the plugin's GB/s: bytes x 1e-9 per second, as nccl-tests'

# What a record may claim, whoever wrote it (docs/FACTS.md). NVLink 5 moves 1.8 TB/s per GPU,
# both directions together: a busbw over that is beyond any GPU's link today. A collective that
# ran longer than torch's default collective timeout (10 minutes) would have ended its job.
MAX_BUSBW = 1.8e12  # bytes/s
MAX_SECONDS = 600.0
# The plugin derives algbw from the time and busbw from algbw (inspectorComputeCollBw); what it
# prints is rounded, and a later release's size is the lower end of a range (up to 2x under):
# the figures must agree within this factor, never more.
AGREE = 4.0


class RecordError(ValueError):
    """A field that is not what the plugin writes; `reason` is its counter's label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Collective:
    """One completed collective on one rank. `comm` names the job's communicator, `serial` is
    its collective number (coll_sn): the ranks of one collective share both."""

    op: str
    size_bytes: int
    ranks: int
    nodes: int
    busbw: float  # bytes/s
    algbw: float  # bytes/s
    seconds: float  # the collective's execution time
    comm: str  # "<job directory>/<communicator id>": the parsers prefix the job
    serial: int
    # Who wrote the record (the uid owning the job's file or directory), where the reader knows:
    # a job's figures are trusted only as far as other owners agree (docs/INSPECTOR.md, "What a
    # job can and cannot make netmon say").
    owner: int | None = None

    @property
    def job(self) -> str:
        return self.comm.partition("/")[0]

    @property
    def witness(self) -> str:
        """Whose word this record is: its owner where known, else its job directory."""
        return f"uid {self.owner}" if self.owner is not None else f"job {self.job}"


def implausible(collective: Collective) -> str | None:
    """Why a record's figures cannot be a measurement (its counter's reason), or None.

    A shape's rank for the shape slots is the time its collectives took, and its value their
    busbw: a claimed time out of line with the size and rate, or a rate beyond any link, would
    buy a job slots or a level it never measured."""
    c = collective
    if c.busbw > MAX_BUSBW or c.algbw > MAX_BUSBW:
        return "implausible_busbw"
    factor = bus_factor(c.op, c.ranks)
    if not c.algbw * factor / AGREE <= c.busbw <= c.algbw * factor * AGREE:
        return "implausible_busbw"  # busbw is algbw x the bus factor, nothing else
    # Only a time longer than the size and rate imply buys slots; a shorter one (a range's lower
    # end taken as the size) buys nothing.
    if c.seconds > MAX_SECONDS or c.seconds > AGREE * c.size_bytes / c.algbw:
        return "implausible_time"
    return None


def op_of(name: str) -> str:
    try:
        return OPS[name]
    except KeyError:
        raise RecordError(
            "unknown_collective", f"collective {name[:40]!r} is not one the plugin records"
        ) from None


def size_of(text: str) -> int:
    match = _SIZE.match(text)
    if match is None:
        raise RecordError("bad_value", f"message_size {text[:40]!r} is not a size like 2.00GB")
    size = int(float(match.group(1)) * _UNITS[match.group(2)])
    if size < 1:
        raise RecordError("bad_value", f"message_size {text[:40]!r} moves nothing")
    return size


def total_size(op: str, message_bytes: int, ranks: int) -> int:
    """The size netmon (and nccl-tests) report for a collective: the plugin's message size is
    one rank's count x type size, which for all_gather and reduce_scatter is 1/ranks of it."""
    return message_bytes * ranks if op in ("all_gather", "reduce_scatter") else message_bytes


def bus_factor(op: str, ranks: int) -> float:
    """busbw = algbw x this (the plugin's inspectorComputeCollBw, as nccl-tests'); never 0, as
    a communicator of one rank moves nothing over a link and has a busbw of 0."""
    if op == "all_reduce":
        return max(2.0 * (ranks - 1) / ranks, 1e-9)
    if op in ("all_gather", "reduce_scatter"):
        return max((ranks - 1) / ranks, 1e-9)
    return 1.0


def positive(value: float, field: str) -> float:
    if not math.isfinite(value) or value <= 0:
        raise RecordError("bad_value", f"{field} {value!r} is not a positive number")
    return value


def count(text: object, field: str, most: int = 1 << 20) -> int:
    """A whole number from 1 to `most` (a rank or node count by default)."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise RecordError("bad_value", f"{field} {str(text)[:40]!r} is not a whole number")
    try:
        number = int(text)
    except ValueError:
        raise RecordError(
            "bad_value", f"{field} {str(text)[:40]!r} is not a whole number"
        ) from None
    if number < 1 or number > most:
        raise RecordError("bad_value", f"{field} {number} is out of range")
    return number


@dataclass
class Parsed:
    """What one file gave: its collectives, and its rejected lines by reason."""

    collectives: list[Collective] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)

    def line(self, raw: bytes, max_line: int) -> str | None:
        """A line's text, or None (counted) when it is too long or not UTF-8, or blank."""
        if len(raw) > max_line:
            self.rejected["oversized_line"] += 1
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.rejected["not_utf8"] += 1
            return None
        return text if text.strip() else None

    def add(self, build: Callable[[], Collective | None]) -> None:
        """The collective `build` makes of a record, or its RecordError counted; None: a record
        that is no collective (point-to-point, one rank)."""
        try:
            collective = build()
        except RecordError as exc:
            self.rejected[exc.reason] += 1
            return
        if collective is not None:
            self.collectives.append(collective)
