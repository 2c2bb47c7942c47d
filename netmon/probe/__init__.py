"""Collective probes: what they are (spec) and the one builder of every spec (build), how ranks
run (worker) and who runs them (launcher); path variants (paths), GPU pairs (pairs, verdict) and
what NCCL's log says it did (nccl_debug) and where that contradicts the probe's intent
(transport_faults, crossnode)."""

from __future__ import annotations

from netmon.probe.spec import ProbeFailure, ProbeOutcome, ProbeSpec, SizeResult

__all__ = ["ProbeFailure", "ProbeOutcome", "ProbeSpec", "SizeResult"]
