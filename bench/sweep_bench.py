"""A sweep's wall time and the scheduler's overhead per pair, on a real Slurm cluster in network
namespaces (tests/slurm_cluster.py): six nodes, gloo ranks on the CPU, each node's veth shaped
to 400 Mbit/s with tbf. Runs `--sweeps` healthy sweeps in a row (the acceptance: no suspect in
20) and reports, side by side, where a pair's time goes:

- overhead: srun's submission to the first rank's process start (Slurm's job start and launch);
- ranks: the rank's start to its result (interpreter and torch import, rendezvous, measuring);
- the sweep's wall time, and its overhead's share of it.

    python bench/sweep_bench.py                 # 20 sweeps, about 6 minutes on 2 cores
    python bench/sweep_bench.py --sweeps 3

Needs root (network namespaces) and Debian's slurm-wlm and munge (scripts/test-deps). One JSON
document goes to stdout; progress to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.slurm_cluster import SlurmCluster

RATE = "400mbit"


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _config(work: Path, size: str, iters: int) -> Path:
    (work / "node.yaml").write_text(yaml.safe_dump({"env": {"GLOO_SOCKET_IFNAME": "eth0"}}))
    settings = {
        "size": size,
        "warmup": 2,
        "iters": iters,
        "node_config": str(work / "node.yaml"),
        "state_dir": str(work / "sweep"),
    }
    path = work / "sweep.yaml"
    path.write_text(yaml.safe_dump({"sweep": settings, "state_dir": str(work)}))
    return path


def one_sweep(cluster: SlurmCluster, config: Path, seed: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "netmon", "sweep", "--partition", "sweep", "--json"]
    started = time.monotonic()
    done = cluster.run([*argv, "--config", str(config), "--seed", str(seed)], timeout=600)
    wall = time.monotonic() - started
    report = json.loads(done.stdout)
    pairs = report["pairs"]
    overheads = [p["overhead_seconds"] for p in pairs if p["overhead_seconds"] is not None]
    ranks = [p["seconds"] - p["overhead_seconds"] for p in pairs if p["overhead_seconds"]]
    return {
        "exit": done.returncode,
        "wall_s": round(wall, 2),
        "rounds": report["rounds"],
        "pairs": len(pairs),
        "suspects": [s.get("node") or s.get("uplink") for s in report["suspects"]],
        "overhead_s": overheads,
        "ranks_s": ranks,
        "busbw": [p["busbw"] for p in pairs],
    }


def summary(sweeps: list[dict[str, Any]]) -> dict[str, Any]:
    overhead = [v for s in sweeps for v in s["overhead_s"]]
    ranks = [v for s in sweeps for v in s["ranks_s"]]
    walls = [s["wall_s"] for s in sweeps]
    busbw = [v for s in sweeps for v in s["busbw"] if v]
    return {
        "sweeps": len(sweeps),
        "suspects": sum(len(s["suspects"]) for s in sweeps),
        "exits": sorted({s["exit"] for s in sweeps}),
        "wall_s_median": round(statistics.median(walls), 2),
        "wall_s_max": round(max(walls), 2),
        "overhead_s_per_pair_median": round(statistics.median(overhead), 3),
        "overhead_s_per_pair_max": round(max(overhead), 3),
        "ranks_s_per_pair_median": round(statistics.median(ranks), 3),
        "overhead_share_of_pair": round(
            statistics.median(overhead) / (statistics.median(overhead) + statistics.median(ranks)),
            3,
        ),
        "busbw_median": statistics.median(busbw),
        "busbw_spread": round((max(busbw) - min(busbw)) / statistics.median(busbw), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--size", default="4M")
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench: needs root (network namespaces)", file=sys.stderr)
        return 2
    sweeps = []
    with tempfile.TemporaryDirectory(prefix="netmon-sweep-bench-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        config = _config(work, args.size, args.iters)
        with SlurmCluster(nodes=args.nodes) as cluster:
            for node in cluster.node_names:
                cluster.shape(node, RATE)
            for index in range(args.sweeps):
                sweeps.append(one_sweep(cluster, config, seed=index))
                log(f"sweep {index + 1}: {sweeps[-1]['wall_s']} s, {sweeps[-1]['suspects']}")
    document = {
        "bench": "sweep",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "setup": {"nodes": args.nodes, "rate": RATE, "size": args.size, "iters": args.iters},
        "summary": summary(sweeps),
        "sweeps": sweeps,
    }
    print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
