"""NCCL Inspector's textfile dumps (NCCL_INSPECTOR_PROM_DUMP=1) into Collectives. Pure: bytes in.

The plugin (ext-profiler/inspector/inspector_prom.cc, NCCL v2.29.3-1) rewrites
`nccl_inspector_metrics_<GPU UUID>.prom` in place every dump interval: for each communicator that
completed a collective since the last dump, its latest collective as three lines sharing one
label set, no HELP or TYPE lines:

    nccl_algorithm_bandwidth_gbs{comm_id="0x..",hostname="..",rank="3",...} 187.42
    nccl_bus_bandwidth_gbs{...} 328
    nccl_collective_exec_time_microseconds{...} 11459

Later releases (plugins/profiler/inspector, label version="v5.1") aggregate per communicator,
collective and size range ("1-2KB") instead, with no algbw line; both are read. Lines are
parsed one at a time with prometheus_client's parser, so one bad line costs only itself.
"""

from __future__ import annotations

import re
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from netmon.inspector.records import (
    GB,
    Collective,
    Parsed,
    RecordError,
    bus_factor,
    count,
    op_of,
    positive,
    size_of,
    total_size,
)

ALGBW = "nccl_algorithm_bandwidth_gbs"
BUSBW = "nccl_bus_bandwidth_gbs"
EXEC_US = "nccl_collective_exec_time_microseconds"
METRICS = (ALGBW, BUSBW, EXEC_US)
# Point-to-point lines (Send, Recv, SendRecv; v5.1's nccl_p2p_* families) are no collective.
POINT_TO_POINT = ("Send", "Recv", "SendRecv")
_RANGE = re.compile(r"^(\d+)-\d+(B|KB|MB|GB|TB)$")  # v5.1: "1-2KB", the lower bound taken


def parse(data: bytes, source: str, max_line: int) -> Parsed:
    parsed = Parsed()
    groups: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
    lines = data.split(b"\n")
    if lines[-1]:
        # Rewritten in place, not renamed: a read can meet a dump half written.
        parsed.rejected["truncated_line"] += 1
    for raw in lines[:-1]:
        text = parsed.line(raw, max_line)
        sample = _sample(text, parsed.rejected) if text is not None else None
        if sample is not None:
            name, found, value = sample
            groups.setdefault(tuple(sorted(found.items())), {})[name] = value
    for labels, values in groups.items():
        parsed.add(lambda: _collective(dict(labels), values, source))  # noqa: B023 (called at once)
    return parsed


def _sample(text: str, rejected: Counter[str]) -> tuple[str, dict[str, str], float] | None:
    if text.startswith("#"):
        return None
    try:
        families = list(text_string_to_metric_families(text + "\n"))
    except Exception:  # whatever a hostile line makes the parser raise costs that line only
        rejected["unparsable"] += 1
        return None
    samples = [s for f in families for s in f.samples]
    if len(samples) != 1 or samples[0].name not in METRICS:
        return None  # another family: not one this reads
    sample = samples[0]
    labels = dict(sample.labels)
    return sample.name, labels, float(sample.value)


def _collective(labels: dict[str, str], values: dict[str, float], source: str) -> Collective | None:
    name = labels.get("collective", "")
    if name in POINT_TO_POINT:
        return None
    if BUSBW not in values or EXEC_US not in values:
        raise RecordError("incomplete", f"{source}: a collective without its busbw or time line")
    op = op_of(name)
    ranks = count(labels.get("nranks", ""), "nranks")
    if ranks == 1:
        return None  # a communicator of one rank crosses no link (its busbw is 0)
    busbw = positive(values[BUSBW], BUSBW) * GB
    algbw = values[ALGBW] * GB if ALGBW in values else busbw / bus_factor(op, ranks)
    comm = labels.get("comm_id") or labels.get("comm_name", "")
    return Collective(
        op=op,
        size_bytes=total_size(op, _message_size(labels.get("message_size", "")), ranks),
        ranks=ranks,
        nodes=count(labels.get("n_nodes", ""), "n_nodes"),
        busbw=busbw,
        algbw=algbw,
        seconds=positive(values[EXEC_US], EXEC_US) / 1e6,
        comm=f"{source.partition('/')[0]}/{comm}",
        serial=_serial(labels.get("coll_sn", "0")),
    )


def _message_size(text: str) -> int:
    ranged = _RANGE.match(text)
    if ranged is not None:
        return size_of(f"{ranged.group(1)}{ranged.group(2)}")
    return size_of(text)


def _serial(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise RecordError("bad_value", f"coll_sn {text[:40]!r} is not a number") from None
