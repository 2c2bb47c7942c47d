"""A real daemon reading the jobs' NCCL Inspector files: the shapes exported as probe="jobs"
series within a bound, a node shape cut in the files judged degraded and cleared, and hostile
files counted while /metrics keeps serving."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.daemon_harness import DaemonProcess, Samples, fast_config, wait_until
from tests.inspector_files import Comm, marked_root, prom_dump, training_comms

TP = {
    "probe": "jobs",
    "op": "all_reduce",
    "size_bytes": str(64 << 20),
    "path": "node",
    "ranks": "8",
}


def _config(tmp_path: Path) -> dict[str, object]:
    config = fast_config(
        tmp_path,
        inspector={
            "dir": str(marked_root(tmp_path / "inspector")),
            "interval": 1,
            "window": 1,
            "min_collectives": 1,
        },
    )
    for probe in config["probes"]:  # type: ignore[attr-defined]
        probe["interval"] = "30s"  # the jobs' files are what this test is about
    return config


def _new_series(samples: Samples) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    return {
        key for key in samples if key[0].startswith("netmon_jobs_") or ("probe", "jobs") in key[1]
    }


class Training:
    """A job on this node writing a dump whenever the daemon has read the last one."""

    def __init__(self, root: Path, daemon: DaemonProcess, seed: int) -> None:
        self.root, self.daemon = root, daemon
        self.random = random.Random(seed)
        self.dumps = 0

    def dump(self, comms: list[Comm], cut: float = 1.0) -> Samples:
        self.dumps += 1
        at = time.time()

        def busbw_of(comm: Comm, _gpu: int) -> float:
            level = 330.0 if comm.nnodes == 1 else 45.0
            slow = cut if comm.comm_id == comms[0].comm_id else 1.0
            return level * slow * self.random.lognormvariate(0, 0.02)

        prom_dump(self.root / "4242", comms, busbw_of, at, self.dumps)
        # A second job in the first communicator's shape: a cut needs two jobs' word.
        prom_dump(self.root / "4343", comms[:1], busbw_of, at, self.dumps, job="4343")

        def read_since() -> Samples | None:
            samples = self.daemon.scrape()
            read_at = samples.get(("netmon_jobs_last_read_timestamp_seconds", frozenset()), 0.0)
            return samples if read_at > at else None

        found: Samples = wait_until(read_since, 20, "the daemon to read the dump")
        return found


def _varied(random_: random.Random) -> list[Comm]:
    """The 16 communicators, with the data-parallel buckets' and the small groups' sizes
    changing from dump to dump as a real job's do (gradient buckets, an evaluation's)."""
    comms = training_comms()
    return [
        Comm(
            c.comm_id,
            c.coll,
            c.message_bytes * random_.choice((1, 2, 4)),
            c.nranks,
            c.nnodes,
            c.gpus,
        )
        if k > 0
        else c
        for k, c in enumerate(comms)
    ]


def test_the_jobs_shapes_are_exported_bounded_judged_and_cleared(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path, _config(tmp_path))
    try:
        training = Training(tmp_path / "inspector", daemon, 3620)
        rng = random.Random(3621)
        # An hour of a job's shapes, compressed: every dump changes the sizes it shows.
        for _ in range(12):
            samples = training.dump(_varied(rng))
        exported = _new_series(samples)
        assert len(exported) <= 200, len(exported)
        assert samples[("netmon_jobs_shapes", frozenset())] == 6  # the cap, reached
        assert samples[("netmon_jobs_shape_overflow_total", frozenset())] > 0
        assert samples[("netmon_jobs_collectives_total", frozenset({("path", "node")}))] > 0
        assert ("netmon_busbw_bytes_per_second", frozenset(TP.items())) in samples
        # The tensor-parallel all_reduce cut to 70 %: degraded within 10 samples, then clears.
        comms = training_comms()
        for _ in range(8):
            samples = training.dump(comms)
        judged = samples.get(("netmon_judged", frozenset(TP.items())))
        assert judged == 1, judged
        flagged = _dumps_until(
            training, comms, 0.7, lambda s: s.get(("netmon_degraded", frozenset(TP.items()))) == 1
        )
        assert flagged <= 10, flagged
        cleared = _dumps_until(
            training, comms, 1.0, lambda s: s.get(("netmon_degraded", frozenset(TP.items()))) == 0
        )
        assert cleared <= 60, cleared
        assert "degraded: jobs all_reduce 67108864 B path node ranks 8" in daemon.log()
    finally:
        daemon.stop()


def _dumps_until(
    training: Training, comms: list[Comm], cut: float, done: Callable[[Samples], bool]
) -> int:
    for n in range(1, 80):
        if done(training.dump(comms, cut)):
            return n
    raise AssertionError("never")


def test_hostile_files_are_counted_and_metrics_keep_serving(tmp_path: Path) -> None:
    root = tmp_path / "inspector"
    job = root / "666"
    job.mkdir(parents=True)
    outside = tmp_path / "secret.prom"
    prom_dump(tmp_path / "elsewhere", training_comms(), lambda _c, _g: 300.0, time.time(), 1)
    outside.write_bytes(next((tmp_path / "elsewhere").iterdir()).read_bytes())
    (job / "link.prom").symlink_to(outside)
    with open(job / "huge.prom", "wb") as out:
        out.truncate(1 << 30)
    (job / "bad.prom").write_bytes(b"\xff\xfe\n" + b"x" * 100_000 + b"\n")
    os.mkfifo(job / "fifo.prom")
    daemon = DaemonProcess(tmp_path, _config(tmp_path))
    try:

        def counted() -> Samples | None:
            samples = daemon.scrape()
            reasons = {"symlink", "too_large", "not_utf8", "oversized_line", "not_a_file"}
            got = {
                r
                for r in reasons
                if samples.get(("netmon_jobs_rejected_total", frozenset({("reason", r)})))
            }
            return samples if got == reasons else None

        samples = wait_until(counted, 20, "every hostile file counted")
        assert samples[("netmon_jobs_collectives_total", frozenset({("path", "node")}))] == 0
        assert daemon.proc.poll() is None
        assert "symlink" in daemon.log()
    finally:
        assert daemon.stop() == 0


def test_an_operator_can_rebaseline_the_jobs_series(tmp_path: Path) -> None:
    config_path = tmp_path / "netmon.yaml"
    config_path.write_text(yaml.safe_dump(_config(tmp_path)))
    (tmp_path / "state").mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "netmon",
            "rebaseline",
            "--config",
            str(config_path),
            "--probe",
            "jobs",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "rebaseline requested for jobs" in done.stdout
