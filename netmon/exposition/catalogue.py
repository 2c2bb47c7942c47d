"""Every metric family netmon exports, as data: name, type, unit, labels, HELP text and the
collector that builds it. The collectors take HELP and type from here, and the tests hold the
catalogue, docs/METRICS.md, the dashboard and the alert rules to each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from netmon.gpu.compat import FAULT_REASONS
from netmon.gpu.idle import REASONS as IDLE_REASONS
from netmon.probe.cpushare import MODES
from netmon.probe.forking import FALLBACK_REASONS, START_METHODS
from netmon.sweep.delivery.inbox import REPORT_OUTCOMES

# info: a gauge that is always 1 and carries metadata in its labels, named *_info. The text format
# netmon serves (0.0.4) has no info type, so it is exposed as a gauge, as it always was.
Kind = Literal["gauge", "counter", "info"]
# What HELP adds after the catalogue's text: probes, the probes' schedule (from the snapshot); nvml,
# when NVML is read; sweep, that `netmon sweep` delivered it. Either way the reader learns that
# the value is not measured at scrape time.
Measured = Literal["", "probes", "nvml", "sweep"]

# ranks: the world size (GPUs or CPU ranks) the value was measured with, bounded by the node's
# GPU count (a probe with `gpus: idle` runs on as many as are idle; a group round on the group's).
SERIES_LABELS = ("probe", "op", "size_bytes", "path", "ranks")

NVML_WHEN = (
    "Read from NVML every {interval} (link_telemetry.interval) whether or not jobs run, and "
    "during pcie-path probe traffic; not at scrape time"
)
NVML_WHEN_PROBES = (
    "Read from NVML during pcie-path probe traffic only (link_telemetry.interval is 0); not at "
    "scrape time"
)
SWEEP_WHEN = (
    "From the last cluster sweep delivered here (netmon sweep, POST /sweep), not at scrape time"
)

# Why a line, file or directory of the jobs' NCCL Inspector output was not taken (netmon.inspector).
INSPECTOR_REJECT_REASONS = (
    "missing_dir",
    "too_many_files",
    "symlink",
    "unreadable",
    "not_a_file",
    "hardlink",
    "too_large",
    "changed_during_read",
    "replaced",
    "backlog_skipped",
    "oversized_line",
    "truncated_line",
    "not_utf8",
    "unparsable",
    "incomplete",
    "unknown_collective",
    "bad_value",
    "unremovable",
    "budget_exhausted",
    "internal",
    # A record whose figures cannot be a measurement (netmon.inspector.records.implausible).
    "implausible_busbw",
    "implausible_time",
)
# The states of a job directory under inspector.dir at its last read (netmon.inspector.files).
INSPECTOR_DIRECTORY_STATES = ("live", "removable", "foreign")

# Bounded label values, exported as 0 from the start so that rate() and increase() see the first
# event (docs/METRICS.md lists them).
FAILURE_REASONS = (
    "timeout_spawn",
    "timeout_rendezvous",
    "timeout_init",
    "timeout_warmup",
    "timeout_measure",
    "timeout_check",
    "timeout_teardown",
    "rendezvous",
    "rank_exit",
    "rank_signal",
    "rank_error",
    "spawn",
    "check",
    "paused",
    "preempted",
    "shutdown",
    "internal",
    "member_absent",
    "transport_mismatch",
    "zygote_lost",
)
SKIP_REASONS = (
    "paused",
    "devices_busy",
    "own_probe",
    "gpu_busy_process",
    "gpu_busy_utilization",
    "gpu_busy_memory",
    "gpu_allocated",
    "gpu_unknown",
    "gpu_mig",
    "gpu_compute_mode",
    "gpu_missing",
    "nvml_error",
    "kubelet_error",
    "shutting_down",
    "still_running",
    "member_absent",
    "path_unsupported",
    *FAULT_REASONS,
)
# Why a pair of a pairs probe was not measured: a GPU of it paused, held by another probe, or not
# idle by NVML or the kubelet (netmon.gpu.idle's reasons).
PAIR_SKIP_REASONS = ("paused", "devices_busy", "own_probe", *IDLE_REASONS)
# How ranks started, and why a probe's ranks were spawned although the zygote was configured.
RANK_START_METHODS = START_METHODS
FORK_FALLBACK_REASONS = FALLBACK_REASONS
# The `mode` of netmon_probe_cpu_mode_ratio: CPU time that is no process's work (proc(5)).
CPU_MODES = MODES
# How a delivered sweep report was taken: accepted, malformed (400) or refused (403).
SWEEP_REPORT_OUTCOMES = REPORT_OUTCOMES


@dataclass(frozen=True)
class Family:
    """One exported family. A counter is named here without `_total`; its samples carry it."""

    collector: str  # the collector that builds it ("scrape": the collector framework itself)
    name: str
    kind: Kind
    unit: str  # base unit the name ends with (seconds, bytes, bytes_per_second, ratio), or ""
    labels: tuple[str, ...]
    help: str
    measured: Measured = ""

    @property
    def type(self) -> Literal["gauge", "counter"]:
        """The type in the exposition."""
        return "counter" if self.kind == "counter" else "gauge"

    @property
    def sample_name(self) -> str:
        return f"{self.name}_total" if self.kind == "counter" else self.name


_SERIES = SERIES_LABELS
_PAIR = ("probe", "gpu", "peer_gpu", "path")

# fmt: off
CATALOGUE: tuple[Family, ...] = (
    # series: the latest result of each (probe, op, size, path), with its baseline verdict
    Family("series", "netmon_busbw_bytes_per_second", "gauge", "bytes_per_second", _SERIES,
           "Bus bandwidth (nccl-tests busbw)", "probes"),
    Family("series", "netmon_algbw_bytes_per_second", "gauge", "bytes_per_second", _SERIES,
           "Algorithm bandwidth (size / time)", "probes"),
    Family("series", "netmon_latency_seconds", "gauge", "seconds", _SERIES,
           "Time per op, median over samples", "probes"),
    Family("series", "netmon_latency_variation_ratio", "gauge", "ratio", _SERIES,
           "Coefficient of variation of the time per op", "probes"),
    Family("series", "netmon_sm_clock_hertz", "gauge", "hertz", _SERIES,
           "Lowest SM clock of the probe's GPUs right after the measured loop (NVML)", "probes"),
    Family("series", "netmon_measurement_timestamp_seconds", "gauge", "seconds", _SERIES,
           "When this value was measured", "probes"),
    Family("series", "netmon_busbw_baseline_bytes_per_second", "gauge", "bytes_per_second", _SERIES,
           "Learned baseline: median busbw of recent healthy results", "probes"),
    Family("series", "netmon_busbw_baseline_ratio", "gauge", "ratio", _SERIES,
           "Latest busbw divided by its expected level (the higher of baseline and reference)",
           "probes"),
    Family("series", "netmon_busbw_reference_bytes_per_second", "gauge", "bytes_per_second",
           _SERIES, "Long-term reference: the median of a day's hour medians, then fixed (young "
           "until then: netmon_reference_mature); lowered only by netmon rebaseline or new "
           "hardware", "probes"),
    Family("series", "netmon_reference_mature", "gauge", "", _SERIES,
           "1 once the reference is learned over a day of results and fixed; 0 while it is "
           "young (provisional, the median of the hours seen so far)", "probes"),
    Family("series", "netmon_reference_stale", "gauge", "", _SERIES,
           "1 when the series has run steadily above its reference for 12 h or more, further "
           "than the reference moves by itself (an upgrade): declines are measured from the "
           "old level until netmon rebaseline takes the reference up", "probes"),
    Family("series", "netmon_busbw_level_bytes_per_second", "gauge", "bytes_per_second",
           _SERIES, "Long level: the median of the series' last baseline.long_window conclusive "
           "results, the level to compare across nodes (netmon_busbw_reference_bytes_per_second "
           "is what it is judged against)", "probes"),
    Family("series", "netmon_busbw_decline_bound_bytes_per_second", "gauge", "bytes_per_second",
           _SERIES, "A long level under this busbw is a decline: the line relative to the "
           "reference", "probes"),
    Family("series", "netmon_degraded", "gauge", "", _SERIES,
           "1 when the series is degraded (netmon_degraded_reason says why); cleared only by "
           "healthy results with its levels back", "probes"),
    Family("series", "netmon_degraded_reason", "gauge", "", (*_SERIES, "reason"),
           "1 for why a degraded series is degraded: flapping (low or noisy results among "
           "healthy ones), low (M of N results low), drift (the recent level under its line) or "
           "decline (the long level under the reference's line)", "probes"),
    Family("series", "netmon_degraded_since_timestamp_seconds", "gauge", "seconds", _SERIES,
           "When the series turned degraded (kept across restarts); absent while it is not",
           "probes"),
    Family("series", "netmon_degraded_episodes", "counter", "", _SERIES,
           "Times the series turned degraded since the daemon started", "probes"),
    Family("series", "netmon_judged_at_floor", "gauge", "", _SERIES,
           "1 when the series' spread would put its low line under floor x expected level, so "
           "it is judged at the floor: too noisy for its tolerance", "probes"),
    Family("series", "netmon_last_judged_timestamp_seconds", "gauge", "seconds", _SERIES,
           "When the series last had a conclusive result (judged or learned); the daemon's start "
           "until its first", "probes"),
    Family("series", "netmon_busbw_baseline_spread_bytes_per_second", "gauge", "bytes_per_second",
           _SERIES, "Robust spread of the baseline window: 1.4826 x median absolute deviation",
           "probes"),
    Family("series", "netmon_busbw_low_bound_bytes_per_second", "gauge", "bytes_per_second",
           _SERIES, "A judged result under this busbw is low: min(R x expected, expected - k x "
           "spread), never under floor x expected", "probes"),
    Family("series", "netmon_low_results", "gauge", "", _SERIES,
           "Low results among the last N judged (the M-of-N rule degrades at M)", "probes"),
    Family("series", "netmon_flapping_results", "gauge", "", _SERIES,
           "Low or noisy results among the last baseline.flap_window judged (flapping degrades "
           "at baseline.flap_trigger of them among as many healthy)", "probes"),
    Family("series", "netmon_judged", "gauge", "", _SERIES,
           "1 when the series can turn degraded; 0 for a latency-bound size that is learned and "
           "shown only (on CPU ranks unless baseline.latency_ratio is set, or where it is null)",
           "probes"),
    Family("series", "netmon_foreign_cpu_ratio", "gauge", "ratio", _SERIES,
           "Other processes' CPU use while the result was measured, per CPU of the machine "
           "(0 quiet, 1 every core taken): their user, nice and system time, netmon's own "
           "daemon and rank zygote left out", "probes"),
    Family("series", "netmon_probe_cpu_mode_ratio", "gauge", "ratio", (*_SERIES, "mode"),
           "Share of the ranks' CPUs spent in this mode while the latest result was measured: "
           "irq (hardware interrupts), softirq, steal (taken by the hypervisor). Shown, never a "
           "reason to leave a result unjudged", "probes"),
    Family("series", "netmon_busbw_threshold_bytes_per_second", "gauge", "bytes_per_second",
           _SERIES, "Configured min_busbw of the probe", "probes"),
    # paths: path variants against each other, and the transports NCCL chose
    Family("paths", "netmon_nvlink_pcie_busbw_ratio", "gauge", "ratio",
           ("probe", "op", "size_bytes", "ranks"),
           "busbw on the default (NVLink) path over the PCIe host-memory path (NCCL_P2P_DISABLE)",
           "probes"),
    Family("paths", "netmon_transport_info", "info", "", ("probe", "path", "transport"),
           "1 for each transport the ranks of a probe path used, from NCCL_DEBUG=INFO (p2p, shm, "
           "net_ib, net_socket, net_other, nvls; gloo for CPU ranks)"),
    Family("paths", "netmon_transport_mismatch", "counter", "", ("probe", "path", "reason"),
           "Probe runs whose transports contradicted the intended path, by reason"),
    # pairs: GPU pairs probed alone, judged against their path class
    Family("pairs", "netmon_link_busbw_bytes_per_second", "gauge", "bytes_per_second",
           ("probe", "size_bytes", "gpu", "peer_gpu", "path"),
           "busbw of one GPU pair probed alone (2 ranks)", "probes"),
    Family("pairs", "netmon_link_busbw_ratio", "gauge", "ratio", _PAIR,
           "A pair's busbw at its largest size over the median of its path class", "probes"),
    Family("pairs", "netmon_link_suspect", "gauge", "", _PAIR,
           "1 when the pair is low against its path class and neither GPU explains it"),
    Family("pairs", "netmon_link_suspect_sweeps", "gauge", "", _PAIR,
           "Sweeps in a row, of those that measured the pair, that named it suspect; 0 when the "
           "last did not (since the daemon started)"),
    Family("pairs", "netmon_link_measurement_timestamp_seconds", "gauge", "seconds", _PAIR,
           "When the pair was last measured (a sweep measures the pairs whose two GPUs are idle "
           "then; the others keep their last result)"),
    Family("pairs", "netmon_pair_skips", "counter", "", ("probe", "reason"),
           "GPU pairs a sweep did not measure, by reason (a GPU of the pair paused, held by "
           "another probe, or not idle)"),
    Family("pairs", "netmon_gpu_suspect", "gauge", "", ("probe", "gpu"),
           "1 when every pair of this GPU (or CPU rank) is low against its path class"),
    Family("pairs", "netmon_gpu_suspect_sweeps", "gauge", "", ("probe", "gpu"),
           "Sweeps in a row, of those that measured a pair of this GPU, that named the GPU "
           "suspect; 0 when the last did not (since the daemon started)"),
    Family("pairs", "netmon_gpu_measurement_timestamp_seconds", "gauge", "seconds",
           ("probe", "gpu"), "When a sweep last measured a pair of this GPU"),
    Family("pairs", "netmon_topology_link_info", "info", "", ("gpu", "peer_gpu", "path"),
           "1 for every GPU pair, with its path class as nvidia-smi topo -m shows it (NV18, PIX)"),
    # probes: what running the probes did and cost
    Family("probes", "netmon_probe_runs", "counter", "", ("probe",), "Probe runs started"),
    Family("probes", "netmon_probe_failures", "counter", "", ("probe", "reason"),
           "Probe runs that failed, by reason"),
    Family("probes", "netmon_probe_skips", "counter", "", ("probe", "reason"),
           "Scheduled probe runs not started, by reason"),
    Family("probes", "netmon_inconclusive_results", "counter", "", ("probe", "reason"),
           "Results neither judged nor learned, by reason (settling after start, disturbed by "
           "other work, noisy)"),
    Family("probes", "netmon_series_results", "counter", "", ("probe",),
           "Results of judged series, conclusive or not (the denominator of the disturbed "
           "share)"),
    Family("probes", "netmon_reference_resets", "counter", "", ("probe", "reason"),
           "Series that forgot their baseline and reference: operator (netmon rebaseline) or "
           "hardware (a replaced GPU, NIC or node)"),
    Family("probes", "netmon_probe_busy_seconds", "counter", "seconds", ("probe",),
           "Device-seconds held by probes (wall time x devices or CPU ranks): the cost of probing"),
    Family("probes", "netmon_probe_rank_cpu_seconds", "counter", "seconds", ("probe", "phase"),
           "CPU time of the probe's rank processes by phase of a run, summed over ranks (start: "
           "fork or exec to rendezvous; exit: done to reaped): what probing costs the CPUs"),
    Family("probes", "netmon_probe_last_success_timestamp_seconds", "gauge", "seconds", ("probe",),
           "When the probe last succeeded"),
    Family("probes", "netmon_probe_last_run_timestamp_seconds", "gauge", "seconds", ("probe",),
           "When the probe last ended, success or not"),
    Family("probes", "netmon_probe_duration_seconds", "gauge", "seconds", ("probe",),
           "Wall time of the last run"),
    Family("probes", "netmon_probe_peak_device_memory_bytes", "gauge", "bytes", ("probe",),
           "Peak device memory a rank allocated in the last run (torch allocator, nccl only)"),
    Family("probes", "netmon_probe_interval_seconds", "gauge", "seconds", ("probe",),
           "Configured probe interval"),
    # link_health: PCIe and NVLink as NVML reports them
    Family("link_health", "netmon_pcie_link_generation", "gauge", "", ("gpu",),
           "Current PCIe link generation", "nvml"),
    Family("link_health", "netmon_pcie_link_generation_max", "gauge", "", ("gpu",),
           "Highest PCIe generation this GPU and its slot allow together", "nvml"),
    Family("link_health", "netmon_pcie_link_width", "gauge", "", ("gpu",),
           "Current PCIe link width (lanes)", "nvml"),
    Family("link_health", "netmon_pcie_link_width_max", "gauge", "", ("gpu",),
           "Widest PCIe link this GPU and its slot allow together", "nvml"),
    Family("link_health", "netmon_pcie_link_downtrained", "gauge", "", ("gpu", "reason"),
           "1 when the PCIe link runs below its maximum: reason width (fewer lanes) at any time, "
           "reason generation only when read under load (idle GPUs lower it to save power)",
           "nvml"),
    Family("link_health", "netmon_pcie_replay_errors", "counter", "", ("gpu",),
           "PCIe replays since the GPU was last reset", "nvml"),
    Family("link_health", "netmon_nvlink_links", "gauge", "", ("gpu",),
           "NVLinks NVML reports for the GPU, active or not", "nvml"),
    Family("link_health", "netmon_nvlink_active_links", "gauge", "", ("gpu",),
           "NVLinks of the GPU that are active", "nvml"),
    Family("link_health", "netmon_nvlink_gpu_errors", "counter", "", ("gpu", "error"),
           "NVLink data-link errors since the last reset, summed over the GPU's links: replay, "
           "recovery, CRC flit, CRC data", "nvml"),
    Family("link_health", "netmon_nvlink_up", "gauge", "", ("gpu", "link"),
           "1 when the NVLink is active (link_telemetry.nvlink_detail: link)", "nvml"),
    Family("link_health", "netmon_nvlink_errors", "counter", "", ("gpu", "link", "error"),
           "NVLink data-link errors since the last reset: replay, recovery, CRC flit, CRC data "
           "(link_telemetry.nvlink_detail: link)", "nvml"),
    Family("link_health", "netmon_nvlink_throughput_bytes", "counter", "bytes",
           ("gpu", "direction"),
           "NVLink payload bytes over all links of the GPU (NVML counts KiB), direction tx or rx",
           "nvml"),
    Family("link_health", "netmon_link_health_read_timestamp_seconds", "gauge", "seconds", (),
           "When the link health metrics were read", "nvml"),
    Family("link_health", "netmon_link_health_under_load", "gauge", "", (),
           "1 if the link health metrics were read while probe traffic flowed, 0 if on idle links"),
    Family("link_health", "netmon_link_health_interval_seconds", "gauge", "seconds", (),
           "Configured seconds between link health reads (link_telemetry.interval)"),
    Family("link_health", "netmon_link_health_read_errors", "counter", "", (),
           "Scheduled link health reads that NVML could not answer"),
    Family("link_health", "netmon_pcie_link_load_read_timestamp_seconds", "gauge", "seconds", (),
           "When the PCIe links were last read under pcie-path probe traffic (the reading the "
           "generation is judged on)", "nvml"),
    Family("link_health", "netmon_pcie_link_load_interval_seconds", "gauge", "seconds", (),
           "Configured interval of the pcie-path probes whose traffic the PCIe links are read "
           "under (the shortest, if several)"),
    # group: node pairs across a group, and the group itself
    Family("group", "netmon_peer_busbw_bytes_per_second", "gauge", "bytes_per_second",
           ("probe", "size_bytes", "peer"),
           "busbw between this node and `peer` (a node_pairs probe, 2-node world), exported by the"
           " node that hosted rank 0", "probes"),
    Family("group", "netmon_peer_suspect", "gauge", "", ("probe", "peer"),
           "1 when every node pair of this member is low against the median of all node pairs "
           "(exported by the leader)"),
    Family("group", "netmon_peer_suspect_sweeps", "gauge", "", ("probe", "peer"),
           "Node-pair sweeps in a row, of those this leader judged that measured the member, that "
           "named it suspect; 0 when the last did not"),
    Family("group", "netmon_peer_measurement_timestamp_seconds", "gauge", "seconds",
           ("probe", "peer"), "When a node-pair sweep this leader judged last measured the member"),
    Family("group", "netmon_peer_link_suspect", "gauge", "", ("probe", "member", "peer"),
           "1 for a node pair low against the median of all node pairs that neither node explains "
           "(exported by the leader)"),
    Family("group", "netmon_peer_link_suspect_sweeps", "gauge", "", ("probe", "member", "peer"),
           "Node-pair sweeps in a row, of those this leader judged that measured the node pair, "
           "that named it suspect; 0 when the last did not"),
    Family("group", "netmon_peer_link_measurement_timestamp_seconds", "gauge", "seconds",
           ("probe", "member", "peer"),
           "When a node-pair sweep this leader judged last measured the node pair"),
    Family("group", "netmon_group_members", "gauge", "", ("group",),
           "Group members this node reaches now, itself included"),
    Family("group", "netmon_group_member_up", "gauge", "", ("group", "member"),
           "1 when this node reaches the member's store agent"),
    Family("group", "netmon_group_leader", "gauge", "", ("group", "leader"),
           "1 for the member this node follows as leader (the lowest-named reachable member)"),
    Family("group", "netmon_group_messages_rejected", "counter", "", ("group", "member"),
           "Group messages that failed authentication (wrong secret, tampered, replayed or stale),"
           " by the member they claimed to come from"),
    Family("group", "netmon_group_store_refused", "counter", "", ("group", "reason"),
           "Connections and writes this member's store refused before storing anything, by reason"
           " (bad_handshake, handshake_timeout, oversize, bad_frame, evicted, busy, idle,"
           " value_too_large, store_full, address_full)"),
    Family("group", "netmon_group_results_refused", "counter", "", ("group", "member", "reason"),
           "Node-pair results this leader refused as not signed by the member they are from, by"
           " reason (unsigned, wrong_member, bad_signature)"),
    # sweep: this node's share of the last cluster sweep delivered to it (labels bounded by the
    # rails x peers of one sweep: netmon.sweep.delivery.node_report.MAX_RESULTS)
    Family("sweep", "netmon_sweep_busbw_bytes_per_second", "gauge", "bytes_per_second",
           ("peer", "rail"), "busbw of this node's rail with `peer`, latest judged result of the "
           "last sweep", "sweep"),
    Family("sweep", "netmon_sweep_busbw_ratio", "gauge", "ratio", ("peer", "rail"),
           "That busbw over the expected level the sweep judged the pair by", "sweep"),
    Family("sweep", "netmon_sweep_measurement_timestamp_seconds", "gauge", "seconds",
           ("peer", "rail"), "When the sweep measured that busbw", "sweep"),
    Family("sweep", "netmon_sweep_pair_result", "gauge", "", ("peer", "rail", "outcome"),
           "1 for how the pair came out in the last sweep: pass or fail (judged), or preempted, "
           "busy, error or timeout (not measured, rail 0)", "sweep"),
    Family("sweep", "netmon_sweep_suspect", "gauge", "", ("peer",),
           "1 when the last sweep named this node: peer empty when named alone, one series per "
           "other end when a path was named; 0 (peer empty) when it did not", "sweep"),
    Family("sweep", "netmon_sweep_suspect_sweeps", "gauge", "", (),
           "Sweeps in a row, as delivered here, that named this node; 0 when the last did not",
           "sweep"),
    Family("sweep", "netmon_sweep_suspect_onsets", "gauge", "", (),
           "Of the last 12 sweeps delivered here, how many named this node when the one before "
           "had not (the first of them counts when it named it): a fault that comes and goes",
           "sweep"),
    Family("sweep", "netmon_sweep_last_timestamp_seconds", "gauge", "seconds", (),
           "When the last sweep delivered here finished", "sweep"),
    Family("sweep", "netmon_sweep_reports", "counter", "", ("outcome",),
           "Sweep reports POSTed to /sweep, by outcome: accepted, malformed (400) or refused "
           "(403: another secret, another node's, stale or replayed)"),
    # jobs: the jobs' own collectives, read from NCCL Inspector's files (inspector.dir)
    Family("jobs", "netmon_jobs_collectives", "counter", "", ("path",),
           "Collectives read from the jobs' NCCL Inspector dumps (the latest of each communicator "
           "and rank per dump: a sample), by path: node (within this node) or nodes (across)"),
    Family("jobs", "netmon_jobs_shape_overflow", "counter", "", (),
           "Collectives of shapes past inspector.max_shapes: read, not exported"),
    Family("jobs", "netmon_jobs_shapes", "gauge", "", (),
           "Shapes (op, size bucket, ranks, path) exported as probe=\"jobs\" series"),
    Family("jobs", "netmon_jobs_time_covered_ratio", "gauge", "ratio", (),
           "Share of the last read's collective time in the exported shapes"),
    Family("jobs", "netmon_jobs_rejected", "counter", "", ("reason",),
           "Lines, files and directories of the Inspector output not taken, by reason"),
    Family("jobs", "netmon_jobs_directories_removed", "counter", "", (),
           "Job directories removed after their job ended (inspector.grace, "
           "inspector.stale_after)"),
    Family("jobs", "netmon_jobs_directories", "gauge", "", ("state",),
           "Job directories under inspector.dir at their last read, by state: live, removable "
           "(due for removal but kept: the root lost its marker, or removing failed) or foreign "
           "(not netmon's by its name or contents: never removed)"),
    Family("jobs", "netmon_jobs_unconfirmed", "counter", "", (),
           "Windows in which the baseline called a node shape degraded but no second owner's "
           "job nor an idle probe of the same shape agreed: shown healthy (docs/INSPECTOR.md)"),
    Family("jobs", "netmon_jobs_last_read_timestamp_seconds", "gauge", "seconds", (),
           "When the Inspector output was last read"),
    Family("jobs", "netmon_jobs_probe_ratio", "gauge", "ratio", ("op", "size_bytes", "ranks"),
           "A node shape's latest jobs busbw over the reference (else the baseline) of the idle "
           "probe series of the same op, size and ranks: the jobs' traffic against the yardstick"),
    # daemon: the process itself
    Family("daemon", "netmon_paused", "gauge", "", (), "1 while the operator pause file exists"),
    Family("daemon", "netmon_simulated", "gauge", "", (),
           "1 when the daemon runs on a simulated GPU node (--simulate): ranks run on gloo, "
           "NVML answers from a file, and no figure measures a GPU"),
    Family("daemon", "netmon_build_info", "info", "", ("version", "torch", "nccl"),
           "netmon, torch and NCCL versions"),
    Family("daemon", "netmon_node_info", "info", "", ("gpu_model",),
           "1, with the model of the node's probed GPUs as NVML names it (cpu on CPU ranks, "
           "unknown where NVML cannot say), read once at start: a label to join on"),
    Family("daemon", "netmon_config_last_reload_successful", "gauge", "", (),
           "1 if the last configuration reload (SIGHUP) succeeded"),
    Family("daemon", "netmon_config_reload_failures", "counter", "", (),
           "Configuration reloads refused (the old one stayed)"),
    Family("daemon", "netmon_config_last_reload_success_timestamp_seconds", "gauge", "seconds", (),
           "When the running configuration was loaded"),
    Family("daemon", "netmon_start_time_seconds", "gauge", "seconds", (),
           "When the daemon started"),
    Family("daemon", "netmon_clock_steps", "counter", "", (),
           "Steps of the wall clock of a second or more, back or forward, that the schedule "
           "followed: every job kept its wait"),
    Family("daemon", "netmon_baseline_restored", "gauge", "", (),
           "1 when this start restored baselines from the state file; 0 on a start without "
           "usable state (the log says why)"),
    Family("daemon", "netmon_state_errors", "counter", "", ("reason",),
           "Baseline state files found at this start but unusable, by reason (corrupt, "
           "unreadable, an unsupported version): set aside and never taken for a first start"),
    Family("daemon", "netmon_state_write_errors", "counter", "", (),
           "Failed saves of the baseline state file"),
    Family("daemon", "netmon_rank_starts", "counter", "", ("method",),
           "Rank processes started: forked by the rank zygote (fork) or spawned as a new "
           "interpreter (spawn)"),
    Family("daemon", "netmon_rank_fork_fallbacks", "counter", "", ("reason",),
           "Probes whose ranks were spawned although the rank zygote was configured, by reason"),
    Family("daemon", "netmon_zygote_starts", "counter", "", (),
           "Starts of the rank zygote: the first at the first probe, then one after each death"),
    # scrape: whether each collector built its families
    Family("scrape", "netmon_scrape_collector_success", "gauge", "", ("collector",),
           "1 if the collector built its families from the current results, 0 if it failed (its "
           "families are left out; the log has the error)"),
)
# fmt: on

BY_NAME: Mapping[str, Family] = {family.name: family for family in CATALOGUE}
