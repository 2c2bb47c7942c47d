"""The baseline state over a daemon's life: restored or not at start, forgotten where an operator
asks (`netmon rebaseline`) or the hardware changed, settling after a pause or a new rank zygote,
and the families that show it; real daemons where the behaviour is the daemon's."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import netmon.serve.results as results_module
from netmon import baseline
from netmon.config import parse_config
from netmon.exposition.collector import make_registry
from netmon.serve.current import CurrentConfig
from netmon.serve.keeper import BaselineKeeper
from netmon.serve.results import Results
from netmon.topology.identity import read_identity
from netmon.topology.model import Gpu, PathClass, Topology
from tests.daemon_harness import DaemonProcess, Samples, fast_config, series, wait_until
from tests.test_exporter import outcome

# Learns in two results (a young reference with them); every result is conclusive (no
# settling, never disturbed nor noisy) and judged, and only a collapse is low: gloo on a shared
# machine is noisy, and these tests are about the state, not about the rule.
POLICY = {
    "min_samples": 2,
    "window": 5,
    "settle": 0,
    "latency_bound_below": 0,
    "ratio": 0.1,
    "floor": 0.05,
    "max_foreign_cpu": 1.0,
    "noisy_cv_floor": 1000.0,
}
PROBES = [
    {"name": "small", "sizes": [8, "1K"], "interval": "1s", "iters": 3, "warmup": 1},
    {"name": "large", "sizes": ["64K"], "interval": "1s", "iters": 3, "warmup": 1},
]
SIZES = {"small": ("8", "1024"), "large": ("65536",)}
SERIES = [
    {"probe": p, "op": "all_reduce", "size_bytes": s, "path": "default", "ranks": "2"}
    for p, sizes in SIZES.items()
    for s in sizes
]
REFERENCE = "netmon_busbw_reference_bytes_per_second"
RESETS = "netmon_reference_resets_total"


def start(daemons: list[DaemonProcess], tmp_path: Path, **overrides: object) -> DaemonProcess:
    config = fast_config(tmp_path, probes=PROBES, baseline=POLICY, **overrides)
    daemon = DaemonProcess(tmp_path, config, f"d{len(daemons)}")
    daemons.append(daemon)
    return daemon


def rebaseline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "netmon", "rebaseline", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def of(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def requests_left(state: Path) -> list[str]:
    return sorted(p.name for p in (state / "rebaseline").glob("*.json"))


# --- restored or not, and requests left while no daemon runs


def test_restored_only_from_usable_state_and_requests_wait_for_the_next_start(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    first = start(daemons, tmp_path)
    assert first.value("netmon_baseline_restored") == 0.0
    assert "no baseline state at" in first.log()

    def saved_baselines() -> bool:
        try:
            doc = json.loads((state / "baselines.json").read_text())
        except (OSError, ValueError):
            return False
        return len([e for e in doc["baselines"] if len(e["learned"]) >= 2]) == len(SERIES)

    wait_until(saved_baselines, 60, "every series' baseline saved")
    assert first.stop() == 0

    # While no daemon runs: a request for one probe, and a file that is not a request.
    done = rebaseline("--config", str(first.config_path), "--probe", "large", "--reason", "cable")
    assert done.returncode == 0, done.stderr
    (state / "rebaseline" / "00000000000000000001-1.json").write_text('{"probes": 5}\n')
    (tmp_path / "pause").touch()  # nothing is measured: what shows comes from the state file

    again = start(daemons, tmp_path)
    samples = again.scrape()
    assert of(samples, "netmon_baseline_restored") == 1.0
    assert of(samples, RESETS, probe="large", reason="operator") == 1.0
    assert of(samples, RESETS, probe="small", reason="operator") == 0.0
    assert of(samples, RESETS, probe="large", reason="hardware") == 0.0
    log = again.log()
    assert "rebaseline: 1 series forget" in log and "(cable)" in log
    assert "is not one" in log and "set aside" in log
    assert requests_left(state) == []
    assert (state / "rebaseline" / "00000000000000000001-1.json.rejected").exists()
    # The restored small series: their baselines back, never judged since this start.
    started = of(samples, "netmon_start_time_seconds")
    for key in SERIES[:2]:
        assert (of(samples, "netmon_busbw_baseline_bytes_per_second", **key) or 0) > 0
        assert of(samples, "netmon_last_judged_timestamp_seconds", **key) == started
    assert of(samples, "netmon_busbw_baseline_bytes_per_second", **SERIES[2]) is None
    assert again.stop() == 0

    (state / "baselines.json").write_text('{"version": 2, "baselines": [{"probe": ')
    broken = start(daemons, tmp_path)
    assert broken.value("netmon_baseline_restored") == 0.0
    assert "starting without usable baseline state" in broken.log()
    assert list(state.glob("baselines.json.corrupt-*"))
    assert broken.stop() == 0
    assert "Traceback" not in first.log() + again.log() + broken.log()


def test_rebaseline_names_an_unknown_probe_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "netmon.yaml"
    config.write_text(json.dumps(fast_config(tmp_path, probes=PROBES)))
    done = rebaseline("--config", str(config), "--probe", "small", "--probe", "nosuch")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "nosuch" in done.stderr
    assert "Traceback" not in done.stderr
    assert requests_left(tmp_path / "state") == []  # nothing was left for the daemon


def test_rebaseline_forgets_every_probe_only_when_asked_to_with_all(tmp_path: Path) -> None:
    config = tmp_path / "netmon.yaml"
    config.write_text(json.dumps(fast_config(tmp_path, probes=PROBES)))
    (tmp_path / "state").mkdir()
    bare = rebaseline("--config", str(config))
    assert bare.returncode == 2 and "--probe NAME" in bare.stderr and "--all" in bare.stderr
    assert requests_left(tmp_path / "state") == []  # nothing requested
    both = rebaseline("--config", str(config), "--all", "--probe", "small")
    assert both.returncode == 2 and requests_left(tmp_path / "state") == []
    every = rebaseline("--config", str(config), "--all", "--reason", "new driver")
    assert every.returncode == 0 and "every probe" in every.stdout
    (left,) = requests_left(tmp_path / "state")
    assert json.loads((tmp_path / "state" / "rebaseline" / left).read_text())["probes"] == []


# --- a running daemon: its families, an operator's request, a save that fails


def test_a_running_daemon_shows_its_verdicts_applies_requests_and_counts_failed_saves(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    daemon = start(daemons, tmp_path)
    samples = daemon.scrape()
    assert of(samples, "netmon_baseline_restored") == 0.0
    assert of(samples, "netmon_state_write_errors_total") == 0.0
    for probe in SIZES:
        for reason in baseline.RESET_REASONS:
            assert of(samples, RESETS, probe=probe, reason=reason) == 0.0

    def referenced() -> Samples | None:
        got = daemon.scrape()
        runs = [of(got, "netmon_probe_runs_total", probe=p) or 0 for p in SIZES]
        return got if all(of(got, REFERENCE, **key) for key in SERIES) and min(runs) >= 5 else None

    samples = wait_until(referenced, 60, "a reference for every series, five runs each")
    now, started = time.time(), of(samples, "netmon_start_time_seconds")
    assert started is not None
    for key in SERIES:
        judged_at = of(samples, "netmon_last_judged_timestamp_seconds", **key)
        # Every result is conclusive here: judged when it was measured, seconds ago.
        assert judged_at == of(samples, "netmon_measurement_timestamp_seconds", **key)
        assert judged_at is not None and started < judged_at <= now
        assert now - judged_at < 10
        for reason in baseline.DEGRADED_REASONS:
            assert of(samples, "netmon_degraded_reason", **key, reason=reason) == 0.0
        assert of(samples, "netmon_judged_at_floor", **key) in (0.0, 1.0)
    kept = of(samples, REFERENCE, **SERIES[2])

    done = rebaseline(
        "--config", str(daemon.config_path), "--probe", "small", "--reason", "new driver"
    )
    assert done.returncode == 0, done.stderr

    def applied() -> Samples | None:
        got = daemon.scrape()
        forgotten = not any(of(got, REFERENCE, **key) for key in SERIES[:2])
        return got if of(got, RESETS, probe="small", reason="operator") and forgotten else None

    samples = wait_until(applied, 30, "the request applied at the next result")
    assert of(samples, RESETS, probe="small", reason="operator") == 2.0
    assert of(samples, RESETS, probe="large", reason="operator") == 0.0
    assert of(samples, RESETS, probe="small", reason="hardware") == 0.0
    # The other probe's series keep their reference (young still: it follows the hour's
    # learned results until it has a day of them, docs/SIGNAL.md).
    assert (of(samples, REFERENCE, **SERIES[2]) or 0) > 0 and (kept or 0) > 0
    assert "rebaseline: 2 series forget" in daemon.log() and "(new driver)" in daemon.log()
    assert requests_left(state) == []

    # Paused: once each probe has skipped a run, none is in flight and the counts hold still.
    def quiet() -> Samples | None:
        got = daemon.scrape()
        skipped = [of(got, "netmon_probe_skips_total", probe=p, reason="paused") for p in SIZES]
        return got if all(skipped) else None

    (tmp_path / "pause").touch()
    samples = wait_until(quiet, 30, "a paused skip of each probe")
    failures = series(samples, "netmon_probe_failures_total")
    for probe, sizes in SIZES.items():
        runs = of(samples, "netmon_probe_runs_total", probe=probe) or 0
        ok = runs - sum(v for k, v in failures.items() if dict(k)["probe"] == probe)
        # Every result of a judged series, conclusive or not (here all are conclusive).
        counted = of(samples, "netmon_series_results_total", probe=probe)
        assert ok >= 5 and counted == len(sizes) * ok

    # The state directory is gone (a file in its place): every save fails, and is counted.
    state.rename(tmp_path / "state.moved")
    state.write_text("not a directory\n")
    (tmp_path / "pause").unlink()
    wait_until(
        lambda: (daemon.value("netmon_state_write_errors_total") or 0) >= 2,
        30,
        "failed saves counted",
    )
    assert "cannot save baselines" in daemon.log()
    assert daemon.stop() == 0
    assert "Traceback" not in daemon.log()


# --- hardware identity, through a fake /sys


KEYS: list[baseline.BaselineKey] = [
    ("small", "all_reduce", 1 << 20, "default", 2),
    ("group", "all_reduce", 1 << 20, "group", 16),
    ("pairs", "all_reduce", 1 << 20, "node_pair", 2),
]


def topology(*uuids: str) -> Topology:
    gpus = tuple(Gpu(index=i, uuid=u) for i, u in enumerate(uuids))
    nv = PathClass("NV4")
    path = {(a.index, b.index): nv for a in gpus for b in gpus if a != b}
    return Topology(gpus=gpus, path=path)


def sysfs(root: Path, mac: str = "b8:3f:d2:01:02:03", veth: str = "02:00:00:00:00:01") -> Path:
    """The parts of /sys that name a node's hardware, as a real node lays them out."""
    for relative, text in {
        "class/infiniband/mlx5_0/node_guid": "0c42:a103:0010:2b3c",
        "class/infiniband/mlx5_1/node_guid": "0000:0000:0000:0000",  # no id: left out
        "class/net/eth0/addr_assign_type": "0",
        "class/net/eth0/address": mac,
        # A virtual interface (no device): its address may change on every start, left out.
        "class/net/veth1/addr_assign_type": "0",
        "class/net/veth1/address": veth,
        "class/dmi/id/product_uuid": "4c4c4544-0042-3510-8057-b4c04f4e3432",
        "devices/pci0000:00/0000:00:03.0/vendor": "0x15b3",
    }.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text + "\n")
    device = root / "class/net/eth0/device"
    if not device.exists():
        device.symlink_to(root / "devices/pci0000:00/0000:00:03.0")
    return root


def test_hardware_identity_forgets_only_the_series_on_a_changed_part(tmp_path: Path) -> None:
    policy = baseline.BaselinePolicy(**POLICY)
    gpus = topology("GPU-aaaa", "GPU-bbbb")
    identity = read_identity(gpus, sysfs(tmp_path / "sys"))
    assert identity == {
        "gpus": ("GPU-aaaa", "GPU-bbbb"),
        "nics": ("0c42:a103:0010:2b3c", "b8:3f:d2:01:02:03"),
        "node": ("4c4c4544-0042-3510-8057-b4c04f4e3432",),
    }
    saved = tmp_path / "saved.json"
    keeper = BaselineKeeper.open(saved, policy, identity)
    assert not keeper.restored
    for n in range(6):
        for key in KEYS:
            keeper.book.observe(key, 10e9, at=float(n))
    keeper.save()
    doc = json.loads(saved.read_text())
    assert doc["version"] == 3
    assert doc["identity"] == {part: list(ids) for part, ids in identity.items()}

    def reopen(name: str, root: Path) -> tuple[BaselineKeeper, set[baseline.BaselineKey]]:
        """The saved book opened on the hardware `root` and `gpus` describe; the keys whose
        reference survived."""
        path = tmp_path / f"{name}.json"
        path.write_bytes(saved.read_bytes())
        opened = BaselineKeeper.open(path, policy, read_identity(gpus, root))
        assert opened.restored
        kept = {k for k, v in opened.book.verdicts().items() if v.reference is not None}
        return opened, kept

    def hardware_resets(opened: BaselineKeeper) -> dict[str, int]:
        resets = opened.resets(k[0] for k in KEYS)
        return {probe: n for (probe, why), n in resets.items() if why == "hardware"}

    same, kept = reopen("same", sysfs(tmp_path / "same", veth="02:00:00:00:00:02"))
    assert kept == set(KEYS) and hardware_resets(same) == {"small": 0, "group": 0, "pairs": 0}

    nic, kept = reopen("nic", sysfs(tmp_path / "nic", mac="b8:3f:d2:09:09:09"))
    assert kept == {KEYS[0]}
    assert hardware_resets(nic) == {"small": 0, "group": 1, "pairs": 1}
    # The new identity is the one kept: the next start on this hardware forgets nothing more.
    assert json.loads((tmp_path / "nic.json").read_text())["identity"]["nics"] == [
        "0c42:a103:0010:2b3c",
        "b8:3f:d2:09:09:09",
    ]

    unreadable = sysfs(tmp_path / "unreadable")
    for part in ("class/infiniband/mlx5_0/node_guid", "class/net/eth0/address"):
        (unreadable / part).unlink()
    (unreadable / "class/dmi/id/product_uuid").unlink()
    absent, kept = reopen("absent", unreadable)
    assert kept == set(KEYS) and not any(hardware_resets(absent).values())
    # What cannot be read now is not forgotten either: the file still names it.
    assert json.loads((tmp_path / "absent.json").read_text())["identity"] == doc["identity"]

    board = sysfs(tmp_path / "node")
    (board / "class/dmi/id/product_uuid").write_text("another-board\n")
    node, kept = reopen("node", board)
    assert kept == set() and hardware_resets(node) == {"small": 1, "group": 1, "pairs": 1}

    gpus = topology("GPU-aaaa", "GPU-cccc")
    swapped, kept = reopen("gpu", sysfs(tmp_path / "sys"))
    assert kept == set() and hardware_resets(swapped) == {"small": 1, "group": 1, "pairs": 1}


# --- settling: after a pause, after a new rank zygote


def test_a_result_after_a_pause_settles_again() -> None:
    book = baseline.BaselineBook(baseline.BaselinePolicy(**{**POLICY, "settle": 2}))
    key = KEYS[0]

    def reasons(*times: float, resettle: bool = False) -> list[str | None]:
        return [
            book.observe(key, 10e9, at=t, resettle=resettle and i == 0).inconclusive
            for i, t in enumerate(times)
        ]

    assert reasons(0, 1, 2, 3) == ["settling", "settling", None, None]
    assert reasons(80) == [None]  # a gap alone is not a pause: its probe may have run meanwhile
    assert reasons(81, 82, 83, resettle=True) == ["settling", "settling", None]
    book.resettle()
    assert reasons(84, 85, 86) == ["settling", "settling", None]


def test_a_new_rank_zygote_or_a_pause_settles_every_series_and_every_result_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = parse_config(
        {
            **fast_config(tmp_path, probes=PROBES),
            "baseline": {**POLICY, "settle": 1},
        }
    )
    assert config.probes is not None
    results = Results(
        CurrentConfig(config),
        BaselineKeeper(baseline.BaselineBook(config.baseline), tmp_path / "b.json"),
    )

    def run_all() -> list[str | None]:
        found = []
        for probe in config.probes or ():
            results.started(probe.name)
            found += [v.inconclusive for v in results.finished(probe, outcome(config, probe))]
        return found

    assert run_all() == ["settling"] * 3
    assert run_all() == [None] * 3
    results.zygote_started()
    assert run_all() == ["settling"] * 3
    assert run_all() == [None] * 3
    # The wall clock steps an hour forward: no time passed, so no pause and nothing settles.
    stepped = time.time() + 3600
    clock = SimpleNamespace(time=lambda: stepped, monotonic=time.monotonic)
    monkeypatch.setattr(results_module, "time", clock)
    assert run_all() == [None] * 3
    # The probes then do not run for longer than two intervals (paused, GPUs held by jobs):
    # their next results settle again.
    later = time.monotonic() + 10 * max(p.interval for p in config.probes)
    clock.monotonic = lambda: later
    assert run_all() == ["settling"] * 3
    assert run_all() == [None] * 3

    registry = make_registry(results.snapshot)
    for probe, sizes in SIZES.items():
        settling = {"probe": probe, "reason": "settling"}
        assert registry.get_sample_value("netmon_inconclusive_results_total", settling) == 3 * len(
            sizes
        )
        total = registry.get_sample_value("netmon_series_results_total", {"probe": probe})
        assert total == 7 * len(sizes)  # seven runs, one after the step of the wall clock
    assert registry.get_sample_value("netmon_zygote_starts_total") == 1
