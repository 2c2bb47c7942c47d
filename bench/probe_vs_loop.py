"""netmon's probe against a plain torch.distributed timing loop, interleaved in one run (issue 2).

Both sides run all_reduce (float32) on gloo in 2 fresh CPU rank processes over loopback. The plain
side is `plain_rank` below: its own TCPStore and process group, then per sample a barrier and
time.perf_counter around ONE op (and, as a reference for netmon's default timing, around `batch`
back-to-back ops); each rank prints its samples and medians as one JSON line. This machine is
noisy, so the sides alternate (A B, B A, ...) over several rounds and each size is judged by the
median of the per-round ratios netmon / plain, quoted with their range and an interval for that
median: a verdict whose interval straddles the tolerance is reported as inconclusive. The probe's
fixed cost is a whole `netmon probe` CLI run, timed from outside, minus its time inside timed
collectives.

    python bench/probe_vs_loop.py [--rounds N] [--quick] [--rank-start zygote|spawn|both]

netmon's ranks are forked by its rank zygote by default, as in the daemon; `--rank-start spawn`
starts each as a fresh interpreter (and so does the plain loop, always). `--rank-start both` adds
a fourth side to every round, netmon's per-op probe with spawned ranks, and compares the two ways
of starting ranks directly (`fork_vs_spawn`: forked busbw / spawned busbw, per size).

One JSON document goes to stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

SIZES = (8, 1 << 20, 16 << 20)
RANKS = 2
HOST = "127.0.0.1"
FLOAT32_BYTES = 4
# all_reduce's bus factor 2(n-1)/n (nccl-tests doc/PERFORMANCE.md), written out here so that the
# reference does not borrow netmon's maths.
BUS_FACTOR = 2.0 * (RANKS - 1) / RANKS
# netmon's defaults for its batched timing, used unchanged on both sides.
BATCH, BATCHED_ITERS, WARMUP = 5, 20, 5
TARGETS = (
    ("busbw_16MiB", 16 << 20, "busbw", 0.05),
    ("latency_8B", 8, "latency", 0.10),
    # The same target, with netmon's figure taken as the plain loop takes its own: the slower
    # rank's median (from rank_medians_s) rather than the median of per-sample maxima.
    ("latency_8B_same_statistic", 8, "latency_same_statistic", 0.10),
)
RUN_TIMEOUT_S = 120.0
# The rank zygote netmon's probes fork their ranks from (None: ranks spawned); set by main().
ZYGOTE: Any = None

Stats = dict[str, float]


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# ---- the plain reference loop: runs inside each of its two rank processes ----


def plain_rank(
    rank: int, port: int, sizes: Sequence[int], iters: int, batched_iters: int, batch: int
) -> None:
    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=60)
    # torch.distributed re-exports TCPStore from its C extension without declaring it.
    store = dist.TCPStore(  # type: ignore[attr-defined]
        HOST, port, RANKS, is_master=rank == 0, timeout=timeout
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=RANKS, timeout=timeout)
    per_op: dict[str, list[float]] = {}
    batched: dict[str, list[float]] = {}
    for size in sizes:
        tensor = torch.ones(max(1, size // FLOAT32_BYTES), dtype=torch.float32)
        for _ in range(WARMUP):
            dist.all_reduce(tensor)
        times = []
        for _ in range(iters):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        per_op[str(size)] = times
        times = []
        for _ in range(batched_iters):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(batch):
                dist.all_reduce(tensor)
            times.append((time.perf_counter() - start) / batch)
        batched[str(size)] = times
    # Rank 0 hosts the store: nobody leaves before everybody is done with it.
    dist.barrier()
    dist.destroy_process_group()
    report = {
        "rank": rank,
        "median_s": {size: statistics.median(times) for size, times in per_op.items()},
        "batched_median_s": {size: statistics.median(times) for size, times in batched.items()},
        "per_op_s": per_op,
        "batched_s": batched,
    }
    print(json.dumps(report), flush=True)
    # As netmon's worker does: skip interpreter teardown, where torch's atexit hooks can hang.
    os._exit(0)


# ---- the parent: runs both sides and compares them ----


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _plain_env() -> dict[str, str]:
    # The environment netmon's launcher gives a gloo rank on loopback.
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _kill_and_reap(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def run_plain(sizes: Sequence[int], iters: int, batched_iters: int) -> dict[str, Any]:
    """One run of the plain loop in 2 fresh processes: per-rank samples and the wall time."""
    port = _free_port()  # a race with another process is possible; the rank would then fail
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        f"--port={port}",
        f"--sizes={','.join(map(str, sizes))}",
        f"--iters={iters}",
        f"--batched-iters={batched_iters}",
    ]
    procs: list[subprocess.Popen[bytes]] = []
    start = time.monotonic()
    with contextlib.ExitStack() as files:
        # Files, not pipes: a rank blocked on a full pipe could hold its peer in a collective.
        outputs: list[IO[bytes]] = [
            files.enter_context(tempfile.TemporaryFile()) for _ in range(RANKS)
        ]
        try:
            for rank, out in enumerate(outputs):
                procs.append(
                    subprocess.Popen(
                        [*command, f"--plain-rank={rank}"],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=_plain_env(),
                        start_new_session=True,
                    )
                )
            deadline = start + RUN_TIMEOUT_S
            for proc in procs:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            wall = time.monotonic() - start
        finally:
            _kill_and_reap(procs)  # on success a no-op; on a timeout or error, no rank lingers
        reports = []
        for proc, out in zip(procs, outputs, strict=True):
            out.seek(0)
            text = out.read().decode(errors="replace")
            if proc.returncode != 0:
                raise RuntimeError(f"plain rank exited with {proc.returncode}: {text[-1500:]}")
            reports.append(json.loads(text.strip().splitlines()[-1]))
    reports.sort(key=lambda report: int(report["rank"]))
    timed = sum(
        sum(max(values) for values in zip(*(r[key][str(size)] for r in reports), strict=True))
        * (BATCH if key == "batched_s" else 1)
        for key in ("per_op_s", "batched_s")
        for size in sizes
    )
    return {"wall_s": wall, "timed_s": timed, "ranks": reports}


def plain_times(run: dict[str, Any], size: int, key: str = "per_op_s") -> tuple[float, float]:
    """(the slower rank's median, the median over samples of the slower rank) for one size."""
    per_rank = [[float(t) for t in report[key][str(size)]] for report in run["ranks"]]
    slower_median = max(statistics.median(times) for times in per_rank)
    per_sample_max = [max(values) for values in zip(*per_rank, strict=True)]
    return slower_median, statistics.median(per_sample_max)


def run_netmon(
    sizes: Sequence[int], iters: int, timing: str, spawned: bool = False
) -> dict[str, Any]:
    """One netmon probe; its ranks forked by ZYGOTE when there is one, unless `spawned`."""
    from netmon.probe.launcher import run_probe
    from netmon.probe.spec import ProbeSpec

    spec = ProbeSpec.model_validate(
        {
            "op": "all_reduce",
            "sizes": list(sizes),
            "dtype": "float32",
            "warmup": WARMUP,
            "iters": iters,
            "batch": BATCH,
            "timing": timing,
            "backend": "gloo",
            "ranks": RANKS,
            "timeout": RUN_TIMEOUT_S,
        }
    )
    # When each rank entered each phase, from the launcher's view: where the fixed cost goes.
    entered: dict[str, list[float]] = {}
    start = time.monotonic()

    def on_event(kind: str, event: dict[str, Any]) -> None:
        if kind == "phase":
            entered.setdefault(str(event["phase"]), []).append(time.monotonic() - start)

    zygote = None if spawned else ZYGOTE
    outcome = run_probe(spec, on_event=on_event, zygote=zygote)
    if outcome.failure is not None:
        raise RuntimeError(f"netmon probe ({timing}) failed: {outcome.failure.describe()}")
    if zygote is not None and outcome.ranks_forked != RANKS:
        raise RuntimeError(f"netmon probe ({timing}): ranks not forked ({outcome.fork_fallback})")
    env = outcome.environment
    # The slower rank's entry into each phase; phases repeat per size, so take the first entry.
    ready = max(entered["rendezvous"])
    swept = sorted(entered["warmup"])[RANKS - 1]
    teardown = max(entered["teardown"])
    return {
        "wall_s": outcome.wall_s,
        "collective_s": outcome.collective_s,
        "phases_s": {
            "start_and_import": ready,
            "rendezvous_and_init": swept - ready,
            "sizes": teardown - swept,
            "teardown_and_reap": outcome.wall_s - teardown,
        },
        "torch": env.torch if env else None,
        "time_s": {str(r.size_bytes): r.time_s for r in outcome.results},
        "slower_rank_median_s": {str(r.size_bytes): max(r.rank_medians_s) for r in outcome.results},
        "busbw": {str(r.size_bytes): r.busbw_bytes_per_second for r in outcome.results},
    }


def _netmon_command() -> list[str]:
    script = Path(sys.executable).with_name("netmon")
    return [str(script)] if script.exists() else [sys.executable, "-m", "netmon"]


def cli_command(sizes: Sequence[int], rank_start: str) -> list[str]:
    return [
        *_netmon_command(),
        "probe",
        "--backend=gloo",
        f"--ranks={RANKS}",
        "--op=all_reduce",
        f"--sizes={','.join(map(str, sizes))}",
        f"--rank-start={rank_start}",
        "--json",
        "--quiet",
    ]


def run_cli(sizes: Sequence[int], rank_start: str) -> dict[str, float]:
    """A whole `netmon probe --json` run with default timing, timed from outside."""
    start = time.monotonic()
    done = subprocess.run(
        cli_command(sizes, rank_start), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    cli_wall = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(f"netmon probe exited {done.returncode}: {done.stderr[-1500:]}")
    probes = json.loads(done.stdout)["probes"]
    wall = sum(float(p["wall_s"]) for p in probes)
    collective = sum(float(p["collective_s"]) for p in probes)
    return {
        "cli_wall_s": cli_wall,
        "collective_s": collective,
        "fixed_s": cli_wall - collective,
        "cli_outside_launcher_s": cli_wall - wall,
        "launcher_outside_collectives_s": wall - collective,
    }


def cpu_seconds() -> tuple[float, float]:
    """(CPU time the whole machine spent busy, CPU time of this process and its reaped children).

    Their difference over a round is work by other processes: the noise this round ran in.
    Steal time counts as busy: the hypervisor ran someone else on our CPU.
    """
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    busy = sum(fields[:3]) + sum(fields[5:8])
    own = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    ticks = os.sysconf("SC_CLK_TCK")
    return busy / ticks, sum(u.ru_utime + u.ru_stime for u in own) + zygote_ticks() / ticks


def zygote_ticks() -> int:
    """The live rank zygote's CPU and its reaped ranks' (RUSAGE_CHILDREN counts neither until
    the zygote itself is reaped): utime, stime, cutime, cstime of /proc/PID/stat."""
    pid = ZYGOTE.pid if ZYGOTE is not None else None
    if pid is None:
        return 0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return sum(int(v) for v in fields[11:15])  # fields 14-17 of proc(5), counted from 1


def foreign_share(start: float, busy: float, own: float) -> float:
    """CPU seconds other processes used since `start`, per second: 0 is a quiet machine."""
    busy_now, own_now = cpu_seconds()
    elapsed = time.monotonic() - start
    return max(0.0, (busy_now - busy) - (own_now - own)) / elapsed if elapsed > 0 else 0.0


def stats(values: Sequence[float]) -> Stats:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def busbw(size: int, seconds: float) -> float:
    return size / seconds * BUS_FACTOR


def median_interval(
    values: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float]:
    """A distribution-free interval for the median: (low, high, its actual coverage).

    The k-th smallest and k-th largest values bound the median with probability
    1 - 2 P(Binomial(n, 1/2) < k); k is the largest that keeps at least `confidence`.
    """
    ordered, n = sorted(values), len(values)

    def below(k: int) -> float:  # P(Binomial(n, 1/2) <= k)
        return sum(math.comb(n, i) for i in range(k + 1)) / (1 << n)

    k = 1
    while k + 1 <= n - k and 2 * below(k) <= 1 - confidence:
        k += 1
    return ordered[k - 1], ordered[n - k], 1 - 2 * below(k - 1)


def ratio_stats(numerators: Sequence[float], denominators: Sequence[float]) -> Stats:
    ratios = [n / d for n, d in zip(numerators, denominators, strict=True)]
    low, high, coverage = median_interval(ratios)
    return {**stats(ratios), "ci_low": low, "ci_high": high, "ci_coverage": coverage}


def one_round(
    number: int, sizes: Sequence[int], iters: int, batched_iters: int, both: bool = False
) -> dict[str, Any]:
    sides: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("plain", lambda: run_plain(sizes, iters, batched_iters)),
        ("netmon_per_op", lambda: run_netmon(sizes, iters, "per_op")),
        ("netmon_batched", lambda: run_netmon(sizes, batched_iters, "batched")),
    ]
    if both:
        sides.append(("netmon_spawned", lambda: run_netmon(sizes, iters, "per_op", spawned=True)))
    # Alternate who goes first, so a drift of the machine does not favour one side.
    if number % 2:
        sides.reverse()
    start, (busy, own) = time.monotonic(), cpu_seconds()
    runs = {}
    for name, run in sides:
        runs[name] = run()
        log(f"round {number + 1}: {name} done in {runs[name]['wall_s']:.2f} s")
    plain, per_op, batched = runs["plain"], runs["netmon_per_op"], runs["netmon_batched"]
    result: dict[str, Any] = {
        "order": [name for name, _ in sides],
        # Other processes' CPU seconds per second of this round (the machine has cpu_count()).
        "foreign_cpu_share": foreign_share(start, busy, own),
        "sizes": {},
    }
    for size in sizes:
        key = str(size)
        slower_median, per_sample_max = plain_times(plain, size)
        result["sizes"][key] = {
            "plain_per_op_s": slower_median,
            "plain_per_op_per_sample_max_s": per_sample_max,
            "plain_batched_s": plain_times(plain, size, "batched_s")[0],
            "netmon_per_op_s": per_op["time_s"][key],
            "netmon_per_op_slower_rank_median_s": per_op["slower_rank_median_s"][key],
            "netmon_per_op_busbw": per_op["busbw"][key],
            "netmon_batched_s": batched["time_s"][key],
            "netmon_batched_busbw": batched["busbw"][key],
        }
        if both:
            result["sizes"][key]["netmon_spawned_busbw"] = runs["netmon_spawned"]["busbw"][key]
    result["plain_wall_s"] = plain["wall_s"]
    result["plain_outside_timed_s"] = plain["wall_s"] - plain["timed_s"]
    result["netmon_per_op_wall_s"] = per_op["wall_s"]
    result["netmon_per_op_phases_s"] = per_op["phases_s"]
    result["torch"] = per_op["torch"]
    return result


def summarise_size(size: int, rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    rows = [r["sizes"][str(size)] for r in rounds]

    def column(name: str) -> list[float]:
        return [float(row[name]) for row in rows]

    plain, plain_batched = column("plain_per_op_s"), column("plain_batched_s")
    per_op, batched = column("netmon_per_op_s"), column("netmon_batched_s")
    # busbw is S / t x factor on both sides, so its ratio is the inverse of the time ratio; it is
    # taken from netmon's own busbw figure, so that a slip in netmon's maths would show here.
    return {
        "size_bytes": size,
        "latency_s": {
            "plain_per_op": stats(plain),
            "plain_per_op_per_sample_max": stats(column("plain_per_op_per_sample_max_s")),
            "netmon_per_op": stats(per_op),
            "netmon_per_op_slower_rank_median": stats(column("netmon_per_op_slower_rank_median_s")),
            "plain_batched": stats(plain_batched),
            "netmon_batched": stats(batched),
        },
        "busbw_bytes_per_second": {
            "plain_per_op": stats([busbw(size, t) for t in plain]),
            "netmon_per_op": stats(column("netmon_per_op_busbw")),
            "plain_batched": stats([busbw(size, t) for t in plain_batched]),
            "netmon_batched": stats(column("netmon_batched_busbw")),
        },
        "ratios": {
            "per_op": {
                "busbw": ratio_stats(
                    column("netmon_per_op_busbw"), [busbw(size, t) for t in plain]
                ),
                "latency": ratio_stats(per_op, plain),
                # Against the plain samples reduced as netmon reduces them (slower rank per
                # sample, then the median): what is left is not the statistic.
                "latency_vs_plain_per_sample_max": ratio_stats(
                    per_op, column("plain_per_op_per_sample_max_s")
                ),
                # And the other way round: netmon's samples reduced as the plain loop reduces
                # its own (each rank's median, then the slower rank).
                "latency_same_statistic": ratio_stats(
                    column("netmon_per_op_slower_rank_median_s"), plain
                ),
            },
            "batched": {
                "busbw": ratio_stats(
                    column("netmon_batched_busbw"), [busbw(size, t) for t in plain_batched]
                ),
                "latency": ratio_stats(batched, plain_batched),
            },
            "netmon_batched_vs_plain_per_op": {"latency": ratio_stats(batched, plain)},
        },
    }


def targets(by_size: dict[int, dict[str, Any]], timing: str) -> list[dict[str, Any]]:
    checks = []
    for name, size, metric, tolerance in TARGETS:
        if size not in by_size or metric not in by_size[size]["ratios"][timing]:
            continue
        ratio = by_size[size]["ratios"][timing][metric]
        low, high = ratio["ci_low"], ratio["ci_high"]
        inside = 1 - tolerance <= low and high <= 1 + tolerance
        outside = high < 1 - tolerance or low > 1 + tolerance
        checks.append(
            {
                "name": name,
                "size_bytes": size,
                "compares": f"netmon {timing} {metric} / plain {timing} {metric}",
                "tolerance": tolerance,
                "median_ratio": ratio["median"],
                "min_ratio": ratio["min"],
                "max_ratio": ratio["max"],
                "met": abs(ratio["median"] - 1.0) <= tolerance,
                # The interval for the median ratio: when it lies wholly inside or wholly
                # outside 1 +- tolerance, more rounds would not change the verdict.
                "median_interval": [ratio["ci_low"], ratio["ci_high"]],
                "interval_coverage": ratio["ci_coverage"],
                "conclusive": inside or outside,
            }
        )
    return checks


def fork_vs_spawn(sizes: Sequence[int], rounds: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size, netmon's per-op busbw with forked ranks over the same with spawned ranks, both
    in every round: 1 within the interval means starting ranks by fork changes nothing measured."""
    compared = []
    for size in sizes:
        rows = [r["sizes"][str(size)] for r in rounds]
        ratio = ratio_stats(
            [row["netmon_per_op_busbw"] for row in rows],
            [row["netmon_spawned_busbw"] for row in rows],
        )
        compared.append({"size_bytes": size, "forked_over_spawned_busbw": ratio})
        log(
            f"{size} B: forked / spawned busbw, median {ratio['median']:.3f} "
            f"[{ratio['min']:.3f}, {ratio['max']:.3f}], interval for the median "
            f"[{ratio['ci_low']:.3f}, {ratio['ci_high']:.3f}]"
        )
    return compared


@contextlib.contextmanager
def rank_zygote(rank_start: str) -> Any:
    global ZYGOTE
    if rank_start == "spawn":
        yield
        return
    from netmon.probe.forking import Zygote
    from netmon.probe.starting import base_env

    ZYGOTE = Zygote(sys.executable, base_env())
    try:
        yield
    finally:
        ZYGOTE.close()
        ZYGOTE = None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 10; --quick 2)")
    parser.add_argument("--quick", action="store_true", help="2 rounds, 20 samples, one CLI run")
    parser.add_argument(
        "--iters", type=int, help="per-op samples per size on both sides (default 50; --quick 20)"
    )
    parser.add_argument(
        "--batched-iters",
        type=int,
        default=BATCHED_ITERS,
        help=f"batched samples of {BATCH} ops per size, both sides (default {BATCHED_ITERS})",
    )
    parser.add_argument(
        "--cli-runs", type=int, help="timed `netmon probe` runs (default 3; quick 1)"
    )
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES)), help="sizes in bytes (default 8,1M,16M)"
    )
    parser.add_argument(
        "--rank-start",
        choices=("zygote", "spawn", "both"),
        default="zygote",
        help="netmon's ranks forked by its rank zygote (default, as in the daemon), spawned, or "
        "both (a fourth side per round: spawned ranks, compared with forked ones)",
    )
    # Internal: run as one rank of the plain loop.
    parser.add_argument("--plain-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("rounds", "iters", "batched_iters", "cli_runs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    try:
        args.sizes = [int(size) for size in args.sizes.split(",")]
    except ValueError:
        parser.error("--sizes: give byte counts, comma separated (8,1048576)")
    if any(size < 1 for size in args.sizes):
        parser.error("--sizes: every size must be >= 1 byte")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes: list[int] = args.sizes
    iters = args.iters or (20 if args.quick else 50)
    if args.plain_rank is not None:
        plain_rank(args.plain_rank, args.port, sizes, iters, args.batched_iters, BATCH)
        return 0
    rounds_n = args.rounds or (2 if args.quick else 10)
    cli_runs = args.cli_runs or (1 if args.quick else 3)
    started = time.monotonic()
    load_before = os.getloadavg()
    both = args.rank_start == "both"
    cli_start = "zygote" if both else args.rank_start
    with rank_zygote(args.rank_start):
        rounds = [one_round(n, sizes, iters, args.batched_iters, both) for n in range(rounds_n)]
    cli = []
    for number in range(cli_runs):
        cli.append(run_cli(sizes, cli_start))
        log(f"cli run {number + 1}: {cli[-1]['cli_wall_s']:.2f} s")
    by_size = {size: summarise_size(size, rounds) for size in sizes}
    checks = targets(by_size, "per_op")
    phases = {
        phase: stats([r["netmon_per_op_phases_s"][phase] for r in rounds])
        for phase in rounds[0]["netmon_per_op_phases_s"]
    }
    document = {
        "benchmark": "probe_vs_loop",
        "date": datetime.date.today().isoformat(),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": rounds[0]["torch"],
            # Other work on the machine skews both sides; interleaving spreads it, not removes it.
            "loadavg_1m_before": load_before[0],
            "loadavg_1m_after": os.getloadavg()[0],
            # Per round: CPU seconds used by other processes per second (0 is quiet).
            "foreign_cpu_share_per_round": stats([r["foreign_cpu_share"] for r in rounds]),
        },
        "setup": {
            "backend": "gloo",
            "ranks": RANKS,
            "op": "all_reduce",
            "dtype": "float32",
            "sizes": sizes,
            "warmup": WARMUP,
            "per_op_iters": iters,
            "batched_iters": args.batched_iters,
            "batch": BATCH,
            "rounds": rounds_n,
            "order": "each round runs every side once; odd rounds in reverse order",
            "plain_per_op": "per rank: barrier, perf_counter around one op; the slower rank's "
            "median",
            "plain_batched": f"per rank: barrier, perf_counter around {BATCH} ops, / {BATCH}; "
            "the slower rank's median",
            "netmon": "run_probe(ProbeSpec(timing=per_op|batched)); per sample the slower rank, "
            "then the median",
            "netmon_rank_start": args.rank_start,
        },
        "targets_timing": "per_op",
        "targets": checks,
        "targets_met": all(check["met"] for check in checks),
        "targets_conclusive": all(check["conclusive"] for check in checks),
        "batched_against_targets": targets(by_size, "batched"),
        "sizes": [by_size[size] for size in sizes],
        "fixed_cost": {
            "command": " ".join(cli_command(sizes, cli_start)[1:]),
            "runs": cli_runs,
            **{key: stats([run[key] for run in cli]) for key in cli[0]},
            "netmon_per_op_phases_s": phases,
            "netmon_per_op_wall_s": stats([r["netmon_per_op_wall_s"] for r in rounds]),
            "plain_wall_s": stats([r["plain_wall_s"] for r in rounds]),
            "plain_outside_timed_s": stats([r["plain_outside_timed_s"] for r in rounds]),
        },
        "rounds": rounds,
        "elapsed_s": time.monotonic() - started,
    }
    if both:
        document["fork_vs_spawn"] = fork_vs_spawn(sizes, rounds)
    print(json.dumps(document, indent=2))
    for check in checks:
        verdict = "met" if check["met"] else "NOT met"
        low, high = check["median_interval"]
        sure = "" if check["conclusive"] else " (inconclusive: the interval straddles the band)"
        log(
            f"{check['name']}: median ratio {check['median_ratio']:.3f} "
            f"[{check['min_ratio']:.3f}, {check['max_ratio']:.3f}], "
            f"{check['interval_coverage']:.0%} interval for the median [{low:.3f}, {high:.3f}]: "
            f"target {verdict}{sure}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
