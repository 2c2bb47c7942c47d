"""Metric families as the catalogue describes them, and the helpers every collector uses."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeAlias

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from netmon.exposition.catalogue import BY_NAME, NVML_WHEN, NVML_WHEN_PROBES, SWEEP_WHEN
from netmon.exposition.snapshot import Snapshot

MetricFamily: TypeAlias = GaugeMetricFamily | CounterMetricFamily


def _interval_text(snapshot: Snapshot) -> str:
    parts = [
        f"{name} every {stats.interval_s:g} s" if stats.interval_s else f"{name} once"
        for name, stats in snapshot.probes.items()
    ]
    return "Measured by the probes (" + ", ".join(parts) + "), not at scrape time"


def family(name: str, snapshot: Snapshot) -> MetricFamily:
    """An empty family as the catalogue describes it; HELP says when its values were measured."""
    entry = BY_NAME[name]
    documentation = entry.help
    if entry.measured == "probes":
        documentation += f". {_interval_text(snapshot)}."
    elif entry.measured == "nvml" and snapshot.link_interval_s:
        documentation += f". {NVML_WHEN.format(interval=f'{snapshot.link_interval_s:g} s')}."
    elif entry.measured == "nvml":
        documentation += f". {NVML_WHEN_PROBES}."
    elif entry.measured == "sweep":
        documentation += f". {SWEEP_WHEN}."
    if entry.type == "counter":
        return CounterMetricFamily(name, documentation, labels=entry.labels)
    return GaugeMetricFamily(name, documentation, labels=entry.labels)


def add_known(labels: list[str], values: Iterable[tuple[MetricFamily, float | None]]) -> None:
    """A sample in each family whose value is known; an unknown value is no sample, not 0."""
    for family_, value in values:
        if value is not None:
            family_.add_metric(labels, value)
