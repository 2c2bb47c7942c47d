"""daemon_bench.py, part 2: /metrics of an 8-GPU node, served under a keep-alive loopback load.

netmon's MetricsServer serves the node's snapshot in a spawned process while threads of this one
load it at each CONCURRENCY, rendered once per snapshot (as the daemon serves it) and at every
scrape; generate_latest is also timed in-process, and so is the exporter's own pair model.
"""

from __future__ import annotations

import http.client
import math
import multiprocessing
import threading
import time
import urllib.request
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from daemon_process import HOST, HTTP_TIMEOUT_S, START_TIMEOUT_S, cpu_seconds, log
from node_snapshots import GPUS, linked_node_snapshot, node_snapshot
from prometheus_client import generate_latest
from scrapes import latency_summary, lines_by_metric, series_lines

from netmon.exposition.collector import SnapshotPage, make_registry
from netmon.exposition.http import MetricsServer

CONCURRENCY = (1, 4, 16)


def serve_snapshot(now: float, conn: Connection, per_scrape: bool = False) -> None:
    """The child: netmon's MetricsServer over the node snapshot, until terminated; rendered
    once per snapshot as the daemon serves it, or (`per_scrape`) on every scrape, as before."""
    snapshot = node_snapshot(now)
    page = make_registry(lambda: snapshot) if per_scrape else SnapshotPage(lambda: snapshot)
    server = MetricsServer(HOST, 0, page)
    conn.send(int(server.server_address[1]))
    conn.close()
    server.serve_forever()


def _timed(function: Callable[[], object], repeats: int) -> dict[str, float]:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        function()
        times.append(time.perf_counter() - began)
    return latency_summary(times)


def load(port: int, concurrency: int, total: int, limit_s: float) -> dict[str, Any]:
    """`total` GETs of /metrics from `concurrency` keep-alive connections; latency per request."""
    latencies: list[float] = []
    sizes: set[int] = set()
    errors: list[str] = []
    lock = threading.Lock()
    tickets = iter(range(total))
    gate = threading.Barrier(concurrency + 1)
    stop_at = [math.inf]

    def take() -> bool:
        with lock:
            return next(tickets, None) is not None and time.monotonic() < stop_at[0]

    def worker() -> None:
        conn = http.client.HTTPConnection(HOST, port, timeout=HTTP_TIMEOUT_S)
        try:
            gate.wait(HTTP_TIMEOUT_S)
            while take():
                began = time.perf_counter()
                conn.request("GET", "/metrics")
                response = conn.getresponse()
                body = response.read()
                elapsed = time.perf_counter() - began
                with lock:
                    latencies.append(elapsed)
                    sizes.add(len(body))
                    if response.status != 200:
                        errors.append(f"status {response.status}")
        except (OSError, http.client.HTTPException, threading.BrokenBarrierError) as exc:
            with lock:
                errors.append(repr(exc))
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    gate.wait(HTTP_TIMEOUT_S)
    began = time.monotonic()
    stop_at[0] = began + limit_s
    for thread in threads:
        thread.join(limit_s + 2 * HTTP_TIMEOUT_S)
    wall = time.monotonic() - began
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": errors[:5],
        "error_count": len(errors),
        "wall_s": wall,
        "requests_per_second": len(latencies) / wall if wall > 0 else None,
        "latency_s": latency_summary(latencies) if latencies else None,
        "response_bytes": sorted(sizes),
    }


def measure_metrics(requests: int, repeats: int, limit_s: float) -> dict[str, Any]:
    now = time.time()
    snapshot = node_snapshot(now)
    registry = make_registry(lambda: snapshot)
    text = generate_latest(registry).decode()
    log(f"metrics: {len(snapshot.series)} series points, {series_lines(text)} lines")
    in_process = {
        "generate_latest_s": _timed(lambda: generate_latest(registry), repeats),
        "collect_only_s": _timed(lambda: list(registry.collect()), repeats),
        "repeats": repeats,
    }
    linked = linked_node_snapshot(now)
    linked_registry = make_registry(lambda: linked)
    linked_text = generate_latest(linked_registry).decode()
    log(f"metrics: the exporter's own pair model: {series_lines(linked_text)} lines")
    linked_layout = {
        "layout": "small, large on paths default, pcie (SeriesPoint); probes pairs and "
        "pairs_pcie as LinkPoints (28 pairs x sizes 8, 256M, labels gpu, peer_gpu, path NV18); "
        "topology of 28 pairs; 7 transports; NVML link health of 8 GPUs x 18 NVLinks",
        "series_lines": series_lines(linked_text),
        "lines_by_metric": lines_by_metric(linked_text),
        "response_bytes": len(linked_text.encode()),
        "in_process_generate_latest_s": _timed(lambda: generate_latest(linked_registry), repeats),
        "served": False,
    }
    levels, exit_code = _serve_and_load(now, requests, limit_s, per_scrape=False)
    # The same load against the same snapshot rendered at every scrape, for the ratio.
    per_scrape, _ = _serve_and_load(now, requests, limit_s, per_scrape=True)
    return {
        "node": {
            "gpus": GPUS,
            "series_points": len(snapshot.series),
            "probes": len(snapshot.probes),
            "layout": "small (4 sizes) and large (3 sizes) on paths default and pcie; 28 pair "
            "probes pairs_A_B x paths nvlink, pcie x sizes 8, 256M (sendrecv)",
        },
        "series_lines": series_lines(text),
        "lines_by_metric": lines_by_metric(text),
        "response_bytes": len(text.encode()),
        "in_process": in_process,
        "exporter_pair_model": linked_layout,
        "server": "netmon's MetricsServer in a spawned process; HTTP/1.1 keep-alive "
        "clients in threads of the bench process",
        "requests_per_level": requests,
        "levels": levels,
        "levels_rendered_per_scrape": per_scrape,
        # p50 latency, rendered per scrape over rendered once per snapshot, per concurrency.
        "p50_ratio_per_scrape_vs_per_snapshot": [
            _p50(slow) / _p50(fast) if _p50(fast) else None
            for slow, fast in zip(per_scrape, levels, strict=True)
        ],
        "server_exit_code": exit_code,
    }


def _p50(level: dict[str, Any]) -> float:
    return float((level["latency_s"] or {}).get("p50", 0.0))


def _serve_and_load(
    now: float, requests: int, limit_s: float, per_scrape: bool
) -> tuple[list[dict[str, Any]], int | None]:
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    server = context.Process(target=serve_snapshot, args=(now, send, per_scrape), daemon=True)
    server.start()
    send.close()
    levels = []
    try:
        if not receive.poll(START_TIMEOUT_S):
            raise RuntimeError("the metrics server did not report its port")
        port = int(receive.recv())
        assert server.pid is not None
        for _ in range(5):  # warm the server's code paths and allocator before measuring
            with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=10) as r:
                r.read()
        for concurrency in CONCURRENCY:
            cpu_before = cpu_seconds(server.pid)
            level = load(port, concurrency, requests, limit_s)
            cpu = cpu_seconds(server.pid) - cpu_before
            level["server_cpu_s_per_request"] = (
                cpu / level["requests"] if level["requests"] else None
            )
            latency = level["latency_s"] or {}
            log(
                f"metrics ({'per scrape' if per_scrape else 'per snapshot'}): "
                f"concurrency {concurrency}: {level['requests']} requests, "
                f"p50 {latency.get('p50', 0) * 1e3:.1f} ms, "
                f"p99 {latency.get('p99', 0) * 1e3:.1f} ms, "
                f"{level['requests_per_second'] or 0:.0f}/s"
            )
            levels.append(level)
    finally:
        receive.close()
        server.terminate()
        server.join(5)
        if server.is_alive():
            server.kill()
            server.join(5)
    return levels, server.exitcode
