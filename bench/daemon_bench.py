"""The daemon's own costs, side by side in one run (issue 3).

1. memory: the real `netmon serve` (gloo, 2 CPU ranks) runs the embedded CPU schedule with its
   intervals divided by 60 (an hour of probe rounds in a minute) while /proc is sampled every
   second: VmRSS, VmHWM, RssAnon, threads, open fds, and whether torch or CUDA is mapped into it.
2. metrics: /metrics of a hand-built Snapshot sized like an 8-GPU node with path and pair probes,
   served by netmon's MetricsServer in its own process, under a keep-alive loopback load at
   concurrency 1, 4 and 16; and the bare generate_latest in-process, for comparison. The same
   node in the exporter's own pair model (LinkPoints, NVML link health) is rendered in-process.
3. duty_cycle: each embedded CPU default probe run as the daemon would run it (its ranks forked
   by a rank zygote started beforehand, as the daemon's is by its first probe); wall / interval.

    python bench/daemon_bench.py [--quick]

One JSON document goes to stdout; progress goes to stderr. This machine is noisy (2 cores, other
jobs): the load averages before and after are part of the document.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import itertools
import json
import math
import multiprocessing
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from netmon.config import NetmonConfig, load_config, resolve
from netmon.exposition.collector import SnapshotPage, make_registry
from netmon.exposition.http import MetricsServer
from netmon.exposition.snapshot import LinkPoint, ProbeStats, SeriesPoint, Snapshot
from netmon.gpu.linkhealth import LinkHealth, NvLinkReading, NvLinkThroughput, PcieReading
from netmon.probe.build import build_spec
from netmon.probe.forking import Zygote
from netmon.probe.launcher import run_probe
from netmon.probe.processes import descendants_of
from netmon.probe.starting import base_env

HOST = "127.0.0.1"
COMPRESSION = 60  # an hour of scheduled rounds in a minute
SMALL_SIZES = (8, 1 << 10, 64 << 10)  # the embedded CPU default probes (netmon.config)
LARGE_SIZES = (1 << 20, 16 << 20)
SAMPLE_S = 1.0
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
HTTP_TIMEOUT_S = 10.0
# A mapping whose file name starts with one of these means torch, CUDA or NCCL is in the process.
FORBIDDEN_LIBS = ("libtorch", "libc10", "libcuda", "libnccl")
TORCH_DIR = f"{os.sep}torch{os.sep}"
TAG_VARIABLE = "DAEMON_BENCH_TAG"
CONCURRENCY = (1, 4, 16)
GPUS = 8
NVLINKS = 18  # per GPU on an H100 SXM board
# A bench-side cap on each duty-cycle probe: a hung probe must not hold the run for 300 s.
PROBE_CAP_S = 90.0

_LISTENING = re.compile(r"listen=http://127\.0\.0\.1:(\d+)/metrics")
_PROBE_OK = re.compile(r"probe ok .*?probe=(\w+).*?wall_s=([0-9.]+)")
_PROBE_FAILED = re.compile(r"probe failed .*?probe=(\w+).*?reason=(\w+)")


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile: a value that was observed."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def latency_summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "p50": quantile(values, 0.50),
        "p90": quantile(values, 0.90),
        "p99": quantile(values, 0.99),
        "max": max(values),
        "min": min(values),
        "mean": statistics.fmean(values),
    }


# ---- /proc readings ----


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile (KiB) and Threads of a process."""
    wanted = {"VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads"}
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in wanted:
            fields[key] = int(value.split()[0])
    return fields


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def forbidden_mappings(pid: int) -> list[str]:
    """Mapped files of the process that belong to torch, CUDA or NCCL."""
    found = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        if os.path.basename(path).startswith(FORBIDDEN_LIBS) or TORCH_DIR in path:
            found.add(path)
    return sorted(found)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tagged_processes(tag: str) -> list[int]:
    """Processes that inherited our tag: the daemon and every rank it started."""
    marker = f"{TAG_VARIABLE}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "environ").read_bytes():
                found.append(int(entry.name))
    return found


def parse_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


# ---- 1. the daemon's memory over a compressed hour ----


def soak_config(workdir: Path) -> dict[str, Any]:
    return {
        "listen": f"{HOST}:0",
        "state_dir": str(workdir / "state"),
        "backend": "gloo",
        "ranks": 2,
        "pause_file": str(workdir / "pause"),
        "probes": [
            {"name": "small", "sizes": list(SMALL_SIZES), "interval": 60 / COMPRESSION},
            {"name": "large", "sizes": list(LARGE_SIZES), "interval": 900 / COMPRESSION},
        ],
    }


class Daemon:
    """`python -m netmon serve` on a free loopback port, with a tag its ranks inherit."""

    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        self.config_path = workdir / "daemon.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "daemon.log"
        self.tag = uuid.uuid4().hex
        # No stray NETMON_* override may change the schedule under test.
        env = {k: v for k, v in os.environ.items() if not k.startswith("NETMON_")}
        env[TAG_VARIABLE] = self.tag
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "netmon", "serve", "--config", str(self.config_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=workdir,
            )
        try:
            self.port = self._wait_for_port()
        except BaseException:
            self.kill_leftovers()
            raise

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_for_port(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.log()[-1500:]}")
            match = _LISTENING.search(self.log())
            if match:
                return int(match.group(1))
            time.sleep(0.05)
        raise RuntimeError(f"the daemon did not listen within {START_TIMEOUT_S:g} s")

    def get(self, path: str = "/metrics") -> bytes:
        url = f"http://{HOST}:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            body: bytes = response.read()
        return body

    def stop(self) -> tuple[int | None, float]:
        """SIGTERM, then the exit code and how long the exit took (None: it had to be killed)."""
        start = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        return code, time.monotonic() - start

    def kill_leftovers(self) -> list[int]:
        """SIGKILL anything still carrying our tag (there should be nothing); the PIDs found."""
        leftovers = tagged_processes(self.tag)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        return leftovers


def _slope_per_minute(times: Sequence[float], values: Sequence[float]) -> float | None:
    if len(times) < 3:
        return None
    mean_t, mean_v = statistics.fmean(times), statistics.fmean(values)
    spread = sum((t - mean_t) ** 2 for t in times)
    if spread == 0:
        return None
    return (
        60 * sum((t - mean_t) * (v - mean_v) for t, v in zip(times, values, strict=True)) / spread
    )


def _counts(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
) -> dict[str, dict[str, float]]:
    """{probe: {reason: value}} of a counter by probe and reason, nonzero values only."""
    found: dict[str, dict[str, float]] = {}
    for (metric, labels), value in samples.items():
        label = dict(labels)
        if metric == name and value:
            found.setdefault(label["probe"], {})[label.get("reason", "")] = value
    return found


def _by_probe(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
) -> dict[str, float]:
    return {
        dict(labels)["probe"]: value
        for (metric, labels), value in samples.items()
        if metric == name
    }


def measure_memory(seconds: float, workdir: Path) -> dict[str, Any]:
    config = soak_config(workdir)
    log(f"memory: starting the daemon (small every 1 s, large every 15 s) for {seconds:g} s")
    daemon = Daemon(workdir, config)
    pid = daemon.proc.pid
    rows: list[list[float]] = []
    scrape_s: list[float] = []
    scrape_errors = 0
    forbidden: set[str] = set()
    control: list[str] = []  # torch as mapped in a rank: proof that the maps check can see it
    rank_rss_max = 0
    final_text = ""
    exit_code: int | None = None
    stop_s = 0.0
    leftovers: list[int] = []
    try:
        start = time.monotonic()
        for tick in itertools.count():
            due = start + tick * SAMPLE_S
            time.sleep(max(0.0, due - time.monotonic()))
            elapsed = time.monotonic() - start
            if daemon.proc.poll() is not None:
                raise RuntimeError(
                    f"daemon exited {daemon.proc.returncode}: {daemon.log()[-1500:]}"
                )
            status = proc_status(pid)
            forbidden.update(forbidden_mappings(pid))
            ranks_rss = 0
            for child in descendants_of(pid):
                with contextlib.suppress(OSError):
                    ranks_rss += proc_status(child).get("VmRSS", 0)
                    if not control:
                        control = forbidden_mappings(child)[:3]
            rank_rss_max = max(rank_rss_max, ranks_rss)
            rows.append(
                [
                    round(elapsed, 2),
                    status["VmRSS"],
                    status["VmHWM"],
                    status["RssAnon"],
                    status["Threads"],
                    open_fds(pid),
                    ranks_rss,
                ]
            )
            began = time.perf_counter()
            try:
                final_text = daemon.get().decode()
                scrape_s.append(time.perf_counter() - began)
            except OSError:
                scrape_errors += 1
            if elapsed >= seconds:
                break
        samples = parse_samples(final_text)
    finally:
        exit_code, stop_s = daemon.stop()
        leftovers = daemon.kill_leftovers()
    log(f"memory: daemon exited {exit_code} in {stop_s:.2f} s after SIGTERM")
    # The final scrape came before SIGTERM; the log also has the runs that ended after it.
    text = daemon.log()
    walls: dict[str, list[float]] = {}
    for match in _PROBE_OK.finditer(text):
        walls.setdefault(match.group(1), []).append(float(match.group(2)))
    failed: dict[str, Counter[str]] = {}
    for match in _PROBE_FAILED.finditer(text):
        failed.setdefault(match.group(1), Counter())[match.group(2)] += 1
    times = [row[0] for row in rows]
    rss = [row[1] for row in rows]
    steady = [i for i, t in enumerate(times) if t >= seconds / 4]
    runs = _by_probe(samples, "netmon_probe_runs_total")
    skips = _counts(samples, "netmon_probe_skips_total")
    scheduled = {p["name"]: seconds / float(p["interval"]) for p in config["probes"]}
    return {
        "setup": {
            "command": f"{sys.executable} -m netmon serve --config FILE",
            "config": config,
            "compression": COMPRESSION,
            "seconds": seconds,
            "sample_every_s": SAMPLE_S,
            "scrape_every_s": SAMPLE_S,
        },
        "rss_kib": {
            "start": rows[0][1],
            "end": rows[-1][1],
            "max": max(rss),
            "growth": rows[-1][1] - rows[0][1],
            "growth_after_first_quarter": rows[-1][1] - rows[steady[0]][1] if steady else None,
            "slope_after_first_quarter_kib_per_min": _slope_per_minute(
                [times[i] for i in steady], [rss[i] for i in steady]
            ),
        },
        "hwm_kib": {"start": rows[0][2], "end": rows[-1][2]},
        "rss_anon_kib": {"start": rows[0][3], "end": rows[-1][3], "max": max(r[3] for r in rows)},
        "threads": {"start": rows[0][4], "end": rows[-1][4], "max": max(r[4] for r in rows)},
        "open_fds": {"start": rows[0][5], "end": rows[-1][5], "max": max(r[5] for r in rows)},
        "rank_processes_rss_max_kib": rank_rss_max,
        "torch_or_cuda_mapped": sorted(forbidden),
        "maps_checked": len(rows),
        "control_rank_mapped": control,
        "scheduled_runs": scheduled,
        "runs": runs,
        "failures": _counts(samples, "netmon_probe_failures_total"),
        "skips": skips,
        "busy_seconds": _by_probe(samples, "netmon_probe_busy_seconds_total"),
        "failed_in_log": {name: dict(reasons) for name, reasons in failed.items()},
        "probe_wall_s_in_daemon": {
            name: {"runs": len(v), "median": statistics.median(v), "max": max(v)}
            for name, v in walls.items()
        },
        "scrapes": {
            "count": len(scrape_s),
            "errors": scrape_errors,
            "latency_s": latency_summary(scrape_s) if scrape_s else None,
            "bytes": len(final_text.encode()),
            "series_lines": _series_lines(final_text),
        },
        "exit_code": exit_code,
        "stop_s": stop_s,
        "leftover_processes": leftovers,
        "columns": ["t_s", "rss_kib", "hwm_kib", "rss_anon_kib", "threads", "fds", "ranks_rss_kib"],
        "samples": rows,
    }


# ---- 2. /metrics at an 8-GPU node's series count ----


def _stats(
    rng: random.Random, now: float, schedule: Sequence[tuple[str, float]]
) -> dict[str, ProbeStats]:
    return {
        name: ProbeStats(
            runs=rng.randint(10, 1000),
            failures={"timeout_measure": 1},
            skips={"devices_busy": rng.randint(0, 50), "still_running": 2},
            last_success=now - 60,
            last_run=now - 60,
            duration_s=rng.uniform(2, 40),
            busy_seconds=rng.uniform(100, 10000),
            peak_device_memory=rng.randint(1 << 30, 2 << 30),
            interval_s=interval,
        )
        for name, interval in schedule
    }


def node_snapshot(now: float) -> Snapshot:
    """The snapshot of an 8-GPU node: small and large probes on two paths, plus 28 pair probes.

    The label set stays SeriesPoint's (probe, op, size_bytes, path): each GPU pair is a probe of
    its own (pairs_0_1 ...) on the nvlink and pcie paths, two sizes each. Every optional value
    (baseline, ratio, threshold) is set, so every family carries every series: an upper bound.
    """
    rng = random.Random(3)
    points = _path_points(rng, now)
    pairs = [f"pairs_{a}_{b}" for a, b in itertools.combinations(range(GPUS), 2)]
    for name in pairs:
        for path, rate in (("nvlink", 1.5e11), ("pcie", 2.4e10)):
            points.append(_point(rng, now, name, "sendrecv", 8, path, rate * 8 / 4e5))
            points.append(_point(rng, now, name, "sendrecv", 256 << 20, path, rate))
    points.sort(key=lambda p: (p.probe, p.op, p.size_bytes, p.path))
    schedule = [("small", 60.0), ("large", 900.0), *((p, 3600.0) for p in pairs)]
    return Snapshot(
        series=tuple(points),
        probes=_stats(rng, now, schedule),
        build={"version": "0.1.0", "torch": "2.5.1", "nccl": "2.21.5"},
        started_at=now - 86400,
    )


def _path_points(rng: random.Random, now: float) -> list[SeriesPoint]:
    """small (4 sizes) and large (3 sizes) all_reduce on the default and pcie paths."""
    points: list[SeriesPoint] = []
    for path, rate in (("default", 2.3e11), ("pcie", 2.2e10)):
        for size in (8, 256, 8 << 10, 64 << 10):
            small_rate = rate * size / (size + 4e5)  # latency-bound sizes
            points.append(_point(rng, now, "small", "all_reduce", size, path, small_rate))
        for size in (256 << 20, 512 << 20, 1 << 30):
            points.append(_point(rng, now, "large", "all_reduce", size, path, rate))
    return points


def _point(
    rng: random.Random, now: float, probe: str, op: str, size: int, path: str, busbw: float
) -> SeriesPoint:
    busbw *= rng.uniform(0.9, 1.1)
    return SeriesPoint(
        probe=probe,
        op=op,
        size_bytes=size,
        path=path,
        busbw=busbw,
        algbw=busbw / 1.75,
        latency_s=size / busbw,
        cv=rng.uniform(0.001, 0.2),
        measured_at=now - rng.uniform(0, 900),
        baseline=busbw * rng.uniform(0.95, 1.05),
        ratio=rng.uniform(0.9, 1.1),
        degraded=rng.random() < 0.05,
        min_busbw=busbw / 2,
    )


def linked_node_snapshot(now: float) -> Snapshot:
    """The same node as the exporter now models pairs: LinkPoints with gpu and peer_gpu labels.

    Two pairs probes (pairs, and pairs_pcie with P2P off) over 28 pairs x 2 sizes, the topology
    of an NVSwitch board (NV18 everywhere), transports, and NVML link health of 8 GPUs with 18
    NVLinks each.
    """
    rng = random.Random(4)
    pairs = list(itertools.combinations(range(GPUS), 2))
    links = [
        LinkPoint(
            probe=probe,
            size_bytes=size,
            gpu=a,
            peer_gpu=b,
            path="NV18",
            busbw=rate * rng.uniform(0.9, 1.1) * (1 if size > 8 else 2e-5),
            ratio=rng.uniform(0.9, 1.1),
            low=False,
            suspect=False,
        )
        for probe, rate in (("pairs", 1.5e11), ("pairs_pcie", 2.4e10))
        for a, b in pairs
        for size in (8, 256 << 20)
    ]
    health = LinkHealth(
        pcie=tuple(PcieReading(gpu, 5, 5, 16, 16, 0) for gpu in range(GPUS)),
        nvlinks=tuple(
            NvLinkReading(gpu, link, True, 0, 0, 0, 0)
            for gpu in range(GPUS)
            for link in range(NVLINKS)
        ),
        throughput=tuple(NvLinkThroughput(gpu, 1 << 40, 1 << 40) for gpu in range(GPUS)),
        under_load=True,
        read_at=now - 30,
    )
    schedule = [("small", 60.0), ("large", 900.0), ("pairs", 3600.0), ("pairs_pcie", 3600.0)]
    return Snapshot(
        series=tuple(sorted(_path_points(rng, now), key=lambda p: (p.probe, p.size_bytes, p.path))),
        probes=_stats(rng, now, schedule),
        build={"version": "0.1.0", "torch": "2.5.1", "nccl": "2.21.5"},
        started_at=now - 86400,
        links=tuple(links),
        pair_members={"pairs": tuple(range(GPUS)), "pairs_pcie": tuple(range(GPUS))},
        topology=tuple((a, b, "NV18") for a, b in pairs),
        transports=(
            ("large", "default", "nvls"),
            ("large", "default", "p2p"),
            ("large", "pcie", "shm"),
            ("small", "default", "p2p"),
            ("small", "pcie", "shm"),
            ("pairs", "NV18", "p2p"),
            ("pairs_pcie", "NV18", "shm"),
        ),
        link_health=health,
    )


def _series_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def _lines_by_metric(text: str) -> dict[str, int]:
    names = Counter(
        re.split(r"[{ ]", line, maxsplit=1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    )
    return dict(sorted(names.items()))


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
    log(f"metrics: {len(snapshot.series)} series points, {_series_lines(text)} lines")
    in_process = {
        "generate_latest_s": _timed(lambda: generate_latest(registry), repeats),
        "collect_only_s": _timed(lambda: list(registry.collect()), repeats),
        "repeats": repeats,
    }
    linked = linked_node_snapshot(now)
    linked_registry = make_registry(lambda: linked)
    linked_text = generate_latest(linked_registry).decode()
    log(f"metrics: the exporter's own pair model: {_series_lines(linked_text)} lines")
    linked_layout = {
        "layout": "small, large on paths default, pcie (SeriesPoint); probes pairs and "
        "pairs_pcie as LinkPoints (28 pairs x sizes 8, 256M, labels gpu, peer_gpu, path NV18); "
        "topology of 28 pairs; 7 transports; NVML link health of 8 GPUs x 18 NVLinks",
        "series_lines": _series_lines(linked_text),
        "lines_by_metric": _lines_by_metric(linked_text),
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
        "series_lines": _series_lines(text),
        "lines_by_metric": _lines_by_metric(text),
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


# ---- 3. the default schedule's duty cycle ----


def _schedule(config: NetmonConfig) -> list[dict[str, Any]]:
    return [
        {
            "name": p.name,
            "op": p.op,
            "sizes": list(p.sizes),
            "interval_s": p.interval,
            "timeout_s": p.timeout,
            "warmup": p.warmup,
            "iters": p.iters,
            "batch": p.batch,
        }
        for p in config.probes or ()
    ]


@contextlib.contextmanager
def _started_zygote(config: NetmonConfig) -> Iterator[Zygote | None]:
    """The daemon's rank zygote, its one torch import paid before any run is timed."""
    if config.rank_start != "zygote":
        yield None
        return
    zygote = Zygote(sys.executable, base_env())
    try:
        warm = zygote.session()
        if warm is not None:
            warm.close()
        yield zygote
    finally:
        zygote.close()


def measure_duty_cycle(repeats: int) -> dict[str, Any]:
    config = resolve(load_config(None, environ={}), gpus=0)
    probes = config.probes or ()
    walls: dict[str, list[float]] = {p.name: [] for p in probes}
    collective: dict[str, list[float]] = {p.name: [] for p in probes}
    failures: list[str] = []
    ranks: dict[str, int] = {}
    forked = spawned = 0
    with _started_zygote(config) as zygote:
        for repeat in range(repeats):
            for probe in probes:  # interleaved, so a drift of the machine spreads over both
                spec = build_spec(probe, config)
                ranks[probe.name] = max(len(spec.devices), spec.ranks)
                cap = min(spec.timeout, PROBE_CAP_S)
                spec = spec.model_copy(
                    update={"timeout": cap, "deadlines": spec.deadlines.capped(cap)}
                )
                outcome = run_probe(spec, zygote=zygote)
                if outcome.failure is not None:
                    failures.append(f"{probe.name}: {outcome.failure.describe()}")
                walls[probe.name].append(outcome.wall_s)
                collective[probe.name].append(outcome.collective_s)
                forked += outcome.ranks_forked
                spawned += outcome.ranks_spawned
                log(f"duty: {probe.name} run {repeat + 1}: {outcome.wall_s:.2f} s")
    per_probe: dict[str, dict[str, Any]] = {}
    duty = wall_per_hour = device_per_hour = 0.0
    for probe in probes:
        wall = statistics.median(walls[probe.name])
        per_hour = 3600 / probe.interval
        per_probe[probe.name] = {
            "interval_s": probe.interval,
            "sizes": list(probe.sizes),
            "wall_s": walls[probe.name],
            "wall_s_median": wall,
            "collective_s_median": statistics.median(collective[probe.name]),
            "duty": wall / probe.interval,
            "runs_per_hour": per_hour,
            "ranks": ranks[probe.name],
            # As netmon_probe_busy_seconds_total counts: wall time x CPU ranks (or GPUs).
            "device_seconds_per_hour": per_hour * wall * ranks[probe.name],
        }
        duty += wall / probe.interval
        wall_per_hour += per_hour * wall
        device_per_hour += per_hour * wall * ranks[probe.name]
    gpu = resolve(load_config(None, environ={}), gpus=GPUS)
    return {
        "config": "netmon.config.resolve(load_config(None, environ={}), gpus=0)",
        "backend": config.backend,
        "rank_start": config.rank_start,
        "ranks_started": {"fork": forked, "spawn": spawned},
        "repeats": repeats,
        "probes": per_probe,
        "failures": failures,
        "duty": duty,
        "wall_seconds_per_hour": wall_per_hour,
        "device_seconds_per_hour": device_per_hour,
        "gpu_default_reference": {
            "gpus": GPUS,
            "run": False,
            "why": "no GPU on this machine: the nccl schedule cannot run here",
            "schedule": _schedule(gpu),
        },
    }


# ---- the run ----


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="15 s of daemon, fewer requests, 1 run per probe"
    )
    return parser.parse_args(argv)


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="netmon-daemon-bench-") as name:
        yield Path(name)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git_state() -> str | None:
    """The commit and whether the tree had changes: netmon may be edited between runs."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    # As Ctrl-C does: unwind, so that every finally stops the processes this run started.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    soak_s = 15.0 if args.quick else 60.0
    requests = 48 if args.quick else 300
    repeats = 1 if args.quick else 3
    started = time.monotonic()
    load_before = os.getloadavg()
    with _workdir() as workdir:
        memory = measure_memory(soak_s, workdir)
    metrics = measure_metrics(requests, 20 if args.quick else 100, 3.0 if args.quick else 15.0)
    duty = measure_duty_cycle(repeats)
    document = {
        "benchmark": "daemon",
        "issue": 3,
        "quick": args.quick,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": _version("torch"),
            "prometheus_client": _version("prometheus-client"),
            "netmon_tree": _git_state(),
            # Other work on this machine skews every figure here; these say how busy it was.
            "loadavg_1m_before": load_before[0],
            "loadavg_1m_after": os.getloadavg()[0],
        },
        "memory": memory,
        "metrics": metrics,
        "duty_cycle": duty,
        "elapsed_s": time.monotonic() - started,
    }
    print(json.dumps(document, indent=2))
    rss = memory["rss_kib"]
    log(
        f"done in {document['elapsed_s']:.0f} s: daemon RSS {rss['start'] / 1024:.1f} -> "
        f"{rss['end'] / 1024:.1f} MiB, torch mapped: {bool(memory['torch_or_cuda_mapped'])}, "
        f"duty {duty['duty']:.4f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
