"""The selftest's rows and the pure judgments behind them: an outcome (or a reason it could not
run) in, one PASS / FAIL / SKIP row with its measured figure and goal out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from netmon.bandwidth import buffer_budget, format_size
from netmon.baseline import BaselinePolicy, robust
from netmon.gpu.idle import GpuReading
from netmon.gpu.linkhealth import LinkHealth, nvlink_sums
from netmon.probe.spec import ProbeOutcome, ProbeSpec

Status = Literal["PASS", "FAIL", "SKIP"]
# The groups of rows, each one a name `--skip` takes.
CHECKS: tuple[str, ...] = (
    "ops",
    "paths",
    "nccl-tests",
    "drill",
    "memory",
    "pinning",
    "zygote",
    "telemetry",
    "noise",
    "inspector",
)

# Device memory: a rank's peak (torch.cuda.max_memory_allocated) may exceed its buffers by 5 %,
# plus a constant for what torch's caching allocator adds to what was asked (docs/GPU-ACCEPTANCE.md,
# "Facts this page rests on"): a large block is not split when 1 MiB or less would remain, so
# each of a rank's at most two buffers may count up to 1 MiB more, and the small tensors the
# worker keeps at once (timings, the check's flag and minima) take 512 B blocks, far below the
# third MiB.
DEVICE_FACTOR = 1.05
DEVICE_SLACK_BYTES = 3 << 20
# Host memory on gloo: a rank's peak resident memory may exceed torch's own footprint (a rank
# that ran an 8 B all_reduce) by 1.15 x its buffers (bench/rank_memory.py measures the same).
HOST_FACTOR = 1.15
# Verdict noise: the same all_reduce run this many times; a loss of 30 % must count as low.
NOISE_RUNS = 5
NOISE_GOAL = 0.7


@dataclass(frozen=True)
class Row:
    """One line of the report: what was checked, its verdict, the figure and the goal."""

    check: str  # the group (CHECKS)
    name: str  # "op all_reduce", "path nvls", ...
    status: Status
    measured: str = ""
    goal: str = ""
    detail: str = ""
    # The figures behind `measured`, for the JSON report (bytes, seconds, ratios).
    figures: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "name": self.name,
            "status": self.status,
            "measured": self.measured,
            "goal": self.goal,
            "detail": self.detail,
            "figures": dict(self.figures),
        }


def mib(size: float) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def gbps(rate: float) -> str:
    return f"{rate / 1e9:.3f} GB/s"


def skipped(check: str, name: str, reason: str) -> Row:
    return Row(check, name, "SKIP", detail=reason)


def problems(outcome: ProbeOutcome) -> list[str]:
    """Everything that makes a run of a probe a failure: it did not finish, a size is missing or
    its values were wrong or unchecked, or NCCL's log contradicts the intended path."""
    found = []
    if outcome.failure is not None:
        found.append(outcome.failure.describe())
    done = {r.size_bytes for r in outcome.results}
    if outcome.failure is None and len(done) < len(outcome.spec.sizes):
        found.append(f"{len(outcome.spec.sizes) - len(done)} size(s) gave no result")
    for result in outcome.results:
        if result.check_ok is False:
            found.append(f"wrong values at {format_size(result.size_bytes)}")
        elif result.check_ok is None and outcome.spec.check:
            found.append(f"values not checked at {format_size(result.size_bytes)}")
    if outcome.transport_faults:
        used = ", ".join(outcome.transports) or "nothing logged"
        found.append(
            f"NCCL's log contradicts the {outcome.spec.intent} path: "
            f"{', '.join(outcome.transport_faults)} (transports: {used})"
        )
    return found


def judge_run(check: str, name: str, outcome: ProbeOutcome) -> Row:
    """A probe run with correctness checking: PASS when every size finished with right values."""
    goal = "finishes, values right" + (
        ", path as intended" if outcome.spec.backend == "nccl" else ""
    )
    figures: dict[str, Any] = {
        "busbw_bytes_per_second": {
            str(r.size_bytes): r.busbw_bytes_per_second for r in outcome.results
        },
        "wall_s": round(outcome.wall_s, 3),
    }
    measured = ""
    if outcome.results:
        largest = max(outcome.results, key=lambda r: r.size_bytes)
        measured = f"{gbps(largest.busbw_bytes_per_second)} at {format_size(largest.size_bytes)}"
    found = problems(outcome)
    if found:
        return Row(check, name, "FAIL", measured, goal, "; ".join(found), figures)
    sizes = ",".join(format_size(s) for s in outcome.spec.sizes)
    count = len(outcome.results)
    detail = (
        f"{count} size{'s' if count != 1 else ''} ({sizes}) checked, {outcome.spec.ranks} ranks"
    )
    if outcome.transports:
        detail += f"; transports: {', '.join(outcome.transports)}"
    return Row(check, name, "PASS", measured, goal, detail, figures)


def budget_of(spec: ProbeSpec) -> int:
    """The bytes of buffers one rank of the probe holds at its largest size (one chunk of it)."""
    return buffer_budget(spec.op, max(spec.sizes) // spec.chunks, spec.ranks, spec.dtype)


# Ops for which gloo stages a copy of the op's size of its own, so that a rank's peak on CPU says
# nothing of netmon's buffers (docs/GPU-ACCEPTANCE.md, "Facts this page rests on"); NCCL works in
# the buffers it is given.
GLOO_COPIES: Mapping[str, str] = {
    "all_gather": "gloo gathers into a flat tensor of its own and copies it out",
    "reduce_scatter": "gloo all-reduces a clone of the whole input",
}


def memory_skip(op: str, backend: str) -> str | None:
    """Why a rank's peak memory for `op` cannot be held against its buffers here, or None."""
    if op == "all_gather_object":
        return (
            "all_gather_object holds no tensors: torch pickles the payload and stages copies of "
            "its own, which no budget covers"
        )
    if backend == "gloo" and op in GLOO_COPIES:
        return f"{GLOO_COPIES[op]}: judged on GPUs only"
    return None


def _memory_failed(outcome: ProbeOutcome, name: str) -> Row | None:
    reason = memory_skip(outcome.spec.op, outcome.spec.backend)
    if reason is not None:
        return skipped("memory", name, reason)
    if outcome.failure is not None:
        return Row("memory", name, "FAIL", detail=f"the run failed: {outcome.failure.describe()}")
    return None


def host_memory_row(outcome: ProbeOutcome, footprint: int | None) -> Row:
    """gloo: a rank's peak resident memory against torch's footprint plus 1.15 x its buffers."""
    name = f"memory {outcome.spec.op}"
    early = _memory_failed(outcome, name)
    if early is not None:
        return early
    peak = outcome.peak_host_memory_bytes
    if peak is None:
        return Row("memory", name, "FAIL", detail="the ranks reported no peak host memory")
    if footprint is None:
        return Row("memory", name, "FAIL", detail="torch's footprint (an 8 B probe) is unknown")
    budget = budget_of(outcome.spec)
    limit = footprint + HOST_FACTOR * budget
    figures = {"peak_bytes": peak, "footprint_bytes": footprint, "budget_bytes": budget}
    return Row(
        "memory",
        name,
        "PASS" if peak <= limit else "FAIL",
        f"host peak {mib(peak)}",
        f"<= {mib(limit)}",
        f"torch's footprint {mib(footprint)} + {HOST_FACTOR} x buffers {mib(budget)} "
        f"({format_size(max(outcome.spec.sizes))}, {outcome.spec.ranks} ranks); "
        f"above the footprint: {mib(peak - footprint)}",
        figures,
    )


def device_memory_row(outcome: ProbeOutcome) -> Row:
    """nccl: a rank's peak device memory against 1.05 x its buffers plus the allocator's slack."""
    name = f"memory {outcome.spec.op}"
    early = _memory_failed(outcome, name)
    if early is not None:
        return early
    peak = outcome.peak_device_memory_bytes
    if peak is None:
        return Row("memory", name, "FAIL", detail="the ranks reported no peak device memory")
    budget = budget_of(outcome.spec)
    limit = DEVICE_FACTOR * budget + DEVICE_SLACK_BYTES
    host = outcome.peak_host_memory_bytes
    return Row(
        "memory",
        name,
        "PASS" if peak <= limit else "FAIL",
        f"device peak {mib(peak)}",
        f"<= {mib(limit)}",
        f"{DEVICE_FACTOR} x buffers {mib(budget)} + {mib(DEVICE_SLACK_BYTES)} allocator slack "
        f"({format_size(max(outcome.spec.sizes))}, {outcome.spec.ranks} ranks); host peak "
        f"{mib(host) if host is not None else 'not reported'}",
        {"peak_bytes": peak, "budget_bytes": budget, "host_peak_bytes": host},
    )


def _uuid_key(text: str) -> str:
    # NVML names a GPU "GPU-8-4-4-4-12 hex"; torch's str() of a device's uuid leaves the
    # prefix off (docs/GPU-ACCEPTANCE.md, "Facts this page rests on"): compare the hex alone.
    return text.strip().lower().removeprefix("gpu-")


def reported_gpus(outcome: ProbeOutcome) -> tuple[str, ...] | None:
    """The UUID of the GPU each rank opened, in rank order, when the ranks reported it."""
    found = outcome.environment.cuda_uuids if outcome.environment else ()
    return tuple(found) if any(found) else None


def pinning_row(outcomes: Sequence[ProbeOutcome]) -> Row:
    """Every rank opened the GPU netmon pinned it to (CUDA_VISIBLE_DEVICES by NVML's UUID)."""
    name, goal = "pinning", "every rank on its GPU"
    runs = [o for o in outcomes if o.spec.backend == "nccl"]
    if not runs:
        return skipped("pinning", name, "no GPU: CPU ranks (gloo) open none")
    reported = [(o, reported_gpus(o)) for o in runs]
    if not any(gpus for _, gpus in reported):
        return skipped("pinning", name, "the ranks did not report their GPU")
    wrong: list[str] = []
    ranks = 0
    for outcome, gpus in reported:
        if not gpus:
            continue
        pinned = outcome.spec.cuda_devices or outcome.spec.devices
        unnamed = [d for d in pinned if _uuid_key(d).count("-") != 4]
        if unnamed:
            return skipped(
                "pinning",
                name,
                f"netmon pinned GPU {', '.join(unnamed)} by index (NVML gave no UUID), so the "
                "UUIDs the ranks opened cannot be compared",
            )
        for rank, want in enumerate(pinned):
            ranks += 1
            got = gpus[rank] if rank < len(gpus) else ""
            if not got:
                wrong.append(f"{outcome.spec.op} rank {rank} did not report its GPU")
            elif _uuid_key(want) != _uuid_key(got):
                wrong.append(f"{outcome.spec.op} rank {rank} opened {got}, pinned to {want}")
    measured = f"{ranks - len(wrong)} of {ranks} rank runs"
    if wrong:
        return Row("pinning", name, "FAIL", measured, goal, "; ".join(wrong))
    return Row("pinning", name, "PASS", measured, goal, f"{len(runs)} probes' ranks compared")


def telemetry_row(own_pid: int, health: LinkHealth, after: Sequence[GpuReading]) -> Row:
    """The daemon's passive link read, as it runs beside jobs: it must read every GPU's PCIe link
    and leave no CUDA context behind (NVML's compute processes, read after it, without us)."""
    name, goal = "link telemetry", "every GPU read; no CUDA context created"
    holding = [r.index for r in after if own_pid in r.compute_pids]
    unread = sorted({r.index for r in after} - {p.gpu for p in health.pcie})
    links = nvlink_sums(health.nvlinks)
    measured = (
        f"{len(health.pcie)} GPUs' PCIe, {sum(s.links for s in links.values())} NVLinks "
        f"({sum(s.active for s in links.values())} active)"
    )
    figures = {"gpus": len(health.pcie), "nvlinks": sum(s.links for s in links.values())}
    if holding:
        detail = f"this process shows as a compute process on GPU(s) {holding} after the read"
        return Row("telemetry", name, "FAIL", measured, goal, detail, figures)
    if unread:
        detail = f"no PCIe reading for GPU(s) {unread}"
        return Row("telemetry", name, "FAIL", measured, goal, detail, figures)
    return Row("telemetry", name, "PASS", measured, goal, figures=figures)


def zygote_row(
    outcomes: Sequence[ProbeOutcome], zygote_pid: int | None, after: Sequence[GpuReading] | None
) -> Row:
    """The op runs' ranks forked from the rank zygote, the zygote holding no CUDA context (NVML's
    compute processes, read after the runs; None on CPU ranks), and what a rank still pays per
    probe: its start, and its init phase (on GPUs the CUDA context and NCCL communicator)."""
    name, goal = "rank zygote", "every rank forked; no CUDA context in the zygote"
    forked = sum(o.ranks_forked for o in outcomes)
    ranks = sum(o.ranks_forked + o.ranks_spawned for o in outcomes)
    fallbacks = sorted({o.fork_fallback for o in outcomes if o.fork_fallback})
    startup = [o.startup_s for o in outcomes if o.startup_s is not None]
    init = [o.init_s for o in outcomes if o.init_s is not None]
    measured = f"{forked} of {ranks} ranks forked"
    if startup and init:
        measured += f"; start-up max {max(startup):.2f} s, init max {max(init):.2f} s"
    figures = {
        "ranks_forked": forked,
        "ranks": ranks,
        "startup_max_s": max(startup, default=None),
        "init_max_s": max(init, default=None),
    }
    holding = [
        r.index for r in after or () if zygote_pid is not None and zygote_pid in r.compute_pids
    ]
    if holding:
        detail = f"the zygote (pid {zygote_pid}) holds a CUDA context on GPU(s) {holding}"
        return Row("zygote", name, "FAIL", measured, goal, detail, figures)
    if not ranks or forked < ranks:
        detail = f"spawned instead: {', '.join(fallbacks)}" if fallbacks else "no rank ran"
        return Row("zygote", name, "FAIL", measured, goal, detail, figures)
    return Row("zygote", name, "PASS", measured, goal, figures=figures)


def exit_code(rows: Sequence[Row]) -> int:
    """0 when nothing failed, 1 when any row FAILed (the selftest's health gate)."""
    return 1 if any(row.status == "FAIL" for row in rows) else 0


def noise_row(runs: Sequence[ProbeOutcome], policy: BaselinePolicy) -> Row:
    """How far a result must fall on this node before a verdict counts it low (docs/SIGNAL.md):
    the run-to-run spread of each judged size over repeated runs, and the low bound it gives
    with the configured policy, as a share of the median."""
    name = "verdict noise"
    goal = f"a result at {NOISE_GOAL:.0%} of the baseline is low at every judged size"
    by_size: dict[int, list[float]] = {}
    for run in runs:
        for result in run.results if run.ok else ():
            by_size.setdefault(result.size_bytes, []).append(result.busbw_bytes_per_second)
    judged = {s: v for s, v in sorted(by_size.items()) if not policy.latency_bound(s)}
    if not judged or min(len(v) for v in judged.values()) < 3:
        why = "no size at or over baseline.latency_bound_below" if not judged else "under 3 runs"
        return Row("noise", name, "SKIP", goal=goal, detail=why)
    lines = {}
    for size, values in judged.items():
        centre, spread = robust.median(values), robust.spread(values)
        bound = robust.low_bound(centre, spread, policy.ratio, policy.spread_k)
        lines[size] = (spread / centre, bound / centre)
    worst = min(lines, key=lambda s: lines[s][1])
    measured = ", ".join(
        f"{format_size(s)}: spread {v[0]:.1%}, low under {v[1]:.0%}" for s, v in lines.items()
    )
    figures = {
        "runs": len(runs),
        "sizes": {
            str(s): {"spread_share": v[0], "low_bound_share": v[1]} for s, v in lines.items()
        },
    }
    if lines[worst][1] < NOISE_GOAL:
        detail = (
            f"at {format_size(worst)} runs vary so much that only a fall under "
            f"{lines[worst][1]:.0%} of the baseline would count as low: the daemon judges such "
            f"a size at its floor ({policy.floor:.0%}, netmon_judged_at_floor 1), where a "
            "shallower cut can hide in the noise; more iters, a larger size, or a quieter node "
            "make the verdict sharper"
        )
        return Row("noise", name, "FAIL", measured, goal, detail, figures)
    return Row("noise", name, "PASS", measured, goal, figures=figures)
