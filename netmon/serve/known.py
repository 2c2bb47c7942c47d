"""What a configuration makes known before any probe ran: the probes whose results are judged,
the counters pre-set to 0 for them so that increase() sees the first event, the rank count
of series kept from before probes could run on the idle set, and how often the PCIe links are
read under load. Pure: configuration in, values out.
"""

from __future__ import annotations

from collections.abc import Iterator

from netmon import baseline
from netmon.config import NetmonConfig
from netmon.probe import crossnode, transport_faults


def judging_probes(config: NetmonConfig) -> list[str]:
    """Probes whose results are judged against a baseline (pair probes judge pairs against each
    other)."""
    return [p.name for p in config.probes or () if p.kind != "pairs"]


def judging_counters(
    config: NetmonConfig, counts: dict[tuple[str, str], int]
) -> dict[tuple[str, str], int]:
    """Inconclusive counts of every probe whose results are judged against a baseline (pair
    probes judge pairs against each other), the ones already counted kept."""
    return {
        (p.name, reason): counts.get((p.name, reason), 0)
        for p in config.probes or ()
        if p.kind != "pairs"
        for reason in baseline.INCONCLUSIVE_REASONS
    }


def known_transport_faults(config: NetmonConfig) -> Iterator[tuple[str, str, str]]:
    """(probe, path, reason) of every transport fault a probe can have: a local path's reasons,
    and for a group's rounds and node pairs the network reasons of the group's `transport`."""
    if config.backend != "nccl":
        return
    local = [r for r in transport_faults.REASONS if r not in crossnode.NET_REASONS]
    transport = config.group.transport if config.group is not None else "any"
    across = crossnode.network_reasons(crossnode.INTENT_OF_TRANSPORT[transport])
    for probe in config.probes or ():
        if probe.scope == "local":
            yield from ((probe.name, path, r) for path in probe.paths for r in local)
        else:
            path = "node_pair" if probe.scope == "node_pairs" else "group"
            yield from ((probe.name, path, r) for r in across)


def all_ranks(config: NetmonConfig, name: str) -> int | None:
    """The ranks a local probe ran with before probes could run on the idle set."""
    probe = next((p for p in config.probes or () if p.name == name), None)
    if probe is None or probe.scope != "local" or probe.kind != "collective":
        return None
    if config.backend == "nccl":
        return len(probe.devices or config.devices or ()) or None
    return probe.ranks or config.ranks or 2


def load_interval(config: NetmonConfig) -> float:
    """How often the PCIe links are read under load: the shortest interval of the local
    collectives that run the pcie path (netmon.serve.runner reads during their traffic); 0: none."""
    found = [
        p.interval
        for p in config.probes or ()
        if p.scope == "local" and p.kind == "collective" and "pcie" in p.paths
    ]
    return min(found, default=0.0) if config.backend == "nccl" else 0.0
