"""The whole dashboard: its variables and annotations, and the rows in their order."""

from __future__ import annotations

import json

from .bandwidth import bandwidth_row
from .builders import DS, NODE, SCOPE, Json, Layout
from .groups import groups_row
from .jobs import jobs_row
from .links import link_health_row, paths_row
from .overview import overview_row
from .pairs import pairs_row
from .probes import probe_health_row, probing_cost_row
from .sweeps import sweeps_row

UID = "netmon-interconnects"
# Top to bottom; a panel's id is its place in this order, so moving a row renumbers the panels.
ROWS = (
    overview_row,
    bandwidth_row,
    paths_row,
    pairs_row,
    link_health_row,
    probe_health_row,
    probing_cost_row,
    groups_row,
    sweeps_row,
    jobs_row,
)


def panels() -> list[Json]:
    layout = Layout()
    for row in ROWS:
        row(layout)
    return layout.panels


def query_variable(name: str, label: str, query: str, all_value: str = ".+") -> Json:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"netmon-{name}"},
        "definition": query,
        "refresh": 2,  # on time range change: nodes come and go
        "includeAll": True,
        "multi": True,
        "allValue": all_value,
        "current": {},
        "sort": 3,  # numerical, so GPU 10 follows GPU 9
        "regex": "",
        "hide": 0,
    }


def dashboard() -> Json:
    return {
        "title": "netmon: GPU interconnects",
        "uid": UID,
        "description": "GPU interconnect bandwidth, latency and link health from netmon "
        "(deploy/prometheus/netmon-rules.yaml for the recording rules and alerts).",
        "tags": ["netmon", "gpu", "nccl", "interconnect"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "1m",
        "time": {"from": "now-6h", "to": "now"},
        "links": [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                },
                {
                    "name": "netmon paused",
                    "datasource": DS,
                    "enable": True,
                    "iconColor": "blue",
                    "expr": f"netmon_paused{{{NODE}}} == 1",
                    "step": "60s",
                    "titleFormat": "paused",
                    "textFormat": "{{instance}}",
                    "tagKeys": "instance",
                },
            ]
        },
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "refresh": 1,
                    "regex": "",
                    "hide": 0,
                },
                # cluster is a target label a scrape may not set: All is `.*`, which also
                # matches series without it.
                query_variable(
                    "cluster", "Cluster", "label_values(netmon_build_info, cluster)", ".*"
                ),
                query_variable(
                    "job", "Job", 'label_values(netmon_build_info{cluster=~"$cluster"}, job)'
                ),
                query_variable(
                    "instance", "Node", f"label_values(netmon_build_info{{{SCOPE}}}, instance)"
                ),
                query_variable(
                    "gpu",
                    "GPU",
                    'label_values({__name__=~"netmon_pcie_link_width|netmon_link_busbw_ratio",'
                    f" {NODE}}}, gpu)",
                ),
                query_variable(
                    "probe",
                    "Probe",
                    f"label_values(netmon_probe_interval_seconds{{{NODE}}}, probe)",
                ),
            ]
        },
        "panels": panels(),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"
