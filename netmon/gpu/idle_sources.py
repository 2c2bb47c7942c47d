"""Where GPU readings come from, and the sampler that takes them spaced apart before a probe
(gpu/idle.py decides on them): a recording replayed, none on CPU nodes (NVML's: gpu/nvml.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from pydantic import TypeAdapter

from netmon.gpu.idle import (
    GpuReading,
    IdleDecision,
    IdleSource,
    IdleSourceError,
    decide,
    source_failed,
)
from netmon.gpu.idle_policy import IdlePolicy


def sample(
    source: IdleSource, policy: IdlePolicy, sleep: Callable[[float], None] = time.sleep
) -> list[list[GpuReading]]:
    """`policy.samples` readings, `policy.sample_interval` apart (no sleep after the last).

    Raises IdleSourceError, whatever the source raised: a broken NVML must mean "do not probe",
    never a dead scheduler thread. `check` turns it into an "nvml_error" decision.
    """
    readings: list[list[GpuReading]] = []
    for number in range(policy.samples):
        if number:
            sleep(policy.sample_interval)
        try:
            readings.append(list(source.read()))
        except Exception as exc:  # NVMLError's many subclasses, or a broken recording
            raise IdleSourceError(
                f"reading {number + 1} of {policy.samples}: {type(exc).__name__}: {exc}"
            ) from exc
    return readings


def check(
    source: IdleSource,
    devices: Sequence[str],
    own_pids: Collection[int],
    policy: IdlePolicy,
    sleep: Callable[[float], None] = time.sleep,
    own_load: Collection[str] = (),
) -> IdleDecision:
    """Sample, then decide; a failing source gives reason "nvml_error" instead of raising."""
    if not devices:
        # A CPU-only probe touches no GPU: no need to read NVML, or to wait for samples.
        return IdleDecision(idle=True, reason=None, detail="no GPUs used", busy={})
    try:
        readings = sample(source, policy, sleep)
    except IdleSourceError as exc:
        return source_failed(devices, exc)
    return decide(readings, devices, own_pids, policy, own_load)


_RECORDING = TypeAdapter(list[list[GpuReading]])


class ReplaySource:
    """Replays recorded readings in order; the last one repeats forever. Thread-safe."""

    def __init__(self, samples: Sequence[Sequence[GpuReading]]) -> None:
        if not samples:
            raise ValueError("a replay needs at least one recorded sample")
        self._samples = [list(s) for s in samples]
        self._next = 0
        self._lock = threading.Lock()

    @classmethod
    def from_records(cls, data: object) -> ReplaySource:
        """From JSON-shaped data: a list of samples, or {"samples": [...]} with other keys free."""
        if isinstance(data, dict):
            if "samples" not in data:
                raise ValueError('a recording object needs a "samples" key')
            data = data["samples"]
        return cls(_RECORDING.validate_python(data))

    @classmethod
    def from_json(cls, path: str | Path) -> ReplaySource:
        """From a recording file (what `--idle-replay FILE` reads); ValueError if malformed."""
        with open(path, encoding="utf-8") as file:
            return cls.from_records(json.load(file))

    def read(self) -> list[GpuReading]:
        with self._lock:
            current = self._samples[min(self._next, len(self._samples) - 1)]
            self._next += 1
        return list(current)


class NoGpuSource:
    """CPU nodes: there is nothing to read, and a probe without devices is idle."""

    def read(self) -> list[GpuReading]:
        return []
