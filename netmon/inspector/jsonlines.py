"""NCCL Inspector's JSON lines (its default mode) into Collectives. Pure: complete lines in.

The plugin (ext-profiler/inspector/inspector.cc and json.cc, NCCL v2.29.3-1, format "v4.0")
writes `<hostname>-pid<pid>.log` for the life of a process: each dump, for each communicator
that completed a collective since the last, one compact object with its latest collective:

    {"header":{"id":"0x..","rank":3,"n_ranks":8,"nnodes":1},
     "metadata":{"inspector_output_format_version":"v4.0",...,"hostname":"..","pid":123},
     "coll_perf":{"coll":"AllReduce","coll_sn":41,"coll_msg_size_bytes":2147483648,
                  "coll_exec_time_us":11459,"coll_timing_source":"kernel_gpu",
                  "coll_algobw_gbs":187.421360,"coll_busbw_gbs":327.987380}}

(one line). netmon.inspector.files reads the file from where it stopped, whole lines only.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from netmon.inspector.promfile import POINT_TO_POINT
from netmon.inspector.records import (
    GB,
    Collective,
    Parsed,
    RecordError,
    count,
    op_of,
    positive,
    total_size,
)


def parse(lines: Iterable[bytes], source: str, max_line: int) -> Parsed:
    parsed = Parsed()
    for raw in lines:
        text = parsed.line(raw, max_line)
        record = _record(text, parsed.rejected) if text is not None else None
        if record is not None:
            parsed.add(lambda: _collective(record, source))  # noqa: B023 (called at once)
    return parsed


def _record(text: str, rejected: Counter[str]) -> Mapping[str, Any] | None:
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):  # a line of 3,000 nested "[" recurses past the limit
        rejected["unparsable"] += 1
        return None
    if not isinstance(record, dict):
        rejected["unparsable"] += 1
        return None
    return record


def _collective(record: Mapping[str, Any], source: str) -> Collective | None:
    header, perf = record.get("header"), record.get("coll_perf")
    if not isinstance(header, dict) or not isinstance(perf, dict):
        return None  # another record kind (v2.30's p2p_perf): not a collective
    name = perf.get("coll")
    if not isinstance(name, str):
        raise RecordError("incomplete", f"{source}: a record without coll_perf.coll")
    if name in POINT_TO_POINT:
        return None
    ranks = count(header.get("n_ranks"), "n_ranks")
    if ranks == 1:
        return None  # a communicator of one rank crosses no link (its busbw is 0)
    busbw = positive(_number(perf, "coll_busbw_gbs"), "coll_busbw_gbs") * GB
    comm_id = header.get("id", "")
    if not isinstance(comm_id, str):  # a nested value would be printed whole, recursively
        raise RecordError("bad_value", f"{source}: header.id is not a string")
    op = op_of(name)
    message = count(perf.get("coll_msg_size_bytes"), "coll_msg_size_bytes", most=1 << 50)
    return Collective(
        op=op,
        size_bytes=total_size(op, message, ranks),
        ranks=ranks,
        nodes=count(header.get("nnodes"), "nnodes"),
        busbw=busbw,
        algbw=positive(_number(perf, "coll_algobw_gbs"), "coll_algobw_gbs") * GB,
        seconds=positive(_number(perf, "coll_exec_time_us"), "coll_exec_time_us") / 1e6,
        comm=f"{source.partition('/')[0]}/{comm_id}",
        serial=count(perf.get("coll_sn") or 1, "coll_sn", most=1 << 63),
    )


def _number(perf: Mapping[str, Any], key: str) -> float:
    value = perf.get(key)
    # json.cc writes NaN as the string "nan"; a bool is no number either.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError("bad_value", f"{key} {str(value)[:40]!r} is not a number")
    return float(value)
