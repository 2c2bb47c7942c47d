"""The rows on the paths between GPUs: NVLink against PCIe, and the links' health from NVML."""

from __future__ import annotations

from .builders import (
    GPU,
    GREEN,
    NODE,
    PROBE,
    RED,
    Layout,
    dashed,
    hide_columns,
    increase_bars,
    state_mapping,
    state_timeline,
    table,
    target,
    thresholds,
    timeseries,
)


def paths_row(layout: Layout) -> None:
    """NVLink and PCIe paths: the default path against the pcie variant, and the transport."""
    layout.row("NVLink and PCIe paths")
    layout.add(
        timeseries(
            "NVLink vs PCIe busbw",
            'The default path (NVLink where GPUs have it) against the "pcie" path variant '
            "(NCCL_P2P_DISABLE=1: GPU, PCIe, host memory, PCIe, GPU).",
            [
                target(
                    f'netmon_busbw_bytes_per_second{{{PROBE}, path="default"}}',
                    "default {{instance}} {{probe}} {{op}} {{size_bytes}} B",
                ),
                target(
                    f'netmon_busbw_bytes_per_second{{{PROBE}, path="pcie"}}',
                    "pcie {{instance}} {{probe}} {{op}} {{size_bytes}} B",
                    ref="B",
                ),
            ],
            "Bps",
            overrides=[dashed("B", "orange")],
        ),
        w=12,
        h=8,
    )
    layout.add(
        timeseries(
            "NVLink / PCIe busbw ratio",
            "busbw of the default path over the pcie path; about 10x on 8-GPU NVLink boards. "
            "A ratio that falls toward 1 means NVLink traffic is going over PCIe.",
            [
                target(
                    f"netmon_nvlink_pcie_busbw_ratio{{{PROBE}}}",
                    "{{instance}} {{probe}} {{op}} {{size_bytes}} B x{{ranks}}",
                )
            ],
            "none",
        ),
        w=12,
        h=8,
    )
    layout.add(
        table(
            "Transport in use",
            "The transport NCCL reported (NCCL_DEBUG=INFO) for each probe and path.",
            [target(f"netmon_transport_info{{{PROBE}}}", instant=True, table=True)],
            [hide_columns("Value")],
        ),
        w=12,
        h=7,
    )
    layout.add(
        increase_bars(
            "Transport mismatches",
            "Runs whose transport differed from the one their path intends, by reason.",
            [
                target(
                    "sum by (instance, probe, path, reason) "
                    f"(increase(netmon_transport_mismatch_total{{{PROBE}}}[$__rate_interval]))",
                    "{{instance}} {{probe}} {{path}} {{reason}}",
                )
            ],
        ),
        w=12,
        h=7,
    )


def link_health_row(layout: Layout) -> None:
    """PCIe and NVLink health: link width and generation, error counters, links up."""
    layout.row("PCIe and NVLink health")
    layout.add(
        table(
            "PCIe link: width and generation against max",
            "Current against maximum link width and generation per GPU. An idle GPU lowers "
            "its generation to save power; a lower width is always physical.",
            [
                target(f"netmon_pcie_link_width{{{GPU}}}", ref="A", instant=True, table=True),
                target(f"netmon_pcie_link_width_max{{{GPU}}}", ref="B", instant=True, table=True),
                target(f"netmon_pcie_link_generation{{{GPU}}}", ref="C", instant=True, table=True),
                target(
                    f"netmon_pcie_link_generation_max{{{GPU}}}",
                    ref="D",
                    instant=True,
                    table=True,
                ),
            ],
            [
                {"id": "merge", "options": {}},
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True, "job": True},
                        "renameByName": {
                            "Value #A": "width",
                            "Value #B": "max width",
                            "Value #C": "generation",
                            "Value #D": "max generation",
                        },
                    },
                },
            ],
        ),
        w=12,
        h=8,
    )
    layout.add(
        state_timeline(
            "PCIe downtrained under load",
            "netmon_pcie_link_downtrained: 1 when a reading taken while traffic flows shows "
            "the link under its maximum.",
            [
                target(
                    f"netmon_pcie_link_downtrained{{{GPU}}}", "{{instance}} GPU{{gpu}} {{reason}}"
                )
            ],
            state_mapping(("full", GREEN), ("downtrained", RED)),
            thresholds((None, GREEN), (1, RED)),
        ),
        w=12,
        h=8,
    )
    layout.add(
        increase_bars(
            "PCIe replay errors",
            "PCIe replays per interval: a noisy link retransmitting.",
            [
                target(
                    f"sum by (instance, gpu) "
                    f"(increase(netmon_pcie_replay_errors_total{{{GPU}}}[$__rate_interval]))",
                    "{{instance}} GPU{{gpu}}",
                )
            ],
        ),
        w=8,
        h=8,
    )
    layout.add(
        increase_bars(
            "NVLink errors",
            "NVLink error counters per interval, summed over each GPU's links, by kind "
            "(replay, recovery, CRC flit, CRC data). Healthy links stay at zero.",
            [
                target(
                    "sum by (instance, gpu, error) "
                    f"(increase(netmon_nvlink_gpu_errors_total{{{GPU}}}[$__rate_interval]))",
                    "{{instance}} GPU{{gpu}} {{error}}",
                )
            ],
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "NVLinks up per GPU",
            "Active NVLinks per GPU, read every link_telemetry.interval whether or not jobs "
            "run; a drop is a link that went down.",
            [
                target(
                    f"netmon_nvlink_active_links{{{GPU}}}",
                    "{{instance}} GPU{{gpu}}",
                )
            ],
            "none",
        ),
        w=8,
        h=8,
    )
    layout.add(
        timeseries(
            "NVLink throughput",
            "Bytes over NVLink per second, by GPU and direction: probe and workload traffic.",
            [
                target(
                    "sum by (instance, gpu, direction) "
                    f"(rate(netmon_nvlink_throughput_bytes_total{{{GPU}}}[$__rate_interval]))",
                    "{{instance}} GPU{{gpu}} {{direction}}",
                )
            ],
            "Bps",
        ),
        w=12,
        h=7,
    )
    layout.add(
        timeseries(
            "Link health: age of the reading",
            "Seconds since netmon last read NVLink and PCIe health from NVML; dashed: 3 "
            "reading intervals, past which NetmonLinkHealthStale fires.",
            [
                target(
                    f"time() - netmon_link_health_read_timestamp_seconds{{{NODE}}}",
                    "{{instance}}",
                    ref="A",
                ),
                target(
                    f"3 * netmon_link_health_interval_seconds{{{NODE}}}",
                    "limit {{instance}}",
                    ref="B",
                ),
            ],
            "s",
            overrides=[dashed("B", "red")],
        ),
        w=12,
        h=7,
    )
