"""Every query of the Grafana dashboard, run by a real Prometheus that scrapes a real daemon.

The daemon runs gloo probes on CPU ranks, one of them made to fail and one a pairs probe, and
Prometheus loads the project's recording and alerting rules. Queries over families that need GPUs
or node groups are listed by name with the reason; they must evaluate without error but may be
empty. Every other query must return data.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netmon.serve.sweep_inbox import node_names
from netmon.sweep.delivery.deliver import deliver
from tests.conftest import wait_for
from tests.daemon_harness import DaemonProcess, fast_config, secret_file
from tests.inspector_files import Comm, marked_root, prom_dump
from tests.prometheus_harness import Prometheus
from tests.test_sweep_inbox import SECRET, SECRET_TEXT, report

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "grafana" / "dashboards" / "netmon.json"
RULES = ROOT / "deploy" / "prometheus" / "netmon-rules.yaml"

# What Grafana puts in for the variables and interval macros when everything is selected.
SUBSTITUTIONS = {
    "${datasource}": "",
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "$cluster": ".*",
    "$job": ".+",
    "$instance": ".+",
    "$gpu": ".+",
    "$probe": ".+",
}

_NVML = "NVML link health: read only on GPU nodes"
_NCCL_PATHS = "path variants (pcie: NCCL_P2P_DISABLE=1) are NCCL settings; gloo has one path"
_GROUPS = "node groups span several daemons; this test runs one"

# (panel title, refId) -> why the query is empty without GPUs or node groups.
NEEDS_GPUS_OR_GROUPS: dict[tuple[str, str], str] = {
    ("NVLink vs PCIe busbw", "B"): _NCCL_PATHS,
    ("NVLink / PCIe busbw ratio", "A"): _NCCL_PATHS,
    ("Transport mismatches", "A"): "netmon_transport_mismatch_total appears with the first "
    "NCCL transport that contradicts its path; gloo ranks report transport gloo only",
    ("Topology", "A"): "netmon_topology_link_info comes from NVML or a topology file",
    ("PCIe link: width and generation against max", "A"): _NVML,
    ("PCIe link: width and generation against max", "B"): _NVML,
    ("PCIe link: width and generation against max", "C"): _NVML,
    ("PCIe link: width and generation against max", "D"): _NVML,
    ("PCIe downtrained under load", "A"): _NVML,
    ("PCIe replay errors", "A"): _NVML,
    ("NVLink errors", "A"): _NVML,
    ("NVLinks up per GPU", "A"): _NVML,
    ("NVLink throughput", "A"): _NVML,
    ("Link health: age of the reading", "A"): _NVML,
    ("Link health: age of the reading", "B"): _NVML,
    ("Peak device memory per rank", "A"): "torch's CUDA allocator: nccl probes only",
    ("Node-pair busbw", "A"): _GROUPS,
    ("Suspect peers", "A"): _GROUPS,
    ("Group members up", "A"): _GROUPS,
    ("Groups and leaders", "A"): _GROUPS,
    ("Groups and leaders", "B"): _GROUPS,
    ("Group messages rejected", "A"): _GROUPS,
    ("Jobs across nodes: nodes against the fleet", "A"): "the fleet's median needs 4 nodes' "
    "jobs across nodes (NCCL Inspector); this test runs one daemon",
}

# Families that exist only with GPUs or node groups: a query over nothing else must be listed above.
GPU_OR_GROUP_FAMILIES = {
    "netmon_nvlink_pcie_busbw_ratio",
    "netmon_transport_mismatch_total",
    "netmon_topology_link_info",
    "netmon_pcie_link_generation",
    "netmon_pcie_link_generation_max",
    "netmon_pcie_link_width",
    "netmon_pcie_link_width_max",
    "netmon_pcie_link_downtrained",
    "netmon_pcie_replay_errors_total",
    "netmon_nvlink_up",
    "netmon_nvlink_errors_total",
    "netmon_nvlink_active_links",
    "netmon_nvlink_gpu_errors_total",
    "netmon_link_health_read_timestamp_seconds",
    "netmon_link_health_interval_seconds",
    "netmon_nvlink_throughput_bytes_total",
    "netmon_probe_peak_device_memory_bytes",
    "netmon_peer_busbw_bytes_per_second",
    "netmon_peer_suspect",
    "netmon_group_members",
    "netmon_group_member_up",
    "netmon_group_leader",
    "netmon_group_messages_rejected_total",
}

_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


@dataclass(frozen=True)
class Query:
    panel: str
    ref: str
    expr: str  # as written in the dashboard
    instant: bool

    @property
    def key(self) -> tuple[str, str]:
        return (self.panel, self.ref)

    def promql(self) -> str:
        """The expression Grafana sends with every variable set to All."""
        text = self.expr
        for name, value in SUBSTITUTIONS.items():
            text = text.replace(name, value)
        match = _LABEL_VALUES.match(text)
        if match:  # a variable query: Grafana lists the label's values of matching series
            text = f"count by ({match['label']}) ({match['selector']})"
        assert "$" not in text, f"{self.key}: unsubstituted variable in {text}"
        return text


def load_dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def dashboard_queries(dashboard: dict[str, Any]) -> list[Query]:
    """Every PromQL query: panel targets, variable queries and annotation queries."""
    queries = []
    for panel in all_panels(dashboard["panels"]):
        for t in panel.get("targets", []):
            queries.append(Query(panel["title"], t["refId"], t["expr"], bool(t.get("instant"))))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(
                Query(f"variable {variable['name']}", "query", variable["definition"], True)
            )
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation:
            queries.append(
                Query(f"annotation {annotation['name']}", "expr", annotation["expr"], False)
            )
    return queries


def families_in(expr: str) -> set[str]:
    return set(re.findall(r"\bnetmon_[a-z_]+\b", expr))


class Api:
    def __init__(self, prometheus: Prometheus) -> None:
        self.base = f"http://127.0.0.1:{prometheus.port}/api/v1/"

    def get(self, path: str, **params: str) -> Any:
        url = self.base + path + "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=20) as response:
                document = json.load(response)
        except urllib.error.HTTPError as exc:  # 400 and 422 carry the PromQL error
            raise AssertionError(f"{path} {params}: {exc.code} {exc.read().decode()}") from None
        assert document["status"] == "success", document
        return document["data"]

    def instant(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("query", query=expr)["result"]
        return result

    def run(self, query: Query, start: float) -> list[dict[str, Any]]:
        if query.instant:
            return self.instant(query.promql())
        data = self.get(
            "query_range",
            query=query.promql(),
            start=f"{start:.3f}",
            end=f"{time.time():.3f}",
            step="1",
        )
        result: list[dict[str, Any]] = data["result"]
        return result


def _eventually(query: Callable[[], list[dict[str, Any]]], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not query():
        if time.monotonic() > deadline:
            return False
        time.sleep(1)
    return True


def _raw_families(api: Api, query: Query) -> list[str]:
    return [
        f"{item['metric']} = {item['value'][1]}"
        for family in sorted(families_in(query.expr))
        for item in api.instant(family)
    ][:20]


def test_the_gpu_list_names_real_queries_and_every_gpu_query_is_in_it() -> None:
    queries = {q.key: q for q in dashboard_queries(load_dashboard())}
    stale = sorted(set(NEEDS_GPUS_OR_GROUPS) - set(queries))
    assert not stale, f"listed but not in the dashboard: {stale}"
    unlisted = sorted(
        key
        for key, q in queries.items()
        if families_in(q.expr) <= GPU_OR_GROUP_FAMILIES
        and families_in(q.expr)
        and key not in NEEDS_GPUS_OR_GROUPS
    )
    assert not unlisted, f"only GPU or group families, but not listed: {unlisted}"


def test_every_dashboard_query_runs_against_a_real_daemon_and_prometheus(tmp_path: Path) -> None:
    fast = {"iters": 3, "warmup": 1}
    probes = [
        {"name": "large", "sizes": [8, "64K"], "interval": "5s", "min_busbw": "1K", **fast},
        # Times out while its ranks start: failures for the failure panels and alerts.
        {"name": "broken", "sizes": ["1K"], "interval": "2s", "timeout": "0.05s", **fast},
        # Three CPU rank slots: three 2-rank pair worlds of one path class, so ratios exist.
        {"name": "pairs", "kind": "pairs", "sizes": ["64K"], "interval": "60s", "ranks": 3, **fast},
    ]
    # Every size judged, so that the low-bound column of "Verdicts, series by series" has data;
    # a short window, and no result set aside for a busy host, so that the reference exists
    # soon on a loaded CI host too; a short long level, for "Node level against its fleet".
    policy = {
        "min_samples": 2,
        "window": 3,
        "latency_bound_below": 0,
        "max_foreign_cpu": 1.0,
        "long_window": 3,
        "clear_window": 3,
    }
    # A sweep secret, so that the sweep panels have a report to show (delivered below).
    sweep = {"secret_file": secret_file(tmp_path / "secrets", SECRET_TEXT, "sweep.secret")}
    # A job's NCCL Inspector dumps, rewritten every second, for the "Jobs' own traffic" row:
    # one of its shapes is the "large" probe's (all_reduce 64 KiB on 2 ranks), for the yardstick.
    inspector = {
        "dir": str(marked_root(tmp_path / "inspector")),
        "interval": 1,
        "window": 1,
        "min_collectives": 1,
    }
    config = fast_config(tmp_path, probes=probes, baseline=policy, sweep=sweep, inspector=inspector)
    job = JobDumps(tmp_path / "inspector")
    daemon = DaemonProcess(tmp_path, config)
    prometheus = None
    try:
        me = node_names()[0]
        sent = report(node=me, at=time.time(), suspect=True, peers=("n2",))
        assert deliver([sent], {me: "127.0.0.1"}, SECRET, port=daemon.port) == {me: "ok"}
        prometheus = Prometheus(tmp_path, [f"127.0.0.1:{daemon.port}"], rule_files=(RULES,))
        api = Api(prometheus)
        start = time.time()

        def present(expr: str) -> bool:
            return bool(api.instant(expr))

        def shows(expr: str) -> Callable[[], bool]:
            return lambda: present(expr)

        for expr in (
            'netmon_busbw_baseline_ratio{probe="large"}',
            'netmon_busbw_reference_bytes_per_second{probe="large"}',
            'netmon_link_busbw_ratio{probe="pairs"}',
            'instance_probe:netmon_probe_failures:increase1h{probe="broken"} > 2.5',
            'ALERTS{alertname="NetmonProbeFailing", probe="broken"}',
            'ALERTS{alertname="NetmonProbeStale", probe="broken"}',
            'netmon_busbw_reference_bytes_per_second{probe="jobs"}',
            "netmon_jobs_probe_ratio",
        ):
            wait_for(shows(expr), 120, expr, poll=0.5)
        # Timing verdicts (stale, degraded, a suspect pair) depend on this machine's load; these
        # do not: the healthy probe neither fails nor falls under its 1 KB/s minimum.
        healthy = api.instant(
            'ALERTS{alertname=~"NetmonProbeFailing|NetmonBusbwBelowThreshold", probe="large"}'
            ' or ALERTS{alertname="NetmonTargetDown"}'
        )
        assert healthy == [], f"alerts for the healthy probe: {healthy}"

        rules = [r for g in api.get("rules")["groups"] for r in g["rules"]]
        assert len(rules) >= 14
        broken_rules = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
        assert not broken_rules, broken_rules

        # Pause the daemon until it skips a run for it, for the skip and pause panels.
        pause = Path(config["pause_file"])
        pause.touch()
        try:
            wait_for(
                lambda: (
                    (daemon.value("netmon_probe_skips_total", probe="large", reason="paused") or 0)
                    > 0
                ),
                60,
                "a run skipped while paused",
                poll=0.2,
            )
            wait_for(shows("netmon_paused == 1"), 30, "netmon_paused in Prometheus")
        finally:
            pause.unlink()
        wait_for(
            lambda: (
                present('increase(netmon_probe_skips_total{reason="paused"}[1m]) > 0')
                and present("netmon_paused == 0")
            ),
            30,
            "the pause skip and the end of the pause in Prometheus",
            poll=0.5,
        )

        empty, errors = [], []
        for query in dashboard_queries(load_dashboard()):
            try:
                result = api.run(query, start)
            except AssertionError as exc:
                errors.append(f"{query.key}: {exc}")
                continue
            if not result and query.key not in NEEDS_GPUS_OR_GROUPS:
                empty.append(query)
        assert not errors, "\n".join(errors)
        # Under a loaded CI host one query came back empty while its data had been seen a moment
        # before; ask again for a while, and say what Prometheus holds if it stays empty.
        still_empty = [
            q for q in empty if not _eventually(functools.partial(api.run, q, start), 30)
        ]
        assert not still_empty, "no data:\n" + "\n".join(
            f"{q.key}: {q.promql()}\n  raw: {_raw_families(api, q)}" for q in still_empty
        )
    finally:
        job.stop()
        if prometheus is not None:
            prometheus.stop()
        assert daemon.stop() == 0


class JobDumps:
    """A job writing Inspector dumps every second (until stop()), each with a line the daemon
    refuses (netmon_jobs_rejected_total, counted at every read of a changed file), and a
    symlink (counted once while it stays)."""

    COMMS = (
        Comm(0x51, "AllReduce", 64 << 10, 2, 1, (0, 1)),
        Comm(0x52, "ReduceScatter", 1 << 20, 4, 2, (0, 1), 0),
    )

    def __init__(self, root: Path) -> None:
        (root / "1").mkdir(parents=True)
        (root / "1" / "elsewhere.prom").symlink_to("/etc/hostname")
        self.root = root
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._write, daemon=True)
        self.thread.start()

    def _write(self) -> None:
        n = 0
        while not self.stopping.wait(1.0):
            n += 1
            prom_dump(self.root / "1", self.COMMS, lambda _c, _g: 2.0, time.time(), n)
            (self.root / "1" / "bad.prom").write_bytes(b"not_utf8 \xff %d\n" % n)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)
