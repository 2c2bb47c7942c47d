"""Small sizes timed from CUDA graphs (netmon.probe.graphs): the choice for every case, and on a
simulated GPU node the real ranks taking the graph path for latency-bound sizes and the eager
path otherwise, each visible in the JSON and the progress line."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from netmon.probe import graphs
from netmon.probe.spec import ProbeSpec, SizeResult
from tests.gpu_node import FIXTURES

NODE = FIXTURES / "nodes" / "dgx-h100.json"
NCCL = ProbeSpec(backend="nccl", ranks=2)


@pytest.mark.parametrize(
    ("spec", "size", "on_gpu", "nccl", "path", "why"),
    [
        (NCCL, 8, True, "2.27.5", "graph", "one CUDA graph of 5 ops"),
        (NCCL, 1 << 20, True, "2.27.5", "graph", "one CUDA graph"),
        (NCCL, (1 << 20) + 4, True, "2.27.5", "eager", "bandwidth-bound"),
        (NCCL, 8, True, "2.9.5", "eager", "NCCL 2.9.5 cannot be captured"),
        (NCCL, 8, True, "2.9.6", "graph", "one CUDA graph"),
        (NCCL, 8, True, None, "eager", "unknown"),
        (NCCL, 8, False, "2.27.5", "eager", "without NCCL on a GPU"),
        (ProbeSpec(ranks=2), 8, True, "2.27.5", "eager", "without NCCL on a GPU"),
        (NCCL.model_copy(update={"cuda_graph": "off"}), 8, True, "2.27.5", "eager", "off"),
        (NCCL.model_copy(update={"timing": "per_op"}), 8, True, "2.27.5", "eager", "per_op"),
        (NCCL.model_copy(update={"op": "sendrecv"}), 8, True, "2.27.5", "eager", "not captured"),
    ],
)
def test_the_choice_of_timing_path(
    spec: ProbeSpec, size: int, on_gpu: bool, nccl: str | None, path: str, why: str
) -> None:
    choice = graphs.choose(spec, size, on_gpu, nccl)
    assert (choice.path, why in choice.why) == (path, True), choice


class _Peers:
    """torch.distributed as issuer() uses it: an all_reduce(MIN) over this rank's vote and the
    others' (`others_ok`), as the ranks of one probe would answer."""

    class ReduceOp:
        MIN = "min"

    def __init__(self, others_ok: bool) -> None:
        self.others_ok = others_ok

    def all_reduce(self, tensor: Any, op: Any) -> None:
        assert op == "min"
        tensor.clamp_(max=1 if self.others_ok else 0)


def test_a_capture_refused_on_any_rank_sends_every_rank_eager_with_the_reason() -> None:
    import torch

    ran: list[int] = []

    def refuse(run: Any, ops: int) -> Any:
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")

    choice = graphs.Choice("graph", "one CUDA graph of 5 ops per sample")
    cpu = torch.device("cpu")
    issue, chosen = graphs.issuer(torch, _Peers(True), cpu, ran.append, 5, choice, refuse)
    issue()
    assert ran == [5] and chosen.path == "eager"
    assert chosen.why == (
        "capture failed: CUDA error: operation not permitted when stream is capturing"
    )
    # This rank captured; another did not: eager here too, or the ranks' ops would not match.
    replays: list[int] = []
    captured = lambda run, ops: lambda: replays.append(ops)  # noqa: E731
    issue, chosen = graphs.issuer(torch, _Peers(False), cpu, ran.append, 5, choice, captured)
    assert chosen == graphs.Choice("eager", "capture failed on another rank")
    # Everyone captured: the replay, launched once to upload it before any sample.
    issue, chosen = graphs.issuer(torch, _Peers(True), cpu, ran.append, 5, choice, captured)
    assert chosen == choice and replays == [5]
    issue()
    assert replays == [5, 5] and ran == [5]


def test_each_choice_is_logged_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="netmon.probe.graphs")
    result = SizeResult.of_samples(NCCL, 8, 2, [1e-5] * 3, [[1e-5] * 3] * 2, None)
    graph = result.reported({"timing_path": "graph", "timing_why": "one CUDA graph of 5 ops"})
    for _ in range(3):
        graphs.note(NCCL, graph)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "all_reduce 8 B (default path) timed from a CUDA graph: one CUDA graph of 5 ops"
    ]
    # A rank of an older netmon says nothing: eager.
    assert result.reported({}).timing_path == "eager"


def _netmon_probe(*flags: str) -> dict[str, Any]:
    """`netmon probe ... --json` in a process of its own: its JSON document."""
    done = subprocess.run(
        [sys.executable, "-m", "netmon", "probe", "--ranks", "2", "--json", *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return {**document, "stderr": done.stderr}


def _probe(node: Path, *flags: str) -> tuple[dict[int, dict[str, Any]], str]:
    document = _netmon_probe("--simulate", str(node), "--iters", "3", *flags)
    return {r["size_bytes"]: r for r in document["results"]}, document["stderr"]


def test_a_simulated_gpu_node_times_small_sizes_from_a_graph_and_large_ones_eagerly() -> None:
    by_size, progress = _probe(NODE, "--sizes", "8,64K,4M")
    assert {s: r["timing_path"] for s, r in by_size.items()} == {
        8: "graph",
        64 << 10: "graph",
        4 << 20: "eager",
    }
    assert "bandwidth-bound" in by_size[4 << 20]["timing_why"]
    shown = [line for line in progress.splitlines() if "timed from a CUDA graph" in line]
    assert len(shown) == 2 and "4M" not in "".join(shown), progress


def test_an_nccl_too_old_to_capture_and_cuda_graph_off_are_eager_and_say_why(
    tmp_path: Path,
) -> None:
    document = json.loads(NODE.read_text())
    document["nccl"] = "2.8.4"
    document["topology"] = str((NODE.parent / document["topology"]).resolve())
    old = tmp_path / "old-nccl.json"
    old.write_text(json.dumps(document))
    by_size, _ = _probe(old, "--sizes", "8")
    assert by_size[8]["timing_path"] == "eager"
    assert by_size[8]["timing_why"] == "NCCL 2.8.4 cannot be captured (2.9.6 or later)"
    by_size, _ = _probe(NODE, "--sizes", "8", "--cuda-graph", "off")
    assert (by_size[8]["timing_path"], by_size[8]["timing_why"]) == ("eager", "cuda_graph: off")


def test_gloo_on_cpu_is_eager() -> None:
    document = _netmon_probe("--backend", "gloo", "--sizes", "8", "--iters", "3")
    (result,) = document["results"]
    assert result["timing_path"] == "eager"
    assert result["timing_why"] == "no CUDA graphs without NCCL on a GPU"
    assert result["sm_clock_hz"] is None  # CPU ranks have no SM clock


def test_gpu_probes_warm_up_for_a_tenth_of_a_second_by_default_and_cpu_probes_not() -> None:
    from netmon.config import NetmonConfig, ProbeConfig
    from netmon.probe.build import build_spec

    probe = ProbeConfig(name="small", sizes=(8,))
    gpu = NetmonConfig(backend="nccl", devices=("0", "1"))
    assert build_spec(probe, gpu).warmup_s == 0.1
    assert build_spec(probe, NetmonConfig(backend="gloo")).warmup_s == 0.0
    off = probe.model_copy(update={"warmup_s": 0.0})
    assert build_spec(off, gpu).warmup_s == 0.0


def test_gpu_ranks_warm_up_by_time_and_report_their_sm_clock() -> None:
    document = _netmon_probe(
        *("--simulate", str(NODE), "--sizes", "8,64K", "--iters", "2"),
        *("--warmup", "1", "--warmup-s", "1.5"),
    )
    # Measured while the ranks' kernels ran: the simulated GPUs' boost clock, not the idle one.
    assert {r["sm_clock_hz"] for r in document["results"]} == {1980e6}
    (probe,) = document["probes"]
    assert probe["wall_s"] >= 1.5, probe
    assert probe["spec"]["warmup_s"] == 1.5


def test_an_idle_gpus_clock_is_its_idle_clock_and_a_lost_one_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from netmon.gpu.clocks import SmClock
    from tests.gpu_node import dgx_h100

    node = dgx_h100(tmp_path)
    node.document["gpus"][1]["nvml_errors"] = {"nvmlDeviceGetClockInfo": "gpu_is_lost"}
    node.write()
    node.activate(monkeypatch)
    assert SmClock(node.uuid(0)).read_mhz() == 345
    assert SmClock("0").read_mhz() == 345
    lost = SmClock(node.uuid(1))
    assert lost.read_mhz() is None and lost.read_mhz() is None
    assert SmClock("").read_mhz() is None
