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
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from netmon.config import NetmonConfig, ProbeConfig
from netmon.gpu.fabric import FabricReading
from netmon.gpu.linkhealth import LinkHealth, marked_loaded
from netmon.logs import event
from netmon.probe.build import LOCAL, Placement, build_spec, gpu_index
from netmon.probe.forking import Zygote
from netmon.probe.launcher import Launcher
from netmon.probe.pairs import (
    Gate,
    PairOutcome,
    PairSkip,
    best_per_pair,
    pair_placement,
    run_pair_rounds,
)
from netmon.probe.paths import SKIP_REASON, unsupported
from netmon.probe.spec import ProbeOutcome, ProbeSpec
from netmon.probe.verdict import Pair
from netmon.serve.current import CurrentConfig
from netmon.serve.readiness import Readiness, device_keys, first_reason
from netmon.serve.results import Results
from netmon.topology.model import Topology
from netmon.topology.plan import idle_set, plan_rounds, uniform

log = logging.getLogger(__name__)

STATE_FILE = "baselines.json"
NO_PAIR_TOPOLOGY = "pair probes need the topology of every configured GPU (NVML or topology_file)"


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
        self.zygote: Zygote | None = None  # forks the ranks; None: spawned (rank_start: spawn)
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
        if spec.backend == "nccl" and probe.kind == "pairs":
            return self._pairs_on_idle_gpus(probe, config, spec)
        if spec.backend == "nccl" and probe.gpus == "idle":
            return self._on_idle_set(probe, config, spec)
        timeout = min(probe.interval, 60.0)
        with self.readiness.claim(device_keys(spec), spec.devices, timeout) as decision:
            if not decision.ready:
                return self._skip(probe, decision.reason, decision.detail)
            if probe.kind == "pairs":
                self._pairs(probe, config, spec, self._pair_topology(spec), [])
            else:
                self._variants(probe, config, spec)
        return None

    def _on_idle_set(self, probe: ProbeConfig, config: NetmonConfig, spec: ProbeSpec) -> None:
        """`gpus: idle`: the collective on the largest idle set (topology.plan.idle_set)."""
        self.readiness.await_own_probes(spec.devices, min(probe.interval, 60.0))
        survey = self.readiness.survey(spec.devices)
        if survey.blocked is not None:
            return self._skip(probe, survey.blocked.reason, survey.blocked.detail)
        chosen = self._idle_choice(survey.idle, probe.min_gpus)
        if not chosen:
            reason = first_reason(survey.busy.values()) or "gpu_unknown"
            detail = f"{len(survey.idle)} idle of {len(survey.devices)}, under min_gpus "
            return self._skip(probe, reason, f"{detail}{probe.min_gpus}: {survey.detail}")
        placement = Placement(devices=tuple(chosen))
        narrowed = build_spec(probe, config, placement=placement, topology=self.topology)
        timeout = min(probe.interval, 60.0)
        with self.readiness.claim(frozenset(chosen), chosen, timeout, samples=1) as decision:
            if not decision.ready:
                return self._skip(probe, decision.reason, decision.detail)
            self._variants(probe, config, narrowed, placement)
        return None

    def _idle_choice(self, idle: tuple[str, ...], min_gpus: int) -> list[str]:
        """The idle GPUs to run on, by the topology where it knows them all."""
        by_index = {gpu_index(self.topology, d): d for d in idle}
        if None in by_index:  # no topology for some GPU: no islands to prefer
            return list(idle) if len(idle) >= min_gpus else []
        known = [i for i in by_index if i is not None]
        return [by_index[i] for i in idle_set(self.topology, known, min_gpus)]

    def _variants(
        self,
        probe: ProbeConfig,
        config: NetmonConfig,
        spec: ProbeSpec,
        placement: Placement = LOCAL,
    ) -> None:
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
            variant = build_spec(
                probe, config, path=path, placement=placement, topology=self.topology
            )
            self.results.started(probe.name)
            launcher = self.launcher(
                variant,
                abort=abort,
                python=_python(config),
                on_event=self._on_measure(variant),
                zygote=self.zygote,
            )
            outcome = launcher.run()
            self._nccl = (outcome.environment and outcome.environment.nccl) or self._nccl
            self.results.finished(probe, outcome, path)
            self._log_outcome(probe, outcome, path)

    def _pair_topology(self, spec: ProbeSpec) -> Topology | None:
        """The GPUs pairs may use: only the configured ones."""
        if spec.backend != "nccl":
            return self.topology or uniform(spec.ranks, "CPU")
        indices = [gpu_index(self.topology, device) for device in spec.devices]
        if self.topology is None or None in indices:
            return None
        return self.topology.restricted([i for i in indices if i is not None])

    def _pairs_on_idle_gpus(
        self, probe: ProbeConfig, config: NetmonConfig, spec: ProbeSpec
    ) -> None:
        """Every pair of configured GPUs that are idle now, each pair holding its own two GPUs
        while it runs; the pairs of busy GPUs are skipped, counted by reason."""
        topo = self._pair_topology(spec)
        if topo is None:
            return self._skip(probe, "gpu_unknown", NO_PAIR_TOPOLOGY)
        self.readiness.await_own_probes(spec.devices, min(probe.interval, 60.0))
        survey = self.readiness.survey(spec.devices)
        if survey.blocked is not None:
            return self._skip(probe, survey.blocked.reason, survey.blocked.detail)
        busy = {gpu_index(topo, d): reason for d, reason in survey.busy.items()}
        skipped = [
            PairSkip(pair, str(path), first_reason(busy[g] for g in pair if g in busy), "")
            for pair, path in topo.pairs().items()
            if busy.keys() & set(pair)
        ]
        idle = [i for i in topo.indices if i not in busy]
        if len(idle) < 2:
            self.results.pairs_skipped(probe.name, skipped)
            reason = first_reason(busy.values()) or "gpu_unknown"
            return self._skip(probe, reason, f"fewer than 2 idle GPUs: {survey.detail}")
        return self._pairs(probe, config, spec, topo.restricted(idle), skipped)

    def _gate_for(self, timeout: float) -> Callable[[Pair], AbstractContextManager[Gate]]:
        """Each pair's own claim: its two GPUs locked and idle at a glance, right after the
        sweep's full survey; then its own abort check, so a job stops this pair alone.

        A pair waits its turn (first come, first served, up to `timeout`) behind another probe
        of ours on its GPUs: taking them only if free at that instant let a frequent probe on
        the same GPUs (`gpus: idle` picks the NVLink island a pair also uses) take every turn,
        and that pair was never measured."""

        def gate(pair: Pair) -> AbstractContextManager[Gate]:
            devices = [str(pair[0]), str(pair[1])]

            @contextmanager
            def claimed() -> Iterator[Gate]:
                keys = frozenset(devices)
                with self.readiness.claim(keys, devices, timeout, samples=1) as decision:
                    if not decision.ready:
                        yield Gate(decision.reason, decision.detail)
                        return
                    yield Gate(abort=self.readiness.abort_check(devices))

            return claimed()

        return gate

    def _pairs(
        self,
        probe: ProbeConfig,
        config: NetmonConfig,
        spec: ProbeSpec,
        topo: Topology | None,
        skipped: list[PairSkip],
    ) -> None:
        if topo is None:
            return self._skip(probe, "gpu_unknown", NO_PAIR_TOPOLOGY)
        rounds = plan_rounds(topo)
        paths = {pair: str(path) for pair, path in topo.pairs().items()}
        on_gpus = spec.backend == "nccl"

        def spec_of(pair: Pair) -> ProbeSpec:
            placement = pair_placement(pair, spec.backend)
            return build_spec(probe, config, placement=placement, topology=topo)

        self.results.started(probe.name)
        started = time.monotonic()
        measured: list[PairOutcome] = []
        sweep_skips: list[PairSkip] = list(skipped)
        for _ in range(probe.passes):
            measured += run_pair_rounds(
                spec_of,
                rounds,
                paths,
                abort=self.readiness.abort_check(() if on_gpus else spec.devices),
                python=_python(config),
                gate=self._gate_for(min(probe.interval, 60.0)) if on_gpus else None,
                on_skip=sweep_skips.append,
                zygote=self.zygote,
            )
        results = best_per_pair(measured)
        ran = {item.pair for item in results}
        unmeasured = {s.pair: s for s in sweep_skips if s.pair not in ran}
        self.results.pairs_skipped(probe.name, list(unmeasured.values()))
        verdict = self.results.finished_pairs(probe, results, time.monotonic() - started)
        failed = [item for item in results if not item.outcome.ok]
        fields: dict[str, Any] = dict(
            probe=probe.name,
            pairs=len(results),
            skipped=len(unmeasured),
            failed=len(failed),
            verdict=verdict.describe(),
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
        while the traffic still flowed is taken as under load; any other is an idle reading.
        NVML reads every GPU of the node, so the reading is marked with the probe's own GPUs,
        the only links under load (a GPU the topology cannot name stays unjudged)."""
        if self.link_health_reader is None or spec.backend != "nccl":
            return None
        reader, largest = self.link_health_reader, max(spec.sizes)
        taken, traffic_over = threading.Event(), threading.Event()
        probed = [gpu_index(self.topology, device) for device in spec.devices]
        loaded = frozenset(index for index in probed if index is not None)

        def read() -> None:
            try:
                health = reader(spec.path == "pcie")
                if health.under_load and traffic_over.is_set():
                    health = dataclasses.replace(health, under_load=False)  # read too late
                self.results.set_link_health(marked_loaded(health, loaded))
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

    @staticmethod
    def _log_outcome(probe: ProbeConfig, outcome: ProbeOutcome, path: str) -> None:
        fields: dict[str, Any] = dict(
            probe=probe.name,
            path=path,
            op=outcome.spec.op,
            wall_s=round(outcome.wall_s, 3),
            collective_s=round(outcome.collective_s, 3),
            rank_cpu_s=round(sum(outcome.rank_cpu_s.values()), 3),
            # Where the ranks' CPU went (probe.rankcpu): what a probe run costs the node.
            rank_cpu=",".join(f"{k}:{v:.3f}" for k, v in outcome.rank_cpu_s.items()) or "-",
        )
        if outcome.failure is not None:
            fields.update(
                outcome="failed", reason=outcome.failure.reason, detail=outcome.failure.describe()
            )
            event(log, "probe failed", level=logging.WARNING, **fields)
            return
        if outcome.results:
            # Each figure where it means something, and its size beside it: busbw at the largest
            # size (bandwidth-bound), latency (the table's time) at the smallest (latency-bound).
            largest = max(outcome.results, key=lambda r: r.size_bytes)
            smallest = min(outcome.results, key=lambda r: r.size_bytes)
            fields.update(
                busbw_gbps=round(largest.busbw_bytes_per_second / 1e9, 4),
                busbw_size_bytes=largest.size_bytes,
                # The field of earlier releases (the largest size), for log pipelines reading it.
                size_bytes=largest.size_bytes,
                latency_us=round(smallest.time_s * 1e6, 1),
                latency_size_bytes=smallest.size_bytes,
            )
        event(log, "probe ok", outcome="ok", **fields)


def _python(config: NetmonConfig) -> str:
    return config.rank_python or sys.executable
