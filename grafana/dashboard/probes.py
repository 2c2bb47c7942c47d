"""The rows on the probes themselves: whether they run and succeed, and what probing costs."""

from __future__ import annotations

from .builders import (
    BLUE,
    GREEN,
    NODE,
    PROBE,
    RED,
    YELLOW,
    Layout,
    dashed,
    reasons_bars,
    stat,
    state_mapping,
    state_timeline,
    target,
    thresholds,
    timeseries,
)


def probe_health_row(layout: Layout) -> None:
    """Probe health: runs, failures, skips, staleness, pauses."""
    layout.row("Probe health")
    layout.add(
        timeseries(
            "Probe runs vs failures",
            "Runs started and runs failed per interval. Failures are counted when a run ends, "
            "runs when it starts.",
            [
                target(
                    "sum by (instance, probe) "
                    f"(increase(netmon_probe_runs_total{{{PROBE}}}[$__rate_interval]))",
                    "runs {{instance}} {{probe}}",
                ),
                target(
                    "sum by (instance, probe) "
                    f"(increase(netmon_probe_failures_total{{{PROBE}}}[$__rate_interval]))",
                    "failures {{instance}} {{probe}}",
                    ref="B",
                ),
            ],
            "none",
            overrides=[
                {
                    "matcher": {"id": "byFrameRefID", "options": "B"},
                    "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": RED}}],
                }
            ],
            calcs=("sum",),
        ),
        w=12,
        h=8,
    )
    layout.add(
        stat(
            "Failure ratio, last hour",
            "Failed runs / runs over one hour, not counting paused, preempted and shutdown "
            "(recording rule instance_probe:netmon_probe_failures:ratio1h).",
            [
                target(
                    f"instance_probe:netmon_probe_failures:ratio1h{{{PROBE}}}",
                    "{{instance}} {{probe}}",
                    instant=True,
                )
            ],
            thresholds((None, GREEN), (0.05, YELLOW), (0.25, RED)),
            unit="percentunit",
        ),
        w=12,
        h=8,
    )
    layout.add(
        reasons_bars(
            "Failures by reason",
            "Failed runs per interval by reason (docs/METRICS.md lists them).",
            "netmon_probe_failures_total",
        ),
        w=12,
        h=8,
    )
    layout.add(
        reasons_bars(
            "Skips by reason",
            "Runs that were due but not started: paused, GPUs busy, previous run still going.",
            "netmon_probe_skips_total",
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "Staleness: time since last success",
            "Seconds since each probe last succeeded; dashed: 3 intervals, where "
            "NetmonProbeStale starts counting.",
            [
                target(
                    f"time() - netmon_probe_last_success_timestamp_seconds{{{PROBE}}}",
                    "{{instance}} {{probe}}",
                ),
                target(
                    f"3 * netmon_probe_interval_seconds{{{PROBE}}}",
                    "3 intervals {{instance}} {{probe}}",
                    ref="B",
                ),
            ],
            "s",
            overrides=[dashed("B", "text")],
        ),
        w=12,
        h=8,
    )
    layout.add(
        state_timeline(
            "Paused",
            "netmon_paused: the pause file exists (Slurm prolog, or an operator). No probe "
            "runs then.",
            [target(f"netmon_paused{{{NODE}}}", "{{instance}}")],
            state_mapping(("probing", GREEN), ("paused", BLUE)),
            thresholds((None, GREEN), (1, BLUE)),
        ),
        w=12,
        h=8,
    )


def probing_cost_row(layout: Layout) -> None:
    """Cost of probing: devices held, duration, peak device memory."""
    layout.row("Cost of probing")
    layout.add(
        timeseries(
            "Devices held by probes",
            "Average number of GPUs (or CPU ranks) busy with probes: the rate of "
            "netmon_probe_busy_seconds_total.",
            [
                target(
                    "sum by (instance, probe) "
                    f"(rate(netmon_probe_busy_seconds_total{{{PROBE}}}[$__rate_interval]))",
                    "{{instance}} {{probe}}",
                )
            ],
            "none",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "Probe duration",
            "Wall time of each probe's last run, process start to last reap.",
            [target(f"netmon_probe_duration_seconds{{{PROBE}}}", "{{instance}} {{probe}}")],
            "s",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "Peak device memory per rank",
            "Largest GPU memory a rank allocated in the last run (nccl probes).",
            [target(f"netmon_probe_peak_device_memory_bytes{{{PROBE}}}", "{{instance}} {{probe}}")],
            "bytes",
        ),
        w=8,
        h=8,
    )
