"""The one spec builder (netmon.probe.build) on a simulated DGX H100 node (the published 8-GPU NV18
topology: GPUs 0-3 on NUMA node 0, 4-7 on node 1): every probe kind resolves the rank wrapper's
{rank}, {gpu} and {numa} the same way, and pair probes stay on the configured GPUs, idle-checked
and locked. What each rank would have been given (its command and CUDA environment) is recorded
from the real launcher and asserted."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from netmon import baseline
from netmon.config import NetmonConfig, ProbeConfig, parse_config, resolve
from netmon.gpu import idle, idle_sources
from netmon.group.members import World
from netmon.probe import nccl_debug, transport_faults
from netmon.probe.build import Placement, SpecError, build_spec
from netmon.probe.launcher import Launcher
from netmon.probe.pairs import pair_placement
from netmon.probe.spec import ProbeEnvironment, ProbeOutcome, ProbeSpec, SizeResult
from netmon.serve.current import CurrentConfig
from netmon.serve.keeper import BaselineKeeper
from netmon.serve.readiness import DeviceLocks, Readiness
from netmon.serve.results import Results
from netmon.serve.runner import ProbeRunner
from netmon.topology.model import Gpu, Topology
from netmon.topology.parse import parse_topo_matrix
from tests.conftest import wait_for

FIXTURES = Path(__file__).parent / "fixtures"
NUMA_WRAPPER = ["numactl", "--cpunodebind={numa}", "--membind={numa}"]


def dgx_h100() -> Topology:
    text = (FIXTURES / "topo_8xH100_sxm_nv18_nonic_mlengineering.txt").read_text()
    return parse_topo_matrix(text)


def node(tmp_path: Path, **settings: Any) -> NetmonConfig:
    document: dict[str, Any] = {
        "backend": "nccl",
        "devices": [str(i) for i in range(8)],
        "state_dir": str(tmp_path / "state"),
        "pause_file": str(tmp_path / "pause"),
        "pause_dir": str(tmp_path / "pause.d"),
        "rank_wrapper": NUMA_WRAPPER,
        "probes": [{"name": "small", "sizes": [8], "interval": "1s"}],
        "idle": {"samples": 1, "sample_interval": 0},
    }
    document.update(settings)
    return resolve(parse_config(document), gpus=8)


def probe_of(config: NetmonConfig, name: str = "small") -> ProbeConfig:
    return next(p for p in config.probes or () if p.name == name)


def numa_nodes(spec: ProbeSpec) -> dict[int, str]:
    return {rank: command[1].split("=")[1] for rank, command in spec.wrappers}


def test_numa_is_resolved_for_a_collective_probe(tmp_path: Path) -> None:
    config = node(tmp_path)
    spec = build_spec(probe_of(config), config, topology=dgx_h100())
    assert spec.ranks == 8 and spec.devices == tuple(str(i) for i in range(8))
    assert numa_nodes(spec) == {r: "0" if r < 4 else "1" for r in range(8)}
    assert spec.intent == "nvlink"  # every two of the 8 GPUs share NVLink (NV18)


def test_numa_is_resolved_for_a_pair_probe(tmp_path: Path) -> None:
    config = node(tmp_path)
    placement = pair_placement((3, 6), "nccl")
    spec = build_spec(probe_of(config), config, placement=placement, topology=dgx_h100())
    assert spec.devices == ("3", "6") and spec.ranks == 2
    assert numa_nodes(spec) == {0: "0", 1: "1"}
    # The pair's own ring settings, under the operator's environment.
    assert spec.env_dict()["NCCL_ALGO"] == "Ring" and spec.env_dict()["NCCL_NVLS_ENABLE"] == "0"


def test_numa_is_resolved_for_the_local_ranks_of_a_group_round(tmp_path: Path) -> None:
    config = node(tmp_path, devices=["4", "5"], env={"NCCL_ALGO": "Tree"})
    world = World(("a:1", "b:1"), {"a:1": (0, 1), "b:1": (2, 3)}, "10.0.0.1")
    placement = Placement(
        devices=("0", "1", "4", "5"),
        ranks=world.size,
        host=world.host,
        reporters=world.reporters,
        local_ranks=world.ranks_of["b:1"],
        env={"NCCL_SOCKET_IFNAME": "eth1"},
        label="group",
        intent="any",
    )
    spec = build_spec(probe_of(config), config, placement=placement, topology=dgx_h100())
    assert numa_nodes(spec) == {2: "1", 3: "1"}  # only the ranks started here
    assert (spec.host, spec.reporters, spec.path, spec.ranks) == ("10.0.0.1", (0, 2), "group", 4)
    assert spec.env_dict()["NCCL_ALGO"] == "Tree"  # the operator's setting wins


def test_numa_of_a_gpu_named_by_uuid_is_found(tmp_path: Path) -> None:
    topology = dgx_h100()
    gpus = tuple(g if g.index != 5 else _with_uuid(g, "GPU-5abc") for g in topology.gpus)
    topology = dataclasses.replace(topology, gpus=gpus)
    config = node(tmp_path, devices=["GPU-5abc"])
    spec = build_spec(probe_of(config), config, topology=topology)
    assert numa_nodes(spec) == {0: "1"}


def _with_uuid(gpu: Gpu, uuid: str) -> Gpu:
    return dataclasses.replace(gpu, uuid=uuid)


def test_numa_with_no_topology_is_a_one_line_error_naming_the_setting(tmp_path: Path) -> None:
    config = node(tmp_path)
    with pytest.raises(SpecError, match=r"^rank_wrapper: \{numa\} needs the NUMA node of GPU 0"):
        build_spec(probe_of(config), config, topology=None)


def test_a_wrapper_with_an_unknown_placeholder_names_the_placeholders(tmp_path: Path) -> None:
    config = node(tmp_path, rank_wrapper=["taskset", "{cpus}"])
    with pytest.raises(SpecError, match=r"rank_wrapper: .*\{rank\}, \{gpu\}, \{numa\}"):
        build_spec(probe_of(config), config, topology=dgx_h100())


def test_path_variants_carry_their_nccl_settings_under_the_operators(tmp_path: Path) -> None:
    config = node(tmp_path, env={"NCCL_ALGO": "Tree"})
    spec = build_spec(probe_of(config), config, path="pcie", topology=dgx_h100())
    env = spec.env_dict()
    assert env["NCCL_P2P_DISABLE"] == "1" and env["NCCL_ALGO"] == "Tree"
    assert (spec.path, spec.intent) == ("pcie", "pcie")


def pair_log(via: str) -> str:
    """Rank 0's NCCL log of a 2-GPU pair on one node, connected through `via` (the formats of
    NCCL's src/init.cc and src/transport/*.cc)."""
    return "\n".join(
        [
            "gpu1:77:77 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
            "gpu1:77:90 [0] NCCL INFO comm 0x5581 rank 0 nRanks 2 nNodes 1 localRanks 2 "
            "localRank 0 MNNVL 0",
            f"gpu1:77:95 [0] NCCL INFO Channel 00 : 0[3] -> 1[6] via {via}",
            f"gpu1:77:95 [0] NCCL INFO Channel 01 : 0[3] -> 1[6] via {via}",
        ]
    )


def test_a_pair_joined_by_nvlink_expects_nvlink_and_a_fallback_to_shm_is_flagged(
    tmp_path: Path,
) -> None:
    config = node(tmp_path)
    placement = pair_placement((3, 6), "nccl")
    spec = build_spec(probe_of(config), config, placement=placement, topology=dgx_h100())
    assert spec.intent == "nvlink"  # GPUs 3 and 6 share NVLink (NV18)
    fell_back = nccl_debug.parse(pair_log("SHM/direct/direct"))
    assert transport_faults.judge(fell_back, spec.intent) == ["shm_where_nvlink_expected"]
    assert transport_faults.judge(nccl_debug.parse(pair_log("P2P/CUMEM/read")), spec.intent) == []


def test_a_pair_on_pcie_expects_any_transport(tmp_path: Path) -> None:
    # GPUs 0 and 1 joined by an NVLink bridge, GPU 2 by PCIe alone (NODE).
    topology = parse_topo_matrix((FIXTURES / "topo_3x_rtxa6000_nv4_bridge_pair.txt").read_text())
    config = node(tmp_path, devices=["0", "1", "2"])

    def intent(pair: tuple[int, int]) -> str:
        placement = pair_placement(pair, "nccl")
        return build_spec(probe_of(config), config, placement=placement, topology=topology).intent

    assert intent((0, 1)) == "nvlink"
    # P2P over PCIe is a legitimate path for a PCIe pair, and so is SHM: the "pcie" intent would
    # count its P2P as a fault, so none is stated.
    assert (intent((0, 2)), intent((1, 2))) == ("any", "any")
    p2p = nccl_debug.parse(pair_log("P2P/IPC"))
    assert transport_faults.judge(p2p, "any") == []
    assert transport_faults.judge(p2p, "pcie") == ["p2p_where_pcie_expected"]
    # CPU ranks write no NCCL log, whatever topology_file says joins their rank slots.
    gloo = node(tmp_path, backend="gloo", devices=None, ranks=2, rank_wrapper=[])
    cpu_pair = pair_placement((0, 1), "gloo")
    assert build_spec(probe_of(gloo), gloo, placement=cpu_pair, topology=topology).intent == "any"


# --- the runner on the simulated node: what each rank would have been given


class RecordingLauncher(Launcher):
    """The real launcher's rank command and environment, recorded instead of spawned."""

    given: list[dict[str, Any]] = []

    def run(self) -> ProbeOutcome:
        for rank in self.local_ranks:
            env = self._rank_env(rank)
            RecordingLauncher.given.append(
                {
                    "devices": self.spec.devices,
                    "rank": rank,
                    "cuda": env.get("CUDA_VISIBLE_DEVICES"),
                    "command": self._command(rank),
                }
            )
        result = SizeResult(
            op=self.spec.op,
            size_bytes=self.spec.sizes[0],
            count=2,
            dtype=self.spec.dtype,
            chunks=1,
            **dict.fromkeys(("time_s", "min_s", "p10_s", "p90_s", "max_s"), 1e-5),
            cv=0.0,
            samples=1,
            algbw_bytes_per_second=1e9,
            busbw_bytes_per_second=1e9,
            bus_factor=1.0,
        )
        environment = ProbeEnvironment(
            netmon="test", backend=self.spec.backend, ranks=self.spec.ranks, host=self.spec.host
        )
        return ProbeOutcome(
            spec=self.spec,
            results=(result,),
            environment=environment,
            started_at=0.0,
            wall_s=0.01,
        )


def reading(index: int, pids: tuple[int, ...] = ()) -> idle.GpuReading:
    return idle.GpuReading(
        index=index, uuid=f"GPU-{index}", utilization=0.0, memory_used=0, compute_pids=pids
    )


def runner_on(config: NetmonConfig, source: idle.IdleSource) -> tuple[ProbeRunner, Results]:
    current = CurrentConfig(config)
    results = Results(current, BaselineKeeper(baseline.BaselineBook(config.baseline)))
    readiness = Readiness(current, DeviceLocks(), source, threading.Event())
    runner = ProbeRunner(current, results, readiness, launcher=RecordingLauncher)
    runner.topology = dgx_h100()
    return runner, results


@pytest.fixture(autouse=True)
def recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """No rank is ever spawned here: the pairs module starts its launches through this too."""
    RecordingLauncher.given = []
    monkeypatch.setattr("netmon.probe.pairs.Launcher", RecordingLauncher)


def pairs_config(tmp_path: Path) -> NetmonConfig:
    return node(
        tmp_path,
        devices=["0", "1", "2", "3"],
        probes=[{"name": "pairs", "kind": "pairs", "sizes": [8], "interval": "1s"}],
    )


def test_pair_probes_use_only_the_configured_gpus(tmp_path: Path) -> None:
    all_idle = idle_sources.ReplaySource([[reading(i) for i in range(8)]])
    runner, results = runner_on(pairs_config(tmp_path), all_idle)
    runner.run("pairs")
    pairs = {tuple(sorted(given["devices"])) for given in RecordingLauncher.given}
    assert pairs == {(str(a), str(b)) for a in range(4) for b in range(a + 1, 4)}  # 6 of 28
    assert {given["cuda"] for given in RecordingLauncher.given} <= {"0", "1", "2", "3"}
    for given in RecordingLauncher.given:
        gpu = given["devices"][given["rank"]]
        assert given["cuda"] == gpu  # each rank sees exactly its own GPU
        assert given["command"][:2] == ["numactl", "--cpunodebind=0"]  # GPUs 0-3: NUMA node 0
    links = results.snapshot().links
    assert {(p.gpu, p.peer_gpu) for p in links} == {
        (a, b) for a in range(4) for b in range(a + 1, 4)
    }


def test_pair_probes_are_idle_checked_on_the_configured_gpus(tmp_path: Path) -> None:
    # A job on GPU 2 (configured) skips its pairs, and the pairs of the idle GPUs are measured;
    # one on GPU 6 (not configured) changes nothing.
    busy_2 = idle_sources.ReplaySource([[reading(i, (999,) if i == 2 else ()) for i in range(8)]])
    runner, results = runner_on(pairs_config(tmp_path), busy_2)
    runner.run("pairs")
    pairs = {tuple(sorted(given["devices"])) for given in RecordingLauncher.given}
    assert pairs == {("0", "1"), ("0", "3"), ("1", "3")}
    assert results.snapshot().pair_skips[("pairs", "gpu_busy_process")] == 3
    assert results.snapshot().probes["pairs"].skips == {}
    RecordingLauncher.given.clear()

    busy_6 = idle_sources.ReplaySource([[reading(i, (999,) if i == 6 else ()) for i in range(8)]])
    runner, results = runner_on(pairs_config(tmp_path), busy_6)
    runner.run("pairs")
    assert len({tuple(g["devices"]) for g in RecordingLauncher.given}) == 6


def test_pairs_of_a_gpu_another_probe_holds_are_skipped(tmp_path: Path) -> None:
    all_idle = idle_sources.ReplaySource([[reading(i) for i in range(8)]])
    runner, results = runner_on(pairs_config(tmp_path), all_idle)
    with runner.readiness.locks.hold(frozenset({"3"}), timeout=1) as got:
        assert got
        config = pairs_config(tmp_path)
        runner.current.publish(
            config.model_copy(
                update={"probes": (probe_of(config, "pairs").model_copy(update={"interval": 0.2}),)}
            )
        )
        runner.run("pairs")
    pairs = {tuple(sorted(given["devices"])) for given in RecordingLauncher.given}
    assert pairs == {("0", "1"), ("0", "2"), ("1", "2")}
    assert results.snapshot().pair_skips[("pairs", "devices_busy")] == 3


def test_a_pair_waits_its_turn_behind_another_probe_of_ours_on_its_gpus(tmp_path: Path) -> None:
    """A `gpus: idle` probe on the NVLink island 0-1 every few seconds took the two GPUs between
    a sweep's survey and pair 0-1's claim every time: the pair was never measured. Its claim now
    queues behind our own probe, and a probe that comes after it waits behind the pair."""
    all_idle = idle_sources.ReplaySource([[reading(i) for i in range(8)]])
    runner, _ = runner_on(pairs_config(tmp_path), all_idle)
    locks = runner.readiness.locks
    held, release = threading.Event(), threading.Event()

    def other_probe() -> None:
        with locks.hold(frozenset({"0", "1"}), timeout=1) as got:
            assert got
            held.set()
            release.wait(30)

    holder = threading.Thread(target=other_probe)
    holder.start()
    assert held.wait(10)
    gates: list[Any] = []
    claimer = threading.Thread(target=lambda: gates.append(_enter(runner, (0, 1))))
    claimer.start()
    wait_for(lambda: locks.waiting() == (frozenset({"0", "1"}),) or None, 10, "the pair queued")
    release.set()
    claimer.join(10)
    holder.join(10)
    assert len(gates) == 1 and gates[0].reason is None, gates


def _enter(runner: ProbeRunner, pair: tuple[int, int]) -> Any:
    with runner._gate_for(30.0)(pair) as gate:
        return gate


def test_a_collective_probe_ranks_get_their_gpu_and_numa_node(tmp_path: Path) -> None:
    config = node(tmp_path, devices=["2", "5"])
    runner, _ = runner_on(config, idle_sources.ReplaySource([[reading(i) for i in range(8)]]))
    runner.run("small")
    given = {g["rank"]: (g["cuda"], g["command"][1]) for g in RecordingLauncher.given}
    assert given == {0: ("2", "--cpunodebind=0"), 1: ("5", "--cpunodebind=1")}
