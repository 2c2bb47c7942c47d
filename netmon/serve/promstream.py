"""A Prometheus query_range answer for netmon_busbw_bytes_per_second, as a replay stream.

Prometheus samples the gauge at every step of the range, so one result appears at every step
until the next one: consecutive samples with the same value are one result, taken at the first
of them. A step no longer than the probe's interval keeps every result (docs/SIGNAL.md,
"Replay"). Pure parsing; the labels netmon exports name the series.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

LABELS = ("probe", "op", "size_bytes", "path", "ranks")


def is_query_range(document: object) -> bool:
    return (
        isinstance(document, Mapping)
        and isinstance(document.get("data"), Mapping)
        and document["data"].get("resultType") == "matrix"
    )


def results_of(document: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every result of every series in the answer, each series in time order, series after
    series (a replay keeps each series' order; series do not share state). ValueError naming
    the series and the label or sample that is wrong."""
    seen: set[tuple[object, ...]] = set()
    for index, item in enumerate(document["data"].get("result") or []):
        metric = item.get("metric") if isinstance(item, Mapping) else None
        if not isinstance(metric, Mapping):
            raise ValueError(f"data.result[{index}]: no metric labels")
        missing = [label for label in LABELS if label not in metric]
        if missing:
            raise ValueError(
                f"data.result[{index}]: label {missing[0]} missing: query "
                "netmon_busbw_bytes_per_second, whose series carry " + ", ".join(LABELS)
            )
        labels = {
            "probe": metric["probe"],
            "op": metric["op"],
            "size": _int(metric["size_bytes"], index, "size_bytes"),
            "path": metric["path"],
            "ranks": _int(metric["ranks"], index, "ranks"),
        }
        key = tuple(labels.values())
        if key in seen:
            raise ValueError(
                f"data.result[{index}]: a second series of {'/'.join(map(str, key))}: "
                "query one instance at a time"
            )
        seen.add(key)
        previous: str | None = None
        for sample in item.get("values") or []:
            if not (isinstance(sample, list) and len(sample) == 2):
                raise ValueError(f'data.result[{index}].values: a sample is [time, "value"]')
            at, value = sample
            if value != previous:
                yield {"t": float(at), **labels, "busbw": float(value)}
            previous = value


def _int(text: object, index: int, label: str) -> int:
    try:
        return int(str(text))
    except ValueError:
        raise ValueError(
            f"data.result[{index}]: label {label}={text!r} is not a whole number"
        ) from None
