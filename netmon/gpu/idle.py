"""Whether GPUs may be probed now: pure decisions over NVML readings (the readings' sources and
the sampler that spaces them: gpu/idle_sources.py; the settings: gpu/idle_policy.py).

A probe must never disturb a job. So a GPU is idle only when every one of several spaced readings
agrees, and anything NVML cannot tell us counts against probing unless the operator says otherwise.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar, Literal, Protocol, get_args

from pydantic import ConfigDict

from netmon.gpu.idle_policy import IdlePolicy
from netmon.gpu.podresources import GpuAllocations

ComputeMode = Literal["default", "exclusive_thread", "exclusive_process", "prohibited", "unknown"]

# Every label value a decision can carry, so an exporter can export 0 for each. The order is the
# precedence when several apply: conditions that will not clear by themselves (NVML broken, GPU
# gone, MIG, compute mode) come first, so the label points at what an operator must fix.
# The kubelet's reasons (gpu.kubelet): "kubelet_error" (it could not be asked) is an operator's
# to fix, like nvml_error. "gpu_allocated" comes after the busy_* reasons, so a job that runs keeps
# its gpu_busy_process label (alerts exclude those) and gpu_allocated marks what NVML alone would
# have let through: a pod holds the GPU but shows no process, utilization or memory yet.
Reason = Literal[
    "nvml_error",
    "kubelet_error",
    "gpu_missing",
    "gpu_mig",
    "gpu_compute_mode",
    "gpu_busy_process",
    "gpu_busy_utilization",
    "gpu_busy_memory",
    "gpu_allocated",
    "gpu_unknown",
]
REASONS: tuple[Reason, ...] = get_args(Reason)
_RANK = {reason: rank for rank, reason in enumerate(REASONS)}


@dataclass(frozen=True)
class GpuReading:
    """One NVML reading of one GPU. `index` is NVML's (PCI bus order), not CUDA's default order."""

    # Lets ReplaySource load recordings through pydantic and reject misspelt keys.
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    index: int
    uuid: str
    utilization: float | None  # percent, None if NVML cannot say
    memory_used: int | None  # bytes on the device, everyone's
    compute_pids: tuple[int, ...]
    mig_enabled: bool = False
    compute_mode: ComputeMode = "default"
    # Per compute PID (same order), its device memory in bytes; None where NVML cannot say
    # (Windows WDDM, some containers). Lets our own probe's memory be left out of the limit.
    process_memory: tuple[int | None, ...] = ()
    # False when the process list could not be read: then `compute_pids` being empty proves nothing.
    processes_known: bool = True
    # Set from the kubelet (gpu.kubelet.KubeletGuard), else None: the pod (not netmon's own) a
    # device plugin gave this GPU to, or why the kubelet could not say.
    allocated_to: str | None = None
    allocation_error: str | None = None
    # The GPU's minor number (/dev/nvidia<minor>), by which NVIDIA's DRA driver names it
    # ("gpu-<minor>"); None where NVML cannot say.
    minor: int | None = None

    def name(self) -> str:
        return f"GPU {self.index} ({self.uuid})"


class IdleSource(Protocol):
    def read(self) -> list[GpuReading]:
        """One reading of every GPU; raises when no reading could be taken at all."""
        ...


@dataclass(frozen=True)
class IdleDecision:
    idle: bool
    reason: Reason | None  # the highest-precedence reason over all busy devices; None when idle
    detail: str  # human text naming the GPU(s)
    busy: dict[str, str] = field(default_factory=dict)  # device id as given -> reason


class IdleSourceError(Exception):
    """A source could not take a reading (NVML missing, failing, or a broken recording)."""


def find_reading(readings: Sequence[GpuReading], device: str) -> GpuReading | None:
    """The reading of `device`: an NVML index ("0") or a UUID ("GPU-...", any case)."""
    return next((r for r in readings if reads_as(r, device)), None)


def reads_as(reading: GpuReading, device: str) -> bool:
    """Whether `reading` is of `device`, an NVML index or a UUID (any case)."""
    device = device.strip()
    if device.isdigit():
        return reading.index == int(device)
    return reading.uuid.lower() == device.lower()


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.0f} MiB"


def _others_memory(reading: GpuReading, own_pids: Collection[int]) -> int | None:
    """Device memory not held by our processes; everything when our share is unknown."""
    if reading.memory_used is None:
        return None
    ours = 0
    for position, pid in enumerate(reading.compute_pids):
        if pid not in own_pids:
            continue
        used = reading.process_memory[position] if position < len(reading.process_memory) else None
        if used is None:
            # Cannot tell our share from a job's: keep it all in, the safe direction.
            return reading.memory_used
        ours += used
    return max(reading.memory_used - ours, 0)


def _findings(
    seen: Sequence[GpuReading | None],
    own_pids: Collection[int],
    policy: IdlePolicy,
    own_load: bool = False,
) -> list[tuple[Reason, str]]:
    """Why a device, as `seen` in each sample, may not be probed; empty when it is idle.
    `own_load`: the utilization NVML shows is netmon's own probe's, which left the GPU within
    NVML's averaging window; it is not a job's."""
    total = len(seen)
    present = [r for r in seen if r is not None]
    if len(present) < total or total == 0:
        if not present:
            return [("gpu_missing", "not found by NVML")]
        gaps = [str(i + 1) for i, r in enumerate(seen) if r is None]
        return [("gpu_missing", f"missing in sample(s) {', '.join(gaps)} of {total}")]

    found: list[tuple[Reason, str]] = []
    if policy.skip_mig and any(r.mig_enabled for r in present):
        found.append(("gpu_mig", "MIG enabled"))
    if policy.require_default_compute_mode:
        modes = sorted({r.compute_mode for r in present if r.compute_mode != "default"})
        if modes:
            found.append(("gpu_compute_mode", f"compute mode {'/'.join(modes)}"))

    foreign = sorted({p for r in present for p in r.compute_pids if p not in own_pids})
    if foreign:
        found.append(("gpu_busy_process", f"process(es) {', '.join(map(str, foreign))}"))

    limit = policy.max_utilization
    hot = [r.utilization for r in present if r.utilization is not None and r.utilization >= limit]
    if hot and not own_load:
        peak = max(hot)
        found.append(
            (
                "gpu_busy_utilization",
                f"utilization up to {peak:g}% in {len(hot)} of {total} samples"
                f" (limit under {limit:g}%)",
            )
        )

    others = [_others_memory(r, own_pids) for r in present]
    heavy = [m for m in others if m is not None and m > policy.max_memory_used]
    if heavy:
        found.append(
            (
                "gpu_busy_memory",
                f"{_mib(max(heavy))} used by others (limit {_mib(policy.max_memory_used)})",
            )
        )

    held = sorted({r.allocated_to for r in present if r.allocated_to is not None})
    if held:
        found.append(("gpu_allocated", f"allocated to {'; '.join(held)}"))

    if policy.unknown_is_busy:
        blind = []
        if any(r.utilization is None for r in present):
            blind.append("utilization")
        if any(m is None for m in others):
            blind.append("memory")
        if not all(r.processes_known for r in present):
            blind.append("processes")
        if blind:
            found.append(("gpu_unknown", f"NVML cannot report {', '.join(blind)}"))
        failures = sorted({r.allocation_error for r in present if r.allocation_error is not None})
        if failures:
            found.append(("kubelet_error", f"the kubelet cannot say who holds it: {failures[0]}"))
    return found


def decide(
    readings: Sequence[Sequence[GpuReading]],
    devices: Sequence[str],
    own_pids: Collection[int],
    policy: IdlePolicy,
    own_load: Collection[str] = (),
) -> IdleDecision:
    """Whether all of `devices` may be probed, given one list of readings per sample.

    `own_pids` (the daemon and probe ranks) are ignored in process lists and, where NVML gives
    their share, in memory. `own_load` are devices whose utilization is still netmon's own
    probe's: NVML averages it over up to a second, so a GPU that a pair or a round left a moment
    ago still reads busy with no process on it. No devices (a CPU-only probe) is always idle.

    NVML reports PIDs as the host sees them: a daemon in its own PID namespace (a container
    without hostPID) must translate its PIDs first, or its own ranks look foreign.
    """
    busy: dict[str, Reason] = {}
    lines: list[str] = []
    for device in dict.fromkeys(devices):  # de-duplicated, order kept
        seen = [find_reading(taken, device) for taken in readings]
        found = _findings(seen, own_pids, policy, device in own_load)
        if not found:
            continue
        busy[device] = min((reason for reason, _ in found), key=_RANK.__getitem__)
        name = next((r.name() for r in seen if r is not None), f"GPU {device}")
        lines.append(f"{name}: {'; '.join(text for _, text in found)}")
    if not busy:
        return IdleDecision(idle=True, reason=None, detail="idle", busy={})
    reason = min(busy.values(), key=_RANK.__getitem__)
    return IdleDecision(idle=False, reason=reason, detail=" | ".join(lines), busy={**busy})


def source_failed(devices: Sequence[str], error: BaseException) -> IdleDecision:
    """The decision when no reading could be taken: busy, every device blamed on NVML."""
    return IdleDecision(
        idle=False,
        reason="nvml_error",
        detail=f"NVML reading failed: {error}",
        busy=dict.fromkeys(devices, "nvml_error"),
    )


def with_allocations(
    readings: Sequence[GpuReading], allocations: GpuAllocations
) -> list[GpuReading]:
    """`readings` with `allocated_to` set on every GPU that the kubelet says a pod holds.

    Where the kubelet's device IDs do not name the GPU, this errs towards busy: an allocated MIG
    device ("MIG-<uuid>") marks every GPU in MIG mode, and an ID that is no UUID at all (another
    device plugin's naming) marks every GPU.
    """
    marked = []
    for reading in readings:
        holder = allocations.gpus.get(reading.uuid.lower())
        if holder is None and reading.minor is not None:
            holder = allocations.minors.get(reading.minor)
        why = ""
        if holder is None and reading.minor is None and allocations.minors:
            holder = next(iter(allocations.minors.values()))
            why = f" (DRA device {holder.device_id}: NVML gives this GPU no minor number)"
        if holder is None and reading.mig_enabled and allocations.mig:
            holder = allocations.mig[0]
            why = f" (MIG device {holder.device_id}: the kubelet does not say on which GPU)"
        if holder is None and allocations.unmapped:
            holder = allocations.unmapped[0]
            why = f" (device {holder.device_id!r} is no GPU UUID: any GPU may be the one)"
        text = None if holder is None else f"{holder}{why}"
        marked.append(replace(reading, allocated_to=text, allocation_error=None))
    return marked


def allocation_unknown(readings: Sequence[GpuReading], error: str) -> list[GpuReading]:
    """`readings` marked as not knowing which pods hold GPUs, because the kubelet failed."""
    return [replace(r, allocated_to=None, allocation_error=error) for r in readings]


def allocated_devices(reading: Sequence[GpuReading], devices: Sequence[str]) -> dict[str, str]:
    """The pod (from the kubelet) holding each of `devices` that one holds; used while a probe
    runs, so a GPU given to a pod mid-probe ends the probe before the pod's process starts."""
    out: dict[str, str] = {}
    for device in dict.fromkeys(devices):
        found = find_reading(reading, device)
        if found is not None and found.allocated_to is not None:
            out[device] = found.allocated_to
    return out


def foreign_processes(
    reading: Sequence[GpuReading], devices: Sequence[str], own_pids: Collection[int]
) -> dict[str, tuple[int, ...]]:
    """Compute PIDs on `devices` that are not ours, per device; used while a probe runs.

    Any entry means a job has arrived and the probe must be killed. A device absent from the
    reading, or whose process list NVML cannot give, is left out: this check can only accuse.
    """
    out: dict[str, tuple[int, ...]] = {}
    for device in dict.fromkeys(devices):
        found = find_reading(reading, device)
        if found is None:
            continue
        foreign = tuple(sorted({p for p in found.compute_pids if p not in own_pids}))
        if foreign:
            out[device] = foreign
    return out
