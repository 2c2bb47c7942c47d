"""`netmon serve`: wires configuration, scheduler, probes and exporter, and owns the lifecycle.

The daemon process imports neither torch nor CUDA: probes run in rank processes it starts.
SIGTERM or SIGINT stop the scheduler, cancel an in-flight probe (its launcher kills the ranks),
save state and exit 0 within the grace period.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from netmon import dirs
from netmon.baseline.expect import expectation_for
from netmon.config import NetmonConfig
from netmon.errors import CouldNotRun, UsageError
from netmon.exposition.collector import SnapshotPage
from netmon.exposition.http import MetricsServer
from netmon.exposition.webconfig import WebSecurity
from netmon.gpu import idle, idle_policy, idle_sources, models
from netmon.gpu.fabric import FabricReading
from netmon.gpu.linkhealth import LinkHealth
from netmon.group.keys import load_keys
from netmon.group.link import GroupError, GroupLink
from netmon.group.members import bind_address, identify_self, member_port
from netmon.logs import event
from netmon.probe.build import SpecError, build_spec
from netmon.probe.forking import Zygote
from netmon.probe.starting import base_env
from netmon.serve.coordinator import Coordinator
from netmon.serve.current import CurrentConfig
from netmon.serve.jobs_traffic import JobsTraffic
from netmon.serve.keeper import BaselineKeeper, clear_interrupted_saves
from netmon.serve.readiness import Decision, DeviceLocks, Readiness
from netmon.serve.results import Results
from netmon.serve.runner import STATE_FILE, ProbeRunner
from netmon.serve.sweep_inbox import STATE_FILE as SWEEP_FILE
from netmon.serve.sweep_inbox import open_inbox, secret_path
from netmon.serve.telemetry import LinkTelemetry
from netmon.serve.timetable import Timetable
from netmon.topology.identity import read_identity
from netmon.topology.model import Topology
from netmon.topology.parse import parse_topo_matrix

log = logging.getLogger("netmon.serve.daemon")

SHUTDOWN_GRACE_S = 8.0
# Settings a running daemon cannot take on a reload: its socket, state, ranks and group.
RESTART_FIELDS = (
    "listen",
    "state_dir",
    "backend",
    "ranks",
    "devices",
    "group",
    "rank_python",
    "rank_start",
    "topology_file",
    # The baseline book is built with its policy at start (its windows are sized by it); a
    # reload that changed it used to be accepted and ignored.
    "baseline",
    "expect",  # the book's expected levels are built with it at start
    "inspector",  # its reader and shapes are built at start
)


def _state_path(config: NetmonConfig) -> Path | None:
    """The baseline file; None (with a warning) when the directory cannot be created."""
    assert config.state_dir is not None
    try:
        config.state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning(
            "state_dir %s unusable (%s): baselines will not survive a restart",
            config.state_dir,
            exc.strerror,
        )
        return None
    # Before anything saves again: what saves killed midway (kill -9, a power cut) left.
    clear_interrupted_saves(config.state_dir, (STATE_FILE, SWEEP_FILE))
    return config.state_dir / STATE_FILE


def _idle_source(config: NetmonConfig) -> idle.IdleSource:
    if config.backend != "nccl":
        return idle_sources.NoGpuSource()
    from netmon.gpu.nvml import NvmlSource

    try:
        return NvmlSource()
    except idle.IdleSourceError as exc:
        # Without NVML nothing can be known idle: every probe is skipped as nvml_error.
        log.error("%s; no probe will run until NVML works", exc)
        return _FailingSource(str(exc))


def _kubelet_guard(
    source: idle.IdleSource, policy: Callable[[], idle_policy.IdlePolicy]
) -> idle.IdleSource:
    # Always in place, passing readings through while idle.kubelet_socket is unset, so that a
    # reload can turn the kubelet's answer on or off. POD_NAME/POD_NAMESPACE come from the
    # downward API: GPUs given to netmon's own pod are not a job's.
    from netmon import sim
    from netmon.gpu.kubelet import KubeletGuard, own_pod

    node = sim.active()
    if node is not None:
        # The node file's pods, answered to the same guard as the kubelet's would be.
        from netmon.sim.kubelet import simulated_guard

        return simulated_guard(source, policy, node, own_pod(os.environ))
    return KubeletGuard(source, policy, own_pod(os.environ))


def _topology(config: NetmonConfig) -> Topology | None:
    """From the configured file, else NVML on GPU nodes; None leaves pairs to the CPU ranks."""
    if config.topology_file is not None:
        try:
            return parse_topo_matrix(config.topology_file.read_text(errors="replace"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"topology_file: {config.topology_file}: {exc}") from None
    if config.backend != "nccl":
        return None
    from netmon.gpu.nvml import read_topology

    try:
        return read_topology()
    except idle.IdleSourceError as exc:
        log.warning("no topology from NVML (%s): pair probes and path intents are limited", exc)
        return None


def _fabric() -> tuple[FabricReading, ...]:
    """The node's NVLink fabric (whether nvls can run); empty, so nvls is skipped, without it."""
    from netmon.gpu.nvml_links import read_fabric

    try:
        return read_fabric()
    except idle.IdleSourceError as exc:
        log.warning("no NVLink fabric state from NVML (%s): the nvls path is skipped", exc)
        return ()


def _gpu_model(config: NetmonConfig) -> str:
    """The model of the probed GPUs, read from NVML once: one per node (netmon.gpu.models)."""
    if config.backend != "nccl":
        return models.CPU_MODEL
    from netmon.gpu.nvml import read_gpu_names

    try:
        named = models.probed_models(read_gpu_names(), config.devices)
    except Exception as exc:  # NvmlUnavailable, an NVMLError: a label must not stop the daemon
        log.warning("no GPU model from NVML (%s): netmon_node_info says unknown", exc)
        return models.UNKNOWN_MODEL
    model = models.node_model(named)
    if len(set(named)) > 1:
        log.warning("the probed GPUs are of several models (%s): known as %s", named, model)
    return model


def _check_specs(config: NetmonConfig, topology: Topology | None) -> None:
    """Every local probe must make a runnable spec on this node ({numa} needs a NUMA node for
    every GPU): said once at start or reload, not as a failure at every run."""
    for probe in config.probes or ():
        try:
            build_spec(probe, config, topology=topology)
        except SpecError as exc:
            raise UsageError(f"{exc} (probe {probe.name})") from None


def _node_fault() -> Decision | None:
    """Why no rank may start on this node (an old driver, a PID namespace of its own): said once
    here, and every run is then skipped with that reason instead of failing or being preempted."""
    from netmon.gpu.compat import node_fault

    fault = node_fault()
    if fault is None:
        return None
    log.error(
        "%s; no probe will run on this node until that is fixed and netmon restarted", fault.message
    )
    return Decision(False, fault.reason, fault.message)


class _FailingSource:
    def __init__(self, message: str) -> None:
        self.message = message

    def read(self) -> list[idle.GpuReading]:
        raise idle.IdleSourceError(self.message)


class Daemon:
    def __init__(
        self,
        config: NetmonConfig,
        idle_source: idle.IdleSource | None = None,
        web: WebSecurity | None = None,
        loader: Callable[[], NetmonConfig] | None = None,
        link_reader: Callable[[bool], LinkHealth] | None = None,
    ) -> None:
        self.current = CurrentConfig(config)
        self.loader = loader  # how SIGHUP reads the configuration again
        self.reload_requested = threading.Event()
        self.stopping = threading.Event()
        self.topology = _topology(config)
        _check_specs(config, self.topology)
        # A start that fails (the port taken) leaves no state directory it made behind.
        made = dirs.missing(config.state_dir) if config.state_dir is not None else []
        state_path = _state_path(config)
        gpu_model = _gpu_model(config)
        try:
            keeper = BaselineKeeper.open(
                state_path,
                config.baseline.for_ranks(config.backend),
                read_identity(self.topology),
                refuse_corrupt=config.state_on_corrupt == "refuse",
                expect=expectation_for(models.named(gpu_model), site_entries=config.expect),
            )
        except UsageError:
            dirs.remove_empty(made)
            raise
        self.results = Results(self.current, keeper, gpu_model)
        state_dir = state_path.parent if state_path is not None else None
        self.sweep_inbox = open_inbox(config, state_dir, self.results.set_sweep)
        self.jobs_traffic = (
            JobsTraffic(config.inspector, self.results) if config.inspector is not None else None
        )
        source = idle_source or _idle_source(config)
        self.readiness = Readiness(
            self.current,
            DeviceLocks(),
            _kubelet_guard(source, lambda: self.current.get().idle),
            self.stopping,
            self.topology,
        )
        if config.backend == "nccl":
            self.readiness.fault = _node_fault()
        self.runner = ProbeRunner(self.current, self.results, self.readiness)
        self.runner.topology = self.topology
        self.zygote = _zygote(config, self.results, self.stopping)
        self.runner.zygote = self.zygote
        if self.topology is not None:
            self.results.set_topology(
                [(a, b, str(path)) for (a, b), path in self.topology.pairs().items()]
            )
        self.telemetry: LinkTelemetry | None = None
        if config.backend == "nccl":
            if link_reader is None:
                from netmon.gpu.nvml_links import read_link_health

                link_reader = read_link_health
            self.runner.link_health_reader = link_reader
            self.telemetry = LinkTelemetry(link_reader, self.results)
            self.runner.fabric = _fabric()
        self.timetable = Timetable(
            config,
            self.runner.run,
            self.telemetry.read if self.telemetry is not None else None,
            self.jobs_traffic.read if self.jobs_traffic is not None else None,
            on_step=self.results.clock_stepped,
            on_overrun=lambda probe: self.results.skip(probe, "still_running"),
        )
        self.scheduler = self.timetable.scheduler
        self.link: GroupLink | None = None
        self.coordinator: Coordinator | None = None
        try:
            self.server = MetricsServer(
                config.listen_host,
                config.listen_port,
                SnapshotPage(self.results.snapshot),
                security=web,
                on_sweep=self.sweep_inbox.receive if self.sweep_inbox is not None else None,
            )
        except OSError as exc:
            dirs.remove_empty(made)
            raise UsageError(f"listen: cannot listen on {config.listen}: {exc.strerror}") from None

    @property
    def config(self) -> NetmonConfig:
        return self.current.get()

    def reload(self) -> bool:
        """SIGHUP: take the configuration again; on any error keep the old one, log, count."""
        self.server.reload_web_config()  # first and apart: a bad web-config never blocks the rest
        if self.loader is None:
            return False
        try:
            new = self.loader()
            changed = [f for f in RESTART_FIELDS if getattr(new, f) != getattr(self.config, f)]
            # Read at start, as group's.
            for setting, now, then in zip(
                ("sweep.verify_key_file", "sweep.secret_file"),
                secret_path(new),
                secret_path(self.config),
                strict=True,
            ):
                if now != then:
                    changed.append(setting)
            if changed:
                raise UsageError(f"{', '.join(changed)}: changing this needs a restart")
            _check_specs(new, self.topology)
            if self.coordinator is not None:  # key files rotated in place (by contents)
                self.coordinator.rekey()
        except (UsageError, CouldNotRun) as exc:  # a reload never stops the daemon
            log.error("configuration reload failed, keeping the running one: %s", exc)
            self.results.reloaded(False)
            return False
        before = self.config
        self.current.publish(new)  # the runner, results and coordinator read it from here
        self.timetable.replace(before, new)
        self.results.reloaded(True)
        event(log, "configuration reloaded", probes=", ".join(p.name for p in new.probes or ()))
        return True

    def _start_group(self) -> None:
        group = self.config.group
        if group is None:
            return
        try:
            me = identify_self(group)
            host = bind_address(group, me)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        keys = load_keys(group)
        self.link = GroupLink(
            member_port(me),
            host,
            me,
            python=self.config.rank_python or sys.executable,
            secret=keys.secret,
            on_refused=self.results.group_store_refused,
        )
        try:
            self.link.start()
        except GroupError as exc:
            raise UsageError(f"group.self: {exc}") from None
        self.coordinator = Coordinator(
            self.current,
            group,
            me,
            self.link,
            keys.sealer,
            self.readiness,
            self.results,
            self.topology,
            zygote=self.zygote,
            keys=keys,
        )
        self.coordinator.start()

    def start(self) -> None:
        self.server.serve_in_thread()
        self._start_group()
        self.scheduler.start()
        config = self.config
        host, port = self.server.server_address[:2]
        probes = ", ".join(
            f"{p.name} ({p.op} {len(p.sizes)} sizes every {p.interval:g} s)"
            for p in config.probes or ()
        )
        event(
            log,
            "netmon serving",
            listen=f"{self.server.scheme}://{_url_host(str(host))}:{port}/metrics",
            backend=config.backend,
            ranks=config.ranks,
            devices=",".join(config.devices or ()),
            probes=probes,
            state_dir=str(config.state_dir),
        )

    def stop(self) -> None:
        """Cancel probes, wait for them to end, save state; bounded by SHUTDOWN_GRACE_S."""
        self.stopping.set()
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        # shutdown(wait=True) waits for running probes (their launchers see `stopping` and kill
        # their ranks) but has no timeout of its own: wait for it on a thread, bounded.
        waiter = threading.Thread(target=self._stop_scheduler, name="scheduler-stop", daemon=True)
        waiter.start()
        waiter.join(max(0.0, deadline - time.monotonic()))
        if self.coordinator is not None:
            self.coordinator.join(max(0.0, deadline - time.monotonic()))
        if self.link is not None:
            self.link.stop()
        if self.zygote is not None:
            self.zygote.close()  # after the probes: it ends with whatever ranks it still has
        self.server.shutdown()
        self.server.server_close()
        log.info("netmon stopped")

    def _stop_scheduler(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)

    def serve_forever(self) -> int:
        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s: stopping", signal.Signals(signum).name)
            self.stopping.set()

        def on_hangup(_signum: int, _frame: FrameType | None) -> None:
            self.reload_requested.set()  # the work happens on the main loop, not in a handler

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGHUP, on_hangup)
        self.start()
        while not self.stopping.wait(0.5):
            if self.reload_requested.is_set():
                self.reload_requested.clear()
                self.reload()
        self.stop()
        return 0


def _zygote(config: NetmonConfig, results: Results, stopping: threading.Event) -> Zygote | None:
    """The rank zygote, started at the first probe; none with `rank_start: spawn`. A stop cuts
    its start short: a daemon stopped while torch imports does not wait for the import."""
    if config.rank_start != "zygote":
        return None
    return Zygote(
        config.rank_python or sys.executable,
        base_env(),
        on_start=results.zygote_started,
        cancel=stopping,
    )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
