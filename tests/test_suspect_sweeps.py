"""Sweeps in a row that named a GPU pair, a GPU, a node or a node pair (netmon.probe.streaks):
counted by the daemon over the sweeps that measured the subject, and exported beside the flags
with the time of the measurement, which the alerts need two of and judge the age of."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from netmon import baseline
from netmon.config import NetmonConfig, ProbeConfig
from netmon.exposition.collector import make_registry
from netmon.group.members import GroupConfig
from netmon.probe.pairs import PairOutcome
from netmon.probe.spec import ProbeFailure, ProbeOutcome
from netmon.probe.streaks import Streak, advance
from netmon.probe.verdict import Pair
from netmon.serve.current import CurrentConfig
from netmon.serve.keeper import BaselineKeeper
from netmon.serve.known import load_interval
from netmon.serve.results import Results
from tests.test_cardinality import PAIRS, dgx_config, outcome
from tests.test_group_plan import A, B, C, FabricReads, coordinator, node_config

# --- the count, pure


def test_a_sweep_that_measures_and_names_a_subject_adds_one_one_that_does_not_resets() -> None:
    before = {"a": Streak(1, 10.0), "b": Streak(3, 10.0)}
    after = advance(before, measured=["a", "b", "c"], named={"a", "c"}, at=20.0)
    assert after == {"a": Streak(2, 20.0), "b": Streak(0, 20.0), "c": Streak(1, 20.0)}
    assert before == {"a": Streak(1, 10.0), "b": Streak(3, 10.0)}  # a new mapping, not an edit


def test_a_sweep_that_does_not_measure_a_subject_leaves_its_count_and_time_named_or_not() -> None:
    before = {"a": Streak(1, 10.0), "b": Streak(0, 10.0)}
    # "a" named on an old result (the sweep skipped it): no second opinion; "b" not seen at all.
    after = advance(before, measured=["c"], named={"a"}, at=20.0)
    assert after == {"a": Streak(1, 10.0), "b": Streak(0, 10.0), "c": Streak(0, 20.0)}


def test_a_subject_measured_twice_in_one_sweep_counts_once() -> None:
    assert advance({}, measured=["a", "a"], named={"a"}, at=1.0) == {"a": Streak(1, 1.0)}


# --- GPU pairs and GPUs, through the daemon's record and the exporter

FOUR = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))


def pair(config: NetmonConfig, gpus: Pair, busbw: float, failed: bool = False) -> PairOutcome:
    base = outcome(PAIRS, config)
    results = tuple(r.model_copy(update={"busbw_bytes_per_second": busbw}) for r in base.results)
    failure = ProbeFailure(phase="measure", rank=1, cause="timeout", detail="late")
    update = {"results": () if failed else results, "failure": failure if failed else None}
    return PairOutcome(gpus, "NV18", ProbeOutcome.model_validate({**dict(base), **update}))


def sweep(results: Results, config: NetmonConfig, busbw: Mapping[Pair, float | None]) -> None:
    """One sweep of the pairs given (None: the pair's run failed); the others were skipped."""
    measured = [pair(config, p, v or 0.0, failed=v is None) for p, v in busbw.items()]
    results.finished_pairs(PAIRS, measured, 1.0)


def value(results: Results, name: str, **labels: str) -> float | None:
    return make_registry(results.snapshot).get_sample_value(name, {"probe": "pairs", **labels})


def link(results: Results, a: int, b: int) -> float | None:
    labels = {"gpu": str(a), "peer_gpu": str(b), "path": "NV18"}
    return value(results, "netmon_link_suspect_sweeps", **labels)


@pytest.fixture
def daemon() -> tuple[Results, NetmonConfig]:
    config = dgx_config()
    config = config.model_copy(update={"probes": (*(config.probes or ()), PAIRS)})
    keeper = BaselineKeeper(baseline.BaselineBook(config.baseline))
    return Results(CurrentConfig(config), keeper), config


def test_a_pair_counts_the_sweeps_that_measured_and_named_it(
    daemon: tuple[Results, NetmonConfig],
) -> None:
    results, config = daemon
    slow = {p: 100e9 for p in FOUR} | {(0, 1): 10e9}  # 0-1 a tenth of its class median
    sweep(results, config, slow)
    assert link(results, 0, 1) == 1.0 and link(results, 2, 3) == 0.0
    assert value(results, "netmon_link_suspect", gpu="0", peer_gpu="1", path="NV18") == 1.0
    sweep(results, config, slow)
    assert link(results, 0, 1) == 2.0
    # A sweep with 0-1 busy: its last result is still named, but nothing new agreed.
    sweep(results, config, {p: 100e9 for p in FOUR if p != (0, 1)})
    assert link(results, 0, 1) == 2.0
    # Its run failed: no point for the pair (no series), and the count waits.
    sweep(results, config, {(0, 1): None})
    assert link(results, 0, 1) is None
    sweep(results, config, slow)
    assert link(results, 0, 1) == 3.0
    # Measured healthy: back to 0.
    sweep(results, config, {p: 100e9 for p in FOUR})
    assert link(results, 0, 1) == 0.0


def test_a_gpu_counts_the_sweeps_that_measured_one_of_its_pairs_and_named_it(
    daemon: tuple[Results, NetmonConfig],
) -> None:
    results, config = daemon
    gpu3_slow = {p: 10e9 if 3 in p else 100e9 for p in FOUR}
    sweep(results, config, gpu3_slow)
    sweep(results, config, gpu3_slow)
    assert value(results, "netmon_gpu_suspect_sweeps", gpu="3") == 2.0
    assert value(results, "netmon_gpu_suspect_sweeps", gpu="0") == 0.0
    # Its pairs are not named apart from the GPU that explains them.
    assert link(results, 0, 3) == 0.0
    measured_3 = value(results, "netmon_gpu_measurement_timestamp_seconds", gpu="3")
    assert measured_3 is not None
    # A sweep that measured none of GPU 3's pairs: its count and its time stay.
    sweep(results, config, {(0, 1): 100e9})
    assert value(results, "netmon_gpu_suspect_sweeps", gpu="3") == 2.0
    assert value(results, "netmon_gpu_measurement_timestamp_seconds", gpu="3") == measured_3
    measured_0 = value(results, "netmon_gpu_measurement_timestamp_seconds", gpu="0")
    assert measured_0 is not None and measured_0 >= measured_3
    # GPUs never measured since the start have a count of 0 and no time.
    assert value(results, "netmon_gpu_measurement_timestamp_seconds", gpu="7") is None


def test_a_reload_that_removes_the_pairs_probe_forgets_its_counts(
    daemon: tuple[Results, NetmonConfig],
) -> None:
    results, config = daemon
    slow = {p: 100e9 for p in FOUR} | {(0, 1): 10e9}
    sweep(results, config, slow)
    results.reconfigure(dgx_config())
    results.reconfigure(config)  # added back: counts from 0, as at a start
    sweep(results, config, slow)
    assert link(results, 0, 1) == 1.0


# --- node pairs of a group, as its leader judges them


def peer_value(results: Results, name: str, **labels: str) -> float | None:
    return make_registry(results.snapshot).get_sample_value(name, {"probe": "nodes", **labels})


def test_the_leader_counts_sweeps_that_named_a_member_or_a_node_pair(
    daemon: tuple[Results, NetmonConfig],
) -> None:
    results, _ = daemon
    members = ("a", "b", "c", "d")
    every = [(x, y) for i, x in enumerate(members) for y in members[i + 1 :]]
    # d slow with every peer, twice; the pair a-b once.
    results.set_peer_verdict("nodes", members, ("d",), (), every)
    results.set_peer_verdict("nodes", members, ("d",), (("b", "a"),), every)
    assert peer_value(results, "netmon_peer_suspect_sweeps", peer="d") == 2.0
    assert peer_value(results, "netmon_peer_suspect_sweeps", peer="a") == 0.0
    pair_ab = {"member": "a", "peer": "b"}  # the lower-named member first
    assert peer_value(results, "netmon_peer_link_suspect_sweeps", **pair_ab) == 1.0
    assert peer_value(results, "netmon_peer_link_suspect", **pair_ab) == 1.0
    at_d = peer_value(results, "netmon_peer_measurement_timestamp_seconds", peer="d")
    assert at_d is not None
    # A sweep in which every pair with d failed: d is not measured, its count and time stay.
    without_d = [(x, y) for x, y in every if "d" not in (x, y)]
    results.set_peer_verdict("nodes", members, (), (("a", "b"),), without_d)
    assert peer_value(results, "netmon_peer_suspect_sweeps", peer="d") == 2.0
    assert peer_value(results, "netmon_peer_measurement_timestamp_seconds", peer="d") == at_d
    assert peer_value(results, "netmon_peer_link_suspect_sweeps", **pair_ab) == 2.0
    # Measured and not named: back to 0; every measured pair has its count and time.
    results.set_peer_verdict("nodes", members, (), (), every)
    assert peer_value(results, "netmon_peer_suspect_sweeps", peer="d") == 0.0
    assert peer_value(results, "netmon_peer_link_suspect_sweeps", **pair_ab) == 0.0
    for x, y in every:
        labels = {"member": x, "peer": y}
        assert peer_value(results, "netmon_peer_link_measurement_timestamp_seconds", **labels)


def test_a_member_no_longer_in_the_sweep_leaves_no_series_behind(
    daemon: tuple[Results, NetmonConfig],
) -> None:
    results, _ = daemon
    four = ("a", "b", "c", "d")
    results.set_peer_verdict(
        "nodes", four, ("d",), (), [(x, y) for x in four for y in four if x < y]
    )
    ad = {"member": "a", "peer": "d"}
    assert peer_value(results, "netmon_peer_link_suspect_sweeps", **ad) == 0.0
    three = ("a", "b", "c")
    results.set_peer_verdict("nodes", three, (), (), [("a", "b"), ("a", "c"), ("b", "c")])
    for name in (
        "netmon_peer_link_suspect_sweeps",
        "netmon_peer_link_measurement_timestamp_seconds",
    ):
        assert peer_value(results, name, **ad) is None
        assert peer_value(results, name, member="a", peer="b") is not None
    assert peer_value(results, "netmon_peer_suspect_sweeps", peer="d") is None
    assert peer_value(results, "netmon_peer_measurement_timestamp_seconds", peer="d") is None


# --- the lead changing hands: the coordinator of member A (never started), in a group of three


@pytest.fixture
def member_a(tmp_path: Path) -> tuple[Results, Callable[[], None]]:
    """Member A's results, and a round of the node_pairs probe "peers" that B leads
    and A sits out (the pair B-C), taken by A's real follower code."""
    two = node_config(tmp_path, "any")
    assert two.group is not None
    fields = two.group.model_dump(exclude_unset=True)
    group = GroupConfig.model_validate({**fields, "members": [A, B, C]})
    config = two.model_copy(update={"group": group})
    rounds = coordinator(config, FabricReads(()), tmp_path / "absent")
    (probe,) = [p for p in config.probes or () if p.name == "peers"]
    epochs = iter(range(1, 100))

    def b_leads_a_round() -> None:
        epoch = next(epochs)
        rounds.node_pairs.follow(B, f"netmon/{epoch}/", probe, {"pairs": [[B, C]]}, epoch)

    return rounds.results, b_leads_a_round


def peers_value(results: Results, name: str, **labels: str) -> float | None:
    return make_registry(results.snapshot).get_sample_value(name, {"probe": "peers", **labels})


EVERY = [(A, B), (A, C), (B, C)]


def test_a_member_that_takes_the_lead_back_counts_from_0(
    member_a: tuple[Results, Callable[[], None]],
) -> None:
    results, b_leads_a_round = member_a
    members = (A, B, C)
    # A leads: C slow with every peer, and the pair A-B named.
    results.set_peer_verdict("peers", members, (C,), ((A, B),), EVERY)
    assert peers_value(results, "netmon_peer_suspect_sweeps", peer=C) == 1.0
    # A loses the lead; B judges two sweeps (C healthy, for all A knows) that A follows.
    b_leads_a_round()
    b_leads_a_round()
    # While following, A still exports its last verdict: its age is what the alerts read.
    assert peers_value(results, "netmon_peer_suspect_sweeps", peer=C) == 1.0
    # A leads again and names C once, in a sweep that did not measure A-B: one sweep, not two,
    # and nothing of the verdict before (A-B's count and time) survives.
    results.set_peer_verdict("peers", members, (C,), (), [(A, C), (B, C)])
    assert peers_value(results, "netmon_peer_suspect_sweeps", peer=C) == 1.0
    ab = {"member": A, "peer": B}
    assert peers_value(results, "netmon_peer_link_suspect_sweeps", **ab) is None
    assert peers_value(results, "netmon_peer_link_measurement_timestamp_seconds", **ab) is None
    # Still leading: the next sweep that names C is the second in a row.
    results.set_peer_verdict("peers", members, (C,), (), EVERY)
    assert peers_value(results, "netmon_peer_suspect_sweeps", peer=C) == 2.0


def test_a_member_that_leads_for_the_first_time_counts_from_0_and_on(
    member_a: tuple[Results, Callable[[], None]],
) -> None:
    results, b_leads_a_round = member_a
    b_leads_a_round()  # A started while B led
    assert peers_value(results, "netmon_peer_suspect_sweeps", peer=C) is None
    for count in (1.0, 2.0, 3.0):
        results.set_peer_verdict("peers", (A, B, C), (C,), (), EVERY)
        assert peers_value(results, "netmon_peer_suspect_sweeps", peer=C) == count


# --- how often the PCIe links are read under load


def test_the_pcie_reading_interval_is_the_shortest_pcie_path_probe_s() -> None:
    config = dgx_config()
    assert load_interval(config) == 0.0  # the embedded probes run the default path only
    pcie = (
        ProbeConfig(name="hourly", sizes=(1 << 30,), interval=3600, paths=("default", "pcie")),
        ProbeConfig(name="often", sizes=(1 << 30,), interval=900, paths=("pcie",)),
    )
    with_pcie = config.model_copy(update={"probes": pcie})
    assert load_interval(with_pcie) == 900.0
    assert load_interval(with_pcie.model_copy(update={"backend": "gloo"})) == 0.0
    keeper = BaselineKeeper(baseline.BaselineBook(config.baseline))
    registry = make_registry(Results(CurrentConfig(with_pcie), keeper).snapshot)
    assert registry.get_sample_value("netmon_pcie_link_load_interval_seconds") == 900.0
