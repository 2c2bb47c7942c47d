"""Collective probes: what they are (spec), how ranks run (worker), who runs them (launcher)."""

from __future__ import annotations

from netmon.probe.spec import ProbeFailure, ProbeOutcome, ProbeSpec, SizeResult

__all__ = ["ProbeFailure", "ProbeOutcome", "ProbeSpec", "SizeResult"]
