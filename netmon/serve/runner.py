"""One scheduled probe run: readiness (pause, device lock, idle), its specs from probe.build, the
launcher, and the outcome handed to the results.

Data flows one way: config -> readiness -> spec -> launcher -> outcome -> results. The runner
never raises into the scheduler: every way a run can end is a counted skip or failure.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from netmon.config import NetmonConfig, ProbeConfig
from netmon.gpu.fabric import FabricReading
from netmon.gpu.linkhealth import LinkHealth
from netmon.logs import event
from netmon.probe.build import build_spec, gpu_index
from netmon.probe.launcher import Launcher
from netmon.probe.pairs import (
    PairOutcome,
    best_per_pair,
    pair_placement,
    run_pair_rounds,
    verdict_at_largest,
)
from netmon.probe.paths import SKIP_REASON, unsupported
from netmon.probe.spec import ProbeOutcome, ProbeSpec
from netmon.probe.verdict import Pair
from netmon.serve.current import CurrentConfig
from netmon.serve.readiness import Readiness, device_keys
from netmon.serve.results import Results
from netmon.topology.model import Topology
from netmon.topology.plan import plan_rounds, uniform

log = logging.getLogger(__name__)

STATE_FILE = "baselines.json"


class ProbeRunner:
    """Runs a configured probe when the scheduler says so; never raises."""

    def __init__(
        self,
        current: CurrentConfig,
        results: Results,
        readiness: Readiness,
        launcher: Callable[..., Launcher] = Launcher,
    ) -> None:
        self.current = current
        self.results = results
        self.readiness = readiness
        self.launcher = launcher
        self.topology: Topology | None = None
        # NVML's NVLink fabric state of the node (nvls needs NVSwitch multicast); None on CPU
        # ranks, empty where NVML gave none. Read once by the daemon.
        self.fabric: tuple[FabricReading, ...] | None = None
        self.link_health_reader: Callable[[bool], LinkHealth] | None = None
        self._nccl = ""  # the NCCL version the last ranks reported (path variants need 2.24)

    def run(self, name: str) -> None:
        probe = self.current.probe(name)
        try:
            if probe is None:  # a reload removed it between the scheduler's call and now
                return
            self._run(probe, self.current.get())
        except Exception:  # a bug here must not kill the scheduler thread or the daemon
            log.exception("probe %s: internal error", name)
            self.results.failed_internally(name)

    def _skip(self, probe: ProbeConfig, reason: str, detail: str) -> None:
        self.results.skip(probe.name, reason)
        event(
            log, "probe skipped", probe=probe.name, outcome="skipped", reason=reason, detail=detail
        )

    def _run(self, probe: ProbeConfig, config: NetmonConfig) -> None:
        spec = build_spec(probe, config, topology=self.topology)
        timeout = min(probe.interval, 60.0)
        with self.readiness.claim(device_keys(spec), spec.devices, timeout) as decision:
            if not decision.ready:
                return self._skip(probe, decision.reason, decision.detail)
            if probe.kind == "pairs":
                self._pairs(probe, config, spec)
            else:
                self._variants(probe, config, spec)
        return None

    def _variants(self, probe: ProbeConfig, config: NetmonConfig, spec: ProbeSpec) -> None:
        """Every path variant of the probe, one after the other, each in fresh ranks."""
        abort = self.readiness.abort_check(spec.devices)
        for path in probe.paths:
            if abort() is not None and path != probe.paths[0]:
                break
            fabric = self.fabric if spec.backend == "nccl" else None
            why = unsupported(path, probe.op, fabric, devices=spec.devices, nccl=self._nccl)
            if why is not None:
                self._skip(probe, SKIP_REASON, f"path {path}: {why}")
                continue
            variant = build_spec(probe, config, path=path, topology=self.topology)
            self.results.started(probe.name)
            launcher = self.launcher(
                variant,
                abort=abort,
                python=_python(config),
                on_event=self._on_measure(variant),
            )
            outcome = launcher.run()
            self._nccl = (outcome.environment and outcome.environment.nccl) or self._nccl
            self.results.finished(probe, outcome, path)
            self._log_outcome(probe, outcome, path)

    def _pair_topology(self, spec: ProbeSpec) -> Topology | None:
        """The GPUs pairs may use: only the configured ones (each idle and locked by _run)."""
        if spec.backend != "nccl":
            return self.topology or uniform(spec.ranks, "CPU")
        indices = [gpu_index(self.topology, device) for device in spec.devices]
        if self.topology is None or None in indices:
            return None
        return self.topology.restricted([i for i in indices if i is not None])

    def _pairs(self, probe: ProbeConfig, config: NetmonConfig, spec: ProbeSpec) -> None:
        topo = self._pair_topology(spec)
        if topo is None:
            detail = "pair probes need the topology of every configured GPU (NVML or topology_file)"
            return self._skip(probe, "gpu_unknown", detail)
        rounds = plan_rounds(topo)
        paths = {pair: str(path) for pair, path in topo.pairs().items()}
        abort = self.readiness.abort_check(spec.devices)

        def spec_of(pair: Pair) -> ProbeSpec:
            placement = pair_placement(pair, spec.backend)
            return build_spec(probe, config, placement=placement, topology=topo)

        self.results.started(probe.name)
        started = time.monotonic()
        measured: list[PairOutcome] = []
        for _ in range(probe.passes):
            measured += run_pair_rounds(spec_of, rounds, paths, abort=abort, python=_python(config))
        results = best_per_pair(measured)
        verdict = verdict_at_largest(results, probe.suspect_ratio)
        self.results.finished_pairs(probe, results, verdict, time.monotonic() - started)
        failed = [item for item in results if not item.outcome.ok]
        fields: dict[str, Any] = dict(
            probe=probe.name, pairs=len(results), failed=len(failed), verdict=verdict.describe()
        )
        level = (
            logging.WARNING
            if failed or verdict.suspect_pairs or verdict.suspect_members
            else logging.INFO
        )
        event(log, "pair probes done", level=level, outcome="failed" if failed else "ok", **fields)
        return None

    def _on_measure(self, spec: ProbeSpec) -> Callable[[str, dict[str, Any]], None] | None:
        """Read link health while the largest size is being measured. Only a pcie-path probe
        sends its traffic over PCIe (the default path takes NVLink where there is one), and an
        idle link lowers its generation to save power: so only a pcie-path reading that ended
        while the traffic still flowed is taken as under load; any other is an idle reading."""
        if self.link_health_reader is None or spec.backend != "nccl":
            return None
        reader, largest = self.link_health_reader, max(spec.sizes)
        taken, traffic_over = threading.Event(), threading.Event()

        def read() -> None:
            try:
                health = reader(spec.path == "pcie")
                if health.under_load and traffic_over.is_set():
                    health = dataclasses.replace(health, under_load=False)  # read too late
                self.results.set_link_health(health)
            except Exception as exc:  # NVML trouble must never touch the probe
                log.debug("link health read failed: %s", exc)

        def on_event(kind: str, fields: dict[str, Any]) -> None:
            size = fields.get("size", fields.get("size_bytes"))
            if kind == "phase" and fields.get("phase") == "measure" and size == largest:
                if not taken.is_set():
                    taken.set()
                    threading.Thread(target=read, name="link-health", daemon=True).start()
            elif taken.is_set() and (kind == "size" or fields.get("phase") != "measure"):
                traffic_over.set()

        return on_event

    def _log_outcome(self, probe: ProbeConfig, outcome: ProbeOutcome, path: str) -> None:
        fields: dict[str, Any] = dict(
            probe=probe.name,
            path=path,
            op=outcome.spec.op,
            wall_s=round(outcome.wall_s, 3),
            collective_s=round(outcome.collective_s, 3),
        )
        if outcome.failure is not None:
            fields.update(
                outcome="failed", reason=outcome.failure.reason, detail=outcome.failure.describe()
            )
            event(log, "probe failed", level=logging.WARNING, **fields)
            return
        largest = max(outcome.results, key=lambda r: r.size_bytes, default=None)
        if largest is not None:
            fields.update(
                size_bytes=largest.size_bytes,
                busbw_gbps=round(largest.busbw_bytes_per_second / 1e9, 4),
                latency_us=round(outcome.results[0].time_s * 1e6, 1),
            )
        event(log, "probe ok", outcome="ok", **fields)


def _python(config: NetmonConfig) -> str:
    return config.rank_python or sys.executable
