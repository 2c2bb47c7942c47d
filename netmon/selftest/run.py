"""One selftest from start to end: every probe it needs, each built by probe.build from the
operator's configuration, run by the launcher, and judged into the report's rows, in order."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import netmon
from netmon import sim
from netmon.bandwidth import OPS
from netmon.config import NetmonConfig, ProbeConfig
from netmon.errors import one_line
from netmon.gpu.fabric import FabricReading
from netmon.gpu.idle import GpuReading, IdleSourceError
from netmon.gpu.linkhealth import LinkHealth
from netmon.probe.build import build_spec
from netmon.probe.forking import Zygote
from netmon.probe.launcher import run_probe
from netmon.probe.paths import PATHS, unsupported
from netmon.probe.spec import ProbeOutcome, ProbeSpec
from netmon.probe.starting import base_env
from netmon.selftest import checks, drill, versus
from netmon.selftest.checks import Row, skipped
from netmon.selftest.inspector import inspector_row
from netmon.selftest.report import Report
from netmon.topology.model import Topology

GLOO_PATHS = "path variants set NCCL's environment; gloo ignores it"
# The drill's probe: sizes small enough to start at once, so many samples that its measure phase
# outlasts the drill by far (the probe's timeout still bounds it).
DRILL_SIZE = {"gloo": 64 << 10, "nccl": 64 << 20}
DRILL_ITERS = 1_000_000
# Host memory on CPU ranks is judged at 64 MiB: there a rank's peak stands clear of the few MiB
# by which fresh ranks' resident memory differs (bench/rank_memory.py), at 1 MiB it would not.
HOST_MEMORY_SIZE = 64 << 20
MEMORY_RUN: dict[str, Any] = {"warmup": 1, "iters": 1, "batch": 1}


class SelftestError(Exception):
    """The selftest cannot run here at all (exit status 3)."""


@dataclass(frozen=True)
class Plan:
    """What to check, as the operator's flags say it: the node (backend, GPUs) and the probe
    every op runs (sizes, ranks, timeout, checking on), as the daemon's configuration would."""

    node: NetmonConfig
    probe: ProbeConfig
    topology: Topology | None = None
    nccl_tests: str | None = None  # the all_reduce_perf binary; None when there is none
    skip: frozenset[str] = frozenset()

    @property
    def backend(self) -> str:
        return self.node.backend or "gloo"

    def spec(self, path: str = "default", **changes: Any) -> ProbeSpec:
        probe = ProbeConfig.model_validate({**self.probe.model_dump(), **changes})
        return build_spec(probe, self.node, path=path, topology=self.topology)


Progress = Callable[[Row], None]


@dataclass
class _Selftest:
    plan: Plan
    progress: Progress
    zygote: Zygote
    rows: list[Row] = field(default_factory=list)
    ops: dict[str, ProbeOutcome] = field(default_factory=dict)
    ratios: tuple[versus.SizeRatio, ...] = ()

    def add(self, row: Row) -> None:
        self.rows.append(row)
        self.progress(row)

    def probe(self, spec: ProbeSpec) -> ProbeOutcome:
        """One run, its ranks forked from the rank zygote as the daemon's are."""
        return run_probe(spec, zygote=self.zygote)

    def all_reduce(self) -> ProbeOutcome:
        if "all_reduce" not in self.ops:
            self.ops["all_reduce"] = self.probe(self.plan.spec(op="all_reduce"))
        return self.ops["all_reduce"]

    # ---- the checks, in the order they run ----

    def run_ops(self) -> None:
        for op in OPS:
            sized: dict[str, Any] = {}
            if op == "all_gather_object":
                # It pickles its payload through host memory: larger sizes only make it slow.
                sized["sizes"] = (min(self.plan.probe.sizes),)
            outcome = self.probe(self.plan.spec(op=op, **sized))
            self.ops[op] = outcome
            self.add(checks.judge_run("ops", f"op {op}", outcome))

    def run_paths(self) -> None:
        fabric: tuple[FabricReading, ...] | None = None
        for path in PATHS:
            name = f"path {path}"
            if path == "default":
                self.add(checks.judge_run("paths", name, self.all_reduce()))
                continue
            if self.plan.backend != "nccl":
                self.add(skipped("paths", name, GLOO_PATHS))
                continue
            if path == "nvls" and fabric is None:
                fabric = _fabric()
            env = self.all_reduce().environment
            reason = unsupported(
                path,
                "all_reduce",
                fabric if path == "nvls" else None,
                devices=self.all_reduce().spec.devices,
                nccl=env.nccl if env is not None else None,
            )
            if reason is not None:
                self.add(skipped("paths", name, reason))
                continue
            self.add(
                checks.judge_run("paths", name, self.probe(self.plan.spec(path, op="all_reduce")))
            )

    def run_nccl_tests(self) -> None:
        name = "nccl-tests all_reduce"
        if self.plan.backend != "nccl":
            self.add(skipped("nccl-tests", name, "all_reduce_perf needs GPUs; gloo ranks are CPUs"))
            return
        if self.plan.nccl_tests is None:
            reason = f"{versus.BINARY} is not on PATH (give --nccl-tests PATH)"
            self.add(skipped("nccl-tests", name, reason))
            return
        # Its own run, timed as all_reduce_perf times (versus.COMPARABLE): blocks of 20 ops.
        outcome = self.probe(self.plan.spec(op="all_reduce", **versus.COMPARABLE))
        if not outcome.ok:
            self.add(Row("nccl-tests", name, "FAIL", detail="netmon's all_reduce run failed"))
            return
        try:
            tables = versus.run_all_reduce_perf(
                self.plan.nccl_tests, outcome.spec, outcome.spec.timeout
            )
        except versus.NcclTestsError as exc:
            self.add(Row("nccl-tests", name, "FAIL", detail=str(exc)))
            return
        self.ratios = versus.compare(outcome.results, [r for t in tables for r in t.rows])
        ours = outcome.environment.nccl if outcome.environment is not None else None
        note = versus.version_note(tables, ours)
        self.add(versus.comparison_row(self.ratios, note=note))

    def run_drill(self) -> None:
        plan = self.plan
        spec = plan.spec(
            op="all_reduce",
            sizes=(DRILL_SIZE[plan.backend],),
            warmup=1,
            iters=DRILL_ITERS,
            batch=1,
            check=False,
        )
        if plan.backend != "nccl":
            stand_in = drill.SimulatedGpu()
            readiness = drill.readiness_for(plan.node, stand_in)
            job = drill.sleep_job()
            result = drill.run_drill(spec, readiness, ["0"], job, stand_in, self.zygote)
            self.add(drill.drill_row(result))
            return
        from netmon.gpu.nvml import NvmlSource

        try:
            source = NvmlSource()
        except IdleSourceError as exc:
            self.add(Row("drill", "drill preemption", "FAIL", detail=f"NVML: {one_line(exc)}"))
            return
        with source:
            gpu = (spec.cuda_devices or spec.devices)[0]
            command = drill.cuda_job(gpu, plan.node.rank_python or sys.executable)
            readiness = drill.readiness_for(plan.node, source)
            result = drill.run_drill(spec, readiness, spec.devices, command, None, self.zygote)
            self.add(drill.drill_row(result))

    def run_memory(self) -> None:
        if self.plan.backend == "nccl" and sim.active() is not None:
            for op in OPS:
                why = "a simulated node: its ranks hold host memory, no GPU's"
                self.add(skipped("memory", f"memory {op}", why))
            return
        if self.plan.backend == "nccl":
            for op in OPS:
                outcome = self.ops.get(op)
                if outcome is None:
                    self.add(skipped("memory", f"memory {op}", "needs the op runs (--skip ops)"))
                else:
                    self.add(checks.device_memory_row(outcome))
            return
        # CPU ranks: probes of their own at a size whose buffers outweigh what a fresh rank's
        # resident memory varies by (docs/GPU-ACCEPTANCE.md), one sample each, values checked.
        footprint = self.probe(self.plan.spec(op="all_reduce", sizes=(8,), **MEMORY_RUN))
        for op in OPS:
            reason = checks.memory_skip(op, self.plan.backend)
            if reason is not None:
                self.add(skipped("memory", f"memory {op}", reason))
                continue
            outcome = self.probe(self.plan.spec(op=op, sizes=(HOST_MEMORY_SIZE,), **MEMORY_RUN))
            self.add(checks.host_memory_row(outcome, footprint.peak_host_memory_bytes))

    def run_pinning(self) -> None:
        if not self.ops and self.plan.backend == "nccl":
            self.add(skipped("pinning", "pinning", "needs the op runs (--skip ops)"))
            return
        self.add(checks.pinning_row(list(self.ops.values())))

    def run_zygote(self) -> None:
        if not self.ops:
            self.add(skipped("zygote", "rank zygote", "needs the op runs (--skip ops)"))
            return
        after = _compute_processes() if self.plan.backend == "nccl" else None
        self.add(checks.zygote_row(list(self.ops.values()), self.zygote.pid, after))

    def run_noise(self) -> None:
        if self.plan.backend != "nccl" or sim.active() is not None:
            reason = "judged on GPUs: CPU ranks over loopback say nothing of a GPU node's noise"
            self.add(skipped("noise", "verdict noise", reason))
            return
        spec = self.plan.spec(op="all_reduce")
        runs = [self.all_reduce(), *(self.probe(spec) for _ in range(checks.NOISE_RUNS - 1))]
        self.add(checks.noise_row(runs, self.plan.node.baseline))

    def run_telemetry(self) -> None:
        if self.plan.backend != "nccl":
            self.add(skipped("telemetry", "link telemetry", "needs NVML: a GPU node"))
            return
        health, after = _telemetry_read()
        self.add(checks.telemetry_row(os.getpid(), health, after))


def _telemetry_read() -> tuple[LinkHealth, list[GpuReading]]:
    """The daemon's passive link read, then NVML's compute processes of every GPU after it."""
    from netmon.gpu.nvml import NvmlSource
    from netmon.gpu.nvml_links import read_link_health

    health = read_link_health(False)
    with NvmlSource() as source:
        return health, source.read()


def _compute_processes() -> list[GpuReading]:
    """NVML's compute processes of every GPU, now."""
    from netmon.gpu.nvml import NvmlSource

    with NvmlSource() as source:
        return source.read()


def _fabric() -> tuple[FabricReading, ...]:
    """NVML's fabric reading, or none where NVML cannot give one (paths.unsupported's "empty")."""
    from netmon.gpu.nvml_links import read_fabric

    try:
        return read_fabric()
    except IdleSourceError:
        return ()


def environment(outcomes: dict[str, ProbeOutcome], topology: Topology | None) -> dict[str, Any]:
    """What ran, for whoever reads a report sent back: versions, host, and NVML's GPUs."""
    found = next((o.environment for o in outcomes.values() if o.environment), None)
    env: dict[str, Any] = {"netmon": netmon.__version__, "host": socket.gethostname()}
    if found is not None:
        env.update(torch=found.torch, nccl=found.nccl, python=found.python)
    if topology is not None:
        env["gpus"] = [
            {"index": g.index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id, "numa": g.numa}
            for g in topology.gpus
        ]
        if topology.p2p is not None:
            # What NCCL will take from NVML for peers its ranks cannot see (docs/TOPOLOGY.md).
            env["pairs_without_p2p"] = topology.p2p.without([g.index for g in topology.gpus])
    if found is not None and found.backend == "nccl":
        env.update(node_checks())
    return env


def node_checks() -> dict[str, Any]:
    """What the start checks read on this node (netmon.gpu.compat), for the report: the answers
    the first GPU node gives to questions no machine netmon is built on could."""
    from netmon.gpu import compat
    from netmon.group.members import imex_channel_present

    driver = compat.read_driver_cuda()
    torch_cuda, _ = compat.read_torch_cuda()
    return {
        "driver_cuda": None if driver is None else str(driver),
        "torch_cuda": None if torch_cuda is None else str(torch_cuda),
        "pid_namespace": compat.read_pid_namespace(),
        "imex_channel": imex_channel_present(),
    }


def run_selftest(plan: Plan, progress: Progress = lambda row: None) -> Report:
    """Every check not skipped, in order; an unexpected error stops the rest (Report.error)."""
    started, clock = time.time(), time.monotonic()
    zygote = Zygote(plan.node.rank_python or sys.executable, base_env())
    test = _Selftest(plan, progress, zygote)
    steps: dict[str, Callable[[], None]] = {
        "ops": test.run_ops,
        "paths": test.run_paths,
        "nccl-tests": test.run_nccl_tests,
        "drill": test.run_drill,
        "memory": test.run_memory,
        "pinning": test.run_pinning,
        "zygote": test.run_zygote,
        "telemetry": test.run_telemetry,
        "noise": test.run_noise,
        "inspector": lambda: test.add(inspector_row(plan.node.inspector)),
    }
    error = None
    try:
        for check, step in steps.items():
            if check in plan.skip:
                test.add(skipped(check, check, f"--skip {check}"))
                continue
            try:
                step()
            except Exception as exc:  # a fault of the selftest itself, not of the node
                error = f"{check}: {type(exc).__name__}: {one_line(exc)}"
                break
    finally:
        zygote.close()
    spec = plan.spec(op="all_reduce")
    return Report(
        backend=plan.backend,
        ranks=spec.ranks,
        devices=spec.devices,
        sizes=spec.sizes,
        rows=tuple(test.rows),
        started_at=started,
        wall_s=time.monotonic() - clock,
        environment=environment(test.ops, plan.topology),
        ratios=test.ratios,
        error=error,
        simulated=_simulated_node(),
    )


def _simulated_node() -> str | None:
    node = sim.active()
    return None if node is None else str(node.path)
