"""`netmon selftest`: the real command on gloo (every op, the simulated preemption drill, host
memory), its usage errors and exit codes, and the pure parts: the comparison with published
nccl-tests tables, the judgments and the two renderings of the report."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from netmon.bandwidth import OPS
from netmon.cli import selftest_command, table
from netmon.cli.main import main
from netmon.config import NetmonConfig, ProbeConfig
from netmon.probe import nccl_tests
from netmon.probe.build import build_spec
from netmon.probe.processes import process_state, start_time
from netmon.probe.spec import ProbeEnvironment, ProbeFailure, ProbeOutcome, ProbeSpec, SizeResult
from netmon.selftest import checks, drill, report, versus
from netmon.selftest import run as selftest_run
from netmon.selftest.checks import Row
from netmon.selftest.run import GLOO_PATHS
from tests.gpu_node import dgx_h100

FIXTURES = Path(__file__).parent / "fixtures"
NETMON = [sys.executable, "-m", "netmon"]


def spec_of(backend: str = "gloo", op: str = "all_reduce", **probe: Any) -> ProbeSpec:
    """A spec made as the selftest makes its own: through probe.build."""
    gpus = probe.pop("devices", None)
    node = NetmonConfig(backend=backend, devices=gpus)  # type: ignore[arg-type]
    settings: dict[str, Any] = {"name": "selftest", "sizes": "1M", "check": True, **probe}
    return build_spec(ProbeConfig(op=op, **settings), node)


def outcome_of(
    spec: ProbeSpec, busbw: dict[int, float] | None = None, **fields: Any
) -> ProbeOutcome:
    """An outcome with one result per size, busbw as given (bytes/s), values checked right."""
    results = []
    for size in spec.sizes:
        rate = (busbw or {}).get(size, 1e9)
        results.append(
            SizeResult(
                op=spec.op,
                size_bytes=size,
                count=size // 4,
                dtype=spec.dtype,
                chunks=1,
                time_s=size / rate,
                min_s=size / rate,
                p10_s=size / rate,
                p90_s=size / rate,
                max_s=size / rate,
                cv=0.0,
                samples=20,
                algbw_bytes_per_second=rate,
                busbw_bytes_per_second=rate,
                bus_factor=1.0,
                check_ok=True,
            )
        )
    return ProbeOutcome(spec=spec, results=tuple(results), started_at=0.0, wall_s=1.0, **fields)


# ---- the real command on gloo ----


@pytest.fixture(scope="module")
def gloo_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    path = tmp_path_factory.mktemp("selftest") / "report.json"
    done = subprocess.run(
        [*NETMON, "selftest", "--backend", "gloo", "--ranks", "2", "--report", str(path)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    return done, json.loads(path.read_text())


def test_gloo_selftest_passes_every_op_and_the_simulated_drill(
    gloo_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    done, document = gloo_run
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["name"]: row for row in document["rows"]}
    for op in OPS:
        assert rows[f"op {op}"]["status"] == "PASS", rows[f"op {op}"]
    assert rows["op sendrecv"]["detail"].startswith("2 sizes (1K,1M) checked")
    assert rows["path default"]["status"] == "PASS"
    for path in ("pcie", "ring", "tree", "nvls"):
        assert (rows[f"path {path}"]["status"], rows[f"path {path}"]["detail"]) == (
            "SKIP",
            GLOO_PATHS,
        )
    assert rows["nccl-tests all_reduce"]["status"] == "SKIP"
    assert rows["pinning"] == {
        **rows["pinning"],
        "status": "SKIP",
        "detail": "no GPU: CPU ranks (gloo) open none",
    }
    drilled = rows["drill preemption (simulated)"]
    assert drilled["status"] == "PASS", drilled
    assert 0 < drilled["figures"]["seconds"] <= drill.GOAL_S
    assert drilled["measured"] == f"{drilled['figures']['seconds']:.2f} s"
    # The stand-in's job was a real process, and it is gone.
    assert process_state(drilled["figures"]["job_pid"]) in (None, "Z")
    for op in ("all_reduce", "broadcast", "alltoall", "sendrecv"):
        assert rows[f"memory {op}"]["status"] == "PASS", rows[f"memory {op}"]
        assert rows[f"memory {op}"]["figures"]["peak_bytes"] > 64 << 20
    for op in ("all_gather", "reduce_scatter", "all_gather_object"):
        assert rows[f"memory {op}"]["status"] == "SKIP"
    assert document["verdict"] == "PASS" and document["counts"]["FAIL"] == 0
    assert document["environment"]["torch"] and document["error"] is None


def test_the_json_report_matches_the_table(
    gloo_run: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    done, document = gloo_run
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= table.WIDTH
    header = next(line for line in lines if line.startswith("CHECK"))
    start = lines.index(header) + 1
    shown = table_rows(lines[start : lines.index("", start)], header)
    for cells, row in zip(shown, document["rows"], strict=True):
        assert cells["CHECK"] == row["name"]
        assert cells["RESULT"] == row["status"]
        assert (cells["MEASURED"], cells["DETAIL"]) == (row["measured"], row["detail"])
    assert (
        lines[-1]
        == f"PASS: {document['counts']['PASS']} PASS, 0 FAIL, {document['counts']['SKIP']} SKIP"
    )
    # Progress went to stderr, one line per row.
    assert done.stderr.count("netmon: selftest: ") == len(document["rows"])


def table_rows(lines: list[str], header: str) -> list[dict[str, str]]:
    """The report's rows from the table's lines: a row starts where CHECK has a name; the lines
    under it continue its wrapped cells, whose pieces are joined again with spaces."""
    names = header.split()
    starts = [header.index(name) for name in names]
    rows: list[dict[str, list[str]]] = []
    for line in lines:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        if cells[0]:
            rows.append({name: [] for name in names})
        for name, cell in zip(names, cells, strict=True):
            if cell:
                rows[-1][name].append(cell)
    return [{name: " ".join(parts) for name, parts in row.items()} for row in rows]


# ---- usage errors and exit codes ----


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--ranks", "1"], "--ranks"),
        (["--skip", "everything"], "--skip"),
        (["--sizes", "12Q"], "--sizes"),
        (["--timeout", "soon"], "--timeout"),
        (["--nccl-tests", "/nonexistent/all_reduce_perf"], "--nccl-tests"),
        (["--devices", "0"], "--devices"),
        (["--report", "/nonexistent/folder/report.json"], "--report"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(["selftest", "--backend", "gloo", *argv], capsys)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and flag in err, err


def test_exit_status_follows_the_rows(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    failed = made_up_report(error=None)
    monkeypatch.setattr(selftest_command, "run_selftest", lambda plan, progress: failed)
    code, out, _ = run_main(
        ["selftest", "--backend", "gloo", "--json", "--report", str(tmp_path / "r.json")], capsys
    )
    assert code == 1
    assert json.loads(out) == json.loads((tmp_path / "r.json").read_text())
    assert json.loads(out)["verdict"] == "FAIL"
    stopped = made_up_report(error="drill: OSError: no such file")
    monkeypatch.setattr(selftest_command, "run_selftest", lambda plan, progress: stopped)
    code, out, err = run_main(["selftest", "--backend", "gloo"], capsys)
    assert code == 3
    assert "the selftest stopped early: drill: OSError" in out
    assert err.strip() == "netmon: selftest stopped early: drill: OSError: no such file"


# ---- a machine without a usable GPU, and a simulated one ----


@pytest.mark.skipif(Path("/proc/driver/nvidia/version").exists(), reason="an NVIDIA driver here")
def test_without_a_usable_gpu_the_selftest_says_what_is_missing_instead_of_running_on_gloo() -> (
    None
):
    done = subprocess.run([*NETMON, "selftest"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "no usable GPU: no NVIDIA driver loaded" in line and "--backend gloo" in line


@pytest.mark.skipif(Path("/proc/driver/nvidia/version").exists(), reason="an NVIDIA driver here")
@pytest.mark.parametrize(
    "argv",
    [
        ["selftest", "--backend", "nccl"],
        ["probe", "--backend", "nccl"],
        ["probe", "--backend", "nccl", "--ranks", "2"],
    ],
)
def test_an_nccl_backend_without_a_gpu_is_one_line_naming_what_is_missing(argv: list[str]) -> None:
    done = subprocess.run([*NETMON, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode in (2, 3), done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "--backend nccl: no usable GPU: no NVIDIA driver loaded" in line, line
    assert "Traceback" not in done.stderr and "got 0" not in line


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n", "torch 2.13.0+cpu is a CPU"),
        ("__version__ = '2.1.0'\ncuda = None\n", "torch 2.1.0 is a CPU build"),
        ("__version__ = '2.13.0+cu128'\ncuda: Optional[str] = '12.8'\n", None),
        ("__version__ = '2.13.0'\n", None),  # cannot tell: the ranks will say
    ],
)
def test_torch_without_cuda_is_named_from_its_version_file(
    tmp_path: Path, written: str, said: str | None
) -> None:
    from netmon.gpu.torch_build import torch_without_cuda

    version_py = tmp_path / "version.py"
    version_py.write_text("from typing import Optional\n" + written)
    found = torch_without_cuda(version_py)
    assert (found is None) if said is None else (found is not None and said in found), found


def test_a_selftest_on_a_simulated_node_drills_zygote_ranks_through_the_daemons_readiness(
    tmp_path: Path,
) -> None:
    node = dgx_h100(tmp_path / "node")
    path = tmp_path / "report.json"
    argv = ["selftest", "--simulate", str(node.path), "--ranks", "2", "--sizes", "1M"]
    done = subprocess.run(
        [*NETMON, *argv, "-q", "--report", str(path)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NETMON_SIMULATE_RUN": str(node.run_dir)},  # keep its journal
    )
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(path.read_text())
    assert document["simulated"] == str(node.path)
    assert "SIMULATED node" in done.stdout
    rows = {row["name"]: row for row in document["rows"]}
    drilled = rows["drill preemption"]
    assert drilled["status"] == "PASS", drilled
    assert drilled["figures"]["seconds"] <= 1.5 and drilled["figures"]["ranks_forked"] == 2
    assert "2 ranks forked by the rank zygote" in drilled["detail"]
    assert rows["pinning"]["status"] == "PASS" and rows["rank zygote"]["status"] == "PASS"
    assert rows["path nvls"]["status"] == "SKIP"  # 2 GPUs: NCCL 2.27 keeps NVLS off
    assert {rows[f"memory {op}"]["status"] for op in OPS} == {"SKIP"}
    assert rows["verdict noise"]["status"] == "SKIP"  # CPU noise says nothing of a GPU's
    # The drill's job opened GPU 0 like a CUDA job: NVML listed it there, next to the ranks.
    jobs = [o for o in node.opened() if o["pid"] == drilled["figures"]["job_pid"]]
    assert [o["uuid"] for o in jobs] == [node.uuid(0)]
    # What the start checks read, for the report a first GPU user sends back (issue 34).
    environment = document["environment"]
    assert (environment["driver_cuda"], environment["torch_cuda"]) == ("13.0", "13.0")
    assert environment["pid_namespace"] == "host" and environment["imex_channel"] is False
    assert environment["pairs_without_p2p"] == []


# ---- judgments ----


def test_a_failed_probe_fails_its_row_and_the_selftest() -> None:
    spec = spec_of(op="sendrecv")
    failure = ProbeFailure(phase="measure", rank=1, cause="signal", detail="killed by SIGKILL")
    row = checks.judge_run("ops", "op sendrecv", outcome_of(spec, failure=failure))
    assert row.status == "FAIL"
    assert row.detail == "signal in phase measure (rank 1): killed by SIGKILL"
    assert checks.exit_code([row]) == 1
    assert checks.exit_code([checks.judge_run("ops", "op sendrecv", outcome_of(spec))]) == 0


def test_wrong_values_and_transport_faults_fail_the_row() -> None:
    spec = spec_of()
    good = outcome_of(spec)
    wrong = good.model_copy(
        update={"results": (good.results[0].model_copy(update={"check_ok": False}),)}
    )
    assert checks.judge_run("ops", "op all_reduce", wrong).detail == "wrong values at 1M"
    unchecked = good.model_copy(
        update={"results": (good.results[0].model_copy(update={"check_ok": None}),)}
    )
    assert checks.judge_run("ops", "op all_reduce", unchecked).detail == "values not checked at 1M"
    faults = good.model_copy(
        update={"transports": ("shm",), "transport_faults": ("shm_where_nvlink_expected",)}
    )
    row = checks.judge_run("paths", "path default", faults)
    assert row.status == "FAIL"
    assert "shm_where_nvlink_expected (transports: shm)" in row.detail
    missing = good.model_copy(update={"results": ()})
    assert checks.judge_run("ops", "op all_reduce", missing).detail == "1 size(s) gave no result"


def test_device_memory_within_five_percent_and_the_allocator_slack() -> None:
    spec = spec_of("nccl", op="alltoall", sizes="256M", devices=("0", "1"))
    budget = 2 * (256 << 20)  # alltoall: S in and S out
    limit = 1.05 * budget + checks.DEVICE_SLACK_BYTES
    assert (
        checks.device_memory_row(outcome_of(spec, peak_device_memory_bytes=int(limit))).status
        == "PASS"
    )
    over = checks.device_memory_row(outcome_of(spec, peak_device_memory_bytes=int(limit) + 1))
    assert over.status == "FAIL" and over.figures["budget_bytes"] == budget
    silent = checks.device_memory_row(outcome_of(spec))
    assert (silent.status, silent.detail) == ("FAIL", "the ranks reported no peak device memory")
    gathered = checks.device_memory_row(
        outcome_of(spec_of("nccl", op="all_gather", devices=("0", "1")))
    )
    assert gathered.status == "FAIL"  # on GPUs every tensor op is judged, gloo's copies or not


def test_host_memory_against_torchs_footprint() -> None:
    spec = spec_of(op="sendrecv", sizes="64M")
    footprint = 236 << 20
    limit = footprint + 1.15 * (128 << 20)
    assert (
        checks.host_memory_row(
            outcome_of(spec, peak_host_memory_bytes=int(limit)), footprint
        ).status
        == "PASS"
    )
    assert (
        checks.host_memory_row(
            outcome_of(spec, peak_host_memory_bytes=int(limit) + 1), footprint
        ).status
        == "FAIL"
    )
    assert checks.host_memory_row(outcome_of(spec, peak_host_memory_bytes=1), None).status == "FAIL"
    assert checks.memory_skip("reduce_scatter", "gloo") is not None
    assert checks.memory_skip("reduce_scatter", "nccl") is None
    assert checks.memory_skip("all_gather_object", "nccl") is not None


def pinned_outcome(reported: tuple[str, ...] | None, devices: tuple[str, ...]) -> ProbeOutcome:
    spec = spec_of("nccl", devices=devices)
    # What the launcher makes of each rank's "gpu" message (worker.py): one UUID per rank.
    env = ProbeEnvironment(
        netmon="test", backend="nccl", ranks=spec.ranks, host="gpu-node", cuda_uuids=reported or ()
    )
    return ProbeOutcome(spec=spec, environment=env, results=(), started_at=0.0, wall_s=1.0)


UUID_A = "GPU-6f5c3c5e-1a2b-4c3d-8e9f-0a1b2c3d4e5f"
UUID_B = "GPU-0d9e8f7a-6b5c-4d3e-9f2a-1b2c3d4e5f60"


def test_pinning_compares_nvml_uuids_with_what_torch_opened() -> None:
    # torch prints a device's uuid without NVML's "GPU-" prefix.
    same = pinned_outcome((UUID_A.removeprefix("GPU-"), UUID_B), (UUID_A, UUID_B))
    assert checks.pinning_row([same]).status == "PASS"
    swapped = checks.pinning_row([pinned_outcome((UUID_B, UUID_A), (UUID_A, UUID_B))])
    assert swapped.status == "FAIL"
    assert f"all_reduce rank 0 opened {UUID_B}, pinned to {UUID_A}" in swapped.detail
    half = checks.pinning_row([pinned_outcome((UUID_A, ""), (UUID_A, UUID_B))])
    assert (half.status, half.detail) == ("FAIL", "all_reduce rank 1 did not report its GPU")
    silent = checks.pinning_row([pinned_outcome(None, (UUID_A, UUID_B))])
    assert (silent.status, silent.detail) == ("SKIP", "the ranks did not report their GPU")
    by_index = checks.pinning_row([pinned_outcome((UUID_A, UUID_B), ("0", "1"))])
    assert by_index.status == "SKIP" and "by index" in by_index.detail
    assert (
        checks.pinning_row([outcome_of(spec_of())]).detail == "no GPU: CPU ranks (gloo) open none"
    )


def test_drill_rows() -> None:
    spec = spec_of()
    preempted = ProbeFailure(
        phase="measure", rank=None, cause="cancelled", detail="stopped", cancel_reason="preempted"
    )
    stopped = outcome_of(spec, failure=preempted)
    fast = drill.DrillResult(simulated=False, gpu="GPU-1", seconds=0.8, outcome=stopped, job_pid=7)
    row = drill.drill_row(fast)
    assert (row.name, row.status, row.measured) == ("drill preemption", "PASS", "0.80 s")
    assert "a CUDA job (PID 7) holding a context on GPU GPU-1" in row.detail
    slow = drill.drill_row(drill.DrillResult(True, "0", seconds=1.6, outcome=stopped, job_pid=7))
    assert (slow.name, slow.status) == ("drill preemption (simulated)", "FAIL")
    finished = drill.drill_row(drill.DrillResult(True, "0", seconds=0.5, outcome=outcome_of(spec)))
    assert finished.status == "FAIL" and "not as preempted: it finished" in finished.detail
    stuck = drill.drill_row(drill.DrillResult(True, "0", outcome=stopped, job_pid=7))
    assert stuck.status == "FAIL" and stuck.measured == f"> {drill.GIVE_UP_S:g} s"
    busy = drill.drill_row(drill.DrillResult(False, "0", skip="GPU not idle before the drill: x"))
    assert busy.status == "SKIP"


def test_the_stand_in_lists_the_job_only_while_it_runs() -> None:
    stand_in = drill.SimulatedGpu()
    assert stand_in.read()[0].compute_pids == ()
    job = subprocess.Popen(["sleep", "30"])
    try:
        start = start_time(job.pid)
        assert start is not None
        stand_in.place(job.pid, start)
        assert stand_in.read()[0].compute_pids == (job.pid,)
    finally:
        job.kill()
        job.wait()
    assert stand_in.read()[0].compute_pids == ()


# ---- nccl-tests ----


def table_of(name: str) -> nccl_tests.PerfTable:
    return nccl_tests.parse_table((FIXTURES / name).read_text())


def test_comparison_with_the_published_8xh100_table() -> None:
    table = table_of("nccl_tests_8xH100_sxm_nvls.txt")
    spec = spec_of("nccl", sizes="16M,32M,64M,128M", devices=tuple(map(str, range(8))))
    made_up = {
        16 << 20: 300e9,  # all_reduce_perf ran no 16M: nothing to compare with
        32 << 20: 321.08e9 * 1.02,  # in-place 321.08 GB/s: within 3 %
        64 << 20: 374.58e9 * 0.96,  # 4 % slow
        128 << 20: 415.83e9 * 0.97,  # just within
    }
    ratios = versus.compare(outcome_of(spec, made_up).results, table.rows)
    assert [r.size_bytes for r in ratios] == [16 << 20, 32 << 20, 64 << 20, 128 << 20]
    assert ratios[0].nccl_tests is None and ratios[0].ratio is None
    assert ratios[1].nccl_tests == pytest.approx(321.08e9)  # the in-place half, not 321.10
    assert [round(r.ratio or 0, 4) for r in ratios[1:]] == [1.02, 0.96, 0.97]
    assert [r.within() for r in ratios] == [False, True, False, True]
    row = versus.comparison_row(ratios)
    assert row.status == "FAIL"
    assert row.measured == "ratio 0.960 at 64M"
    assert row.detail.startswith("all_reduce_perf printed no row of 16M; 64M off by 4.0%; ")
    assert "32M 327.502 GB/s/321.080 GB/s = 1.020" in row.detail
    assert row.figures["sizes"][2]["nccl_tests_busbw_bytes_per_second"] == pytest.approx(374.58e9)


def test_comparison_within_three_percent_passes() -> None:
    table = table_of("nccl_tests_2x_h100pcie_nvlink_nccl194_TRUNCATED.txt")
    spec = spec_of("nccl", sizes="1G,2G", devices=("0", "1"))
    ratios = versus.compare(outcome_of(spec, {1 << 30: 113e9, 2 << 30: 118e9}).results, table.rows)
    row = versus.comparison_row(ratios)
    assert row.status == "PASS", row.detail
    assert [round(r.ratio or 0, 4) for r in ratios] == [
        round(113 / 115.56, 4),
        round(118 / 115.93, 4),
    ]


def test_a_size_all_reduce_perf_prints_as_zero_is_left_out_not_a_crash() -> None:
    # all_reduce_perf's two decimals print 0.00 GB/s at 8 B (tests/fixtures/
    # nccl_info_2node_p5_16xH100_efa_nvls.txt, its first rows); every later size is still judged.
    ratios = [
        versus.SizeRatio(size_bytes=8, netmon=1.2e5, nccl_tests=0.0),
        versus.SizeRatio(size_bytes=1 << 30, netmon=115.0e9, nccl_tests=115.56e9),
    ]
    row = versus.comparison_row(ratios)
    assert row.status == "PASS", row.detail
    assert row.detail.startswith("8 not compared: all_reduce_perf printed busbw 0.00 GB/s; 1G ")
    assert row.measured == "ratio 0.995 at 1G"


def test_wrong_values_in_all_reduce_perf_fail_the_comparison() -> None:
    text = (FIXTURES / "nccl_tests_2x_h100pcie_nvlink_nccl194_TRUNCATED.txt").read_text()
    broken = text.replace("115.56      0", "115.56      5")
    spec = spec_of("nccl", sizes="1G", devices=("0", "1"))
    ratios = versus.compare(
        outcome_of(spec, {1 << 30: 115.56e9}).results, nccl_tests.parse_table(broken).rows
    )
    row = versus.comparison_row(ratios)
    assert row.status == "FAIL" and "all_reduce_perf found 5 wrong values at 1G" in row.detail


def test_cycles_are_taken_at_their_median_and_a_size_the_launch_gap_dominates_is_not_judged() -> (
    None
):
    text = (FIXTURES / "nccl_tests_2x_h100pcie_nvlink_nccl194_TRUNCATED.txt").read_text()
    lines = text.splitlines()
    rows = [i for i, line in enumerate(lines) if line.startswith("  1073741824")]
    one_gib = lines[rows[0]]
    # Three cycles of 1G (-N 3): 110, 115.56 and 120 GB/s in place; their median is 115.56.
    cycles = [one_gib.replace("115.56      0", f"{v:6.2f}      0") for v in (110.0, 120.0)]
    text = "\n".join(lines[: rows[0] + 1] + cycles + lines[rows[0] + 1 :])
    # An 8 B row: 12 us per op, so a 20 us launch gap is 8.3 % of a block of 20.
    small = (
        "           8             2     float     sum      -1"
        "    12.10    0.01    0.01      0    12.00    0.01    0.01      0"
    )
    text = text.replace(one_gib, f"{small}\n{one_gib}", 1)
    table = nccl_tests.parse_table(text)
    spec = spec_of("nccl", sizes="8,1G", devices=("0", "1"))
    made_up = {8: 0.2e7, 1 << 30: 115.56e9}  # 8 B far off: it must not count
    ratios = versus.compare(outcome_of(spec, made_up).results, table.rows)
    assert ratios[1].nccl_tests == pytest.approx(115.56e9)
    assert ratios[1].time_s == pytest.approx(9291.5e-6)
    assert ratios[0].gap_share == pytest.approx(20e-6 / (20 * 12e-6))
    row = versus.comparison_row(ratios)
    assert row.status == "PASS", row.detail
    assert row.detail.startswith("8 not judged: the launch gap is 8.3% of a block there; 1G ")
    assert row.measured == "ratio 1.000 at 1G"
    alone = versus.comparison_row(ratios[:1])
    assert alone.status == "SKIP" and alone.detail.startswith("no size where the launch gap")


def test_all_reduce_perf_is_given_the_nccl_torch_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    library = tmp_path / "site" / "nvidia" / "nccl" / "lib"
    library.mkdir(parents=True)
    (library / "libnccl.so.2").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/site/lib")
    for name in [m for m in sys.modules if m == "nvidia" or m.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, name)
    spec = spec_of("nccl", sizes="1G", devices=("0", "1"))
    assert versus.torch_nccl_dir() == library
    assert versus.environment(spec)["LD_LIBRARY_PATH"] == f"{library}:/opt/site/lib"


FAKE_ALL_REDUCE_PERF = """\
#!{python}
# Replays the published 8x H100 run (tests/fixtures) at the size asked, as all_reduce_perf would.
import json, os, sys
args = sys.argv[1:]
size = int(args[args.index("-b") + 1])
text = open({fixture!r}).read().splitlines()
kept = [line for line in text if not line[:1].isspace() or line.split()[0] == str(size)]
print("\\n".join(kept))
with open({record!r}, "a") as record:
    record.write(json.dumps({{"argv": args, "gpus": os.environ["CUDA_VISIBLE_DEVICES"]}}) + "\\n")
"""


def test_all_reduce_perf_runs_one_size_at_a_time_on_netmons_gpus(tmp_path: Path) -> None:
    record = tmp_path / "calls.jsonl"
    fake = tmp_path / "all_reduce_perf"
    fake.write_text(
        FAKE_ALL_REDUCE_PERF.format(
            python=sys.executable,
            fixture=str(FIXTURES / "nccl_tests_8xH100_sxm_nvls.txt"),
            record=str(record),
        )
    )
    fake.chmod(0o755)
    devices = tuple(f"GPU-{i}0000000-0000-0000-0000-000000000000" for i in range(8))
    spec = spec_of("nccl", sizes="32M,64M", devices=devices)
    tables = versus.run_all_reduce_perf(str(fake), spec, timeout=60)
    assert [r.size_bytes for t in tables for r in t.rows] == [32 << 20, 64 << 20]
    assert versus.version_note(tables, "2.29.2") == "both ran NCCL 2.29.2"
    assert versus.version_note(tables, "2.27.5") == (
        "all_reduce_perf ran NCCL 2.29.2, netmon's ranks NCCL 2.27.5"
    )
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert [c["gpus"] for c in calls] == [",".join(devices)] * 2
    assert calls[0]["argv"] == [
        *("-b", str(32 << 20), "-e", str(32 << 20), "-g", "8", "-d", "float", "-o", "sum"),
        *("-w", "5", "-n", "5", "-N", "20", "-c", "1"),
    ]
    two = spec_of("nccl", sizes="32M", devices=devices[:2])
    with pytest.raises(versus.NcclTestsError, match="ran 8 ranks, not 2"):
        versus.run_all_reduce_perf(str(fake), two, timeout=60)
    fake.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "print('NCCL failure common.cu:1', file=sys.stderr)\nsys.exit(3)\n"
    )
    with pytest.raises(versus.NcclTestsError, match="exited with 3: NCCL failure"):
        versus.run_all_reduce_perf(str(fake), spec, timeout=60)


def test_the_gpu_sequence_with_probes_replayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nccl branches of every check, in order, with each probe's outcome made up (no GPU
    here) and all_reduce_perf replayed from the published 8x H100 run."""
    fake = tmp_path / "all_reduce_perf"
    fake.write_text(
        FAKE_ALL_REDUCE_PERF.format(
            python=sys.executable,
            fixture=str(FIXTURES / "nccl_tests_8xH100_sxm_nvls.txt"),
            record=str(tmp_path / "calls.jsonl"),
        )
    )
    fake.chmod(0o755)
    ran: list[ProbeSpec] = []

    def replay(spec: ProbeSpec, **_: Any) -> ProbeOutcome:
        ran.append(spec)
        env = ProbeEnvironment(
            netmon="0", backend="nccl", ranks=spec.ranks, host="h", nccl="2.27.5"
        )
        busbw = {32 << 20: 321.08e9, 64 << 20: 374.58e9 * 0.99}
        peak = checks.budget_of(spec)
        outcome = outcome_of(spec, busbw, environment=env, peak_device_memory_bytes=peak)
        # As the rank zygote would have started them: forked, CUDA and NCCL set up in the rank.
        forked = {"ranks_forked": spec.ranks, "startup_s": 0.04, "init_s": 2.5}
        return outcome.model_copy(update=forked)

    monkeypatch.setattr(selftest_run, "run_probe", replay)
    node = dgx_h100(tmp_path / "node")
    monkeypatch.setattr(
        selftest_run, "_telemetry_read", lambda: (node.link_health(False), node.read())
    )
    monkeypatch.setattr(selftest_run, "_compute_processes", node.read)
    devices = tuple(f"GPU-{i}0000000-0000-0000-0000-000000000000" for i in range(8))
    plan = selftest_run.Plan(
        NetmonConfig(backend="nccl", devices=devices, pause_file=None),
        ProbeConfig(name="selftest", sizes=(32 << 20, 64 << 20), check=True),
        nccl_tests=str(fake),
        skip=frozenset({"drill"}),
    )
    done = selftest_run.run_selftest(plan)
    rows = {row.name: row for row in done.rows}
    assert done.error is None
    assert [s.op for s in ran[: len(OPS)]] == list(OPS)
    assert all(s.cuda_devices == devices and s.check for s in ran)
    paths = ran[len(OPS) : len(OPS) + 3]
    assert [s.path for s in paths] == ["pcie", "ring", "tree"]
    # nccl-tests: an all_reduce run of its own, timed as all_reduce_perf times (blocks of 20).
    versus_run = ran[len(OPS) + 3]
    assert (versus_run.op, versus_run.batch, versus_run.iters) == ("all_reduce", 20, 10)
    assert versus_run.cuda_graph == "off"
    # Verdict noise: the all_reduce run again, 4 more times, on the same GPUs.
    again = ran[len(OPS) + 4 :]
    assert len(again) == checks.NOISE_RUNS - 1
    assert all(s == ran[0] for s in again), "not the op all_reduce run's own spec"
    assert dict(ran[len(OPS)].env)["NCCL_P2P_DISABLE"] == "1"
    assert rows["path nvls"].status == "SKIP"
    assert rows["path nvls"].detail.startswith("nvls needs NVSwitch multicast")
    assert rows["nccl-tests all_reduce"].status == "PASS", rows["nccl-tests all_reduce"]
    assert rows["nccl-tests all_reduce"].detail.endswith(
        "all_reduce_perf ran NCCL 2.29.2, netmon's ranks NCCL 2.27.5"
    )
    assert [round(r.ratio or 0, 3) for r in done.ratios] == [1.0, 0.99]
    assert rows["drill"].detail == "--skip drill"
    for op in OPS:
        expected = "SKIP" if op == "all_gather_object" else "PASS"
        assert rows[f"memory {op}"].status == expected, rows[f"memory {op}"]
    assert rows["pinning"].detail == "the ranks did not report their GPU"
    assert rows["link telemetry"].measured == "8 GPUs' PCIe, 144 NVLinks (144 active)"
    assert rows["rank zygote"].status == "PASS", rows["rank zygote"]
    assert rows["rank zygote"].measured == (
        "56 of 56 ranks forked; start-up max 0.04 s, init max 2.50 s"
    )
    # The replayed runs are identical: no spread, so the line is the plain 80 %.
    assert rows["verdict noise"].status == "PASS", rows["verdict noise"]
    assert rows["verdict noise"].measured == (
        "32M: spread 0.0%, low under 80%, 64M: spread 0.0%, low under 80%"
    )
    assert checks.exit_code(done.rows) == 0


# ---- the report ----


def made_up_report(error: str | None) -> report.Report:
    rows = (
        Row("ops", "op all_reduce", "PASS", "1.000 GB/s at 1M", "finishes, values right", "ok"),
        Row("drill", "drill preemption (simulated)", "FAIL", "1.60 s", "<= 1.5 s", "too slow"),
        Row("pinning", "pinning", "SKIP", detail="no GPU: CPU ranks (gloo) open none"),
    )
    ratios = (versus.SizeRatio(64 << 20, 380e9, 374.58e9), versus.SizeRatio(1 << 30, 470e9, None))
    return report.Report(
        backend="nccl",
        ranks=8,
        devices=("0", "1"),
        sizes=(64 << 20, 1 << 30),
        rows=rows,
        started_at=1.0,
        wall_s=2.0,
        environment={"torch": "2.13.0", "nccl": "2.27.5"},
        ratios=ratios,
        error=error,
    )


def test_the_table_is_aligned_and_ends_with_the_verdict() -> None:
    text = report.table(made_up_report(error=None))
    lines = text.splitlines()
    assert (
        lines[0]
        == "netmon selftest: nccl, 8 ranks on 0, 1, sizes 64M,1G (torch 2.13.0, NCCL 2.27.5)"
    )
    header = lines[2]
    assert header.split() == ["CHECK", "RESULT", "MEASURED", "DETAIL"]
    for line in lines[3:6]:
        assert line[header.index("RESULT") - 2 : header.index("RESULT")] == "  "
        assert line[header.index("RESULT") :].split()[0] in ("PASS", "FAIL", "SKIP")
    assert lines[-1] == "FAIL: 1 PASS, 1 FAIL, 1 SKIP"
    assert [line.split() for line in lines[-5:-2]] == [
        ["SIZE", "NETMON", "GB/s", "NCCL-TESTS", "GB/s", "RATIO"],
        ["64M", "380.00", "374.58", "1.014"],
        ["1G", "470.00", "-", "-"],
    ]
    wide = report.table(made_up_report(error=None), wide=True).splitlines()
    assert wide[2].split() == ["CHECK", "RESULT", "MEASURED", "GOAL", "DETAIL"]
    assert wide[4].split("  ")[-1] == "too slow" and "<= 1.5 s" in wide[4]


LONG_DETAIL = (
    "stopped as preempted; timed from a sleep process (PID 10395) that a stand-in for NVML lists "
    "on GPU 0 until every rank was gone; 2 ranks forked by the rank zygote, 8 by spawn, and the "
    "last one took 1.4 s to leave"
)


def long_report() -> report.Report:
    """A report with every free-text cell longer than its column, and 8 GPUs named by UUID."""
    rows = (
        Row("drill", "drill preemption (simulated)", "FAIL", "1.60 s", "<= 1.5 s", LONG_DETAIL),
        Row(
            "noise",
            "verdict noise",
            "PASS",
            "32M: spread 0.0%, low under 80%, 64M: spread 0.0%, low under 80%",
            "a spread under 5% at every size over 5 runs",
            "each size judged against the median of 5 runs; the line is 80% of it",
        ),
        Row("pinning", "pinning", "SKIP", detail="no GPU: CPU ranks (gloo) open none"),
    )
    uuids = tuple(f"GPU-{i}0000000-0000-0000-0000-000000000000" for i in range(8))
    return dataclasses.replace(
        made_up_report(error="drill: OSError: " + "x" * 150),
        rows=rows,
        devices=uuids,
        simulated="/var/lib/netmon/simulated/" + "dgx-h100-" * 12 + "node.json",
    )


def test_the_table_fits_120_columns_with_long_cells_and_wide_keeps_each_row_on_one_line() -> None:
    done = long_report()
    lines = report.table(done).splitlines()
    assert max(len(line) for line in lines) <= table.WIDTH, lines
    header = next(line for line in lines if line.startswith("CHECK"))
    start = lines.index(header) + 1
    shown = table_rows(lines[start : lines.index("", start)], header)
    assert [(r["CHECK"], r["MEASURED"], r["DETAIL"]) for r in shown] == [
        (row.name, row.measured, row.detail) for row in done.rows
    ]
    assert len(lines[start : lines.index("", start)]) > len(done.rows)  # some cells wrapped
    wide = report.table(done, wide=True).splitlines()
    header = next(line for line in wide if line.startswith("CHECK"))
    assert header.split() == ["CHECK", "RESULT", "MEASURED", "GOAL", "DETAIL"]
    start = wide.index(header) + 1
    assert [line.split("  ")[0] for line in wide[start : start + 3]] == [
        row.name for row in done.rows
    ]
    assert wide[start].endswith(LONG_DETAIL) and "a spread under 5%" in wide[start + 1]
    assert max(len(line) for line in wide) > table.WIDTH


def test_wide_reaches_the_table_from_the_command_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(selftest_command, "run_selftest", lambda plan, progress: long_report())
    code, out, _ = run_main(["selftest", "--backend", "gloo"], capsys)
    assert code == 3 and max(len(line) for line in out.splitlines()) <= table.WIDTH
    code, out, _ = run_main(["selftest", "--backend", "gloo", "--wide"], capsys)
    assert code == 3 and any(line.endswith(LONG_DETAIL) for line in out.splitlines())


def test_the_json_document() -> None:
    document = report.document(made_up_report(error=None))
    assert document["format"] == 1 and document["verdict"] == "FAIL"
    assert document["counts"] == {"PASS": 1, "FAIL": 1, "SKIP": 1}
    assert document["rows"][1] == {
        "check": "drill",
        "name": "drill preemption (simulated)",
        "status": "FAIL",
        "measured": "1.60 s",
        "goal": "<= 1.5 s",
        "detail": "too slow",
        "figures": {},
    }
    assert document["nccl_tests"][0]["ratio"] == pytest.approx(380 / 374.58)
    assert json.loads(json.dumps(document)) == document
    assert report.document(made_up_report(error="x"))["verdict"] == "ERROR"


def test_the_selftest_process_never_imports_torch() -> None:
    code = (
        "import sys\n"
        "from netmon.cli import selftest_command\n"
        "from netmon.selftest import run, drill, versus, report, checks\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ}, check=True
    )
    assert done.stdout.strip() == "[]"


def test_telemetry_row_fails_when_the_read_left_a_cuda_context_or_missed_a_gpu() -> None:
    from netmon.gpu.idle import GpuReading
    from netmon.gpu.linkhealth import LinkHealth, NvLinkReading, PcieReading
    from netmon.selftest.checks import telemetry_row

    def gpu(index: int, pids: tuple[int, ...] = ()) -> GpuReading:
        return GpuReading(index, f"GPU-{index}", 0.0, 1 << 20, pids)

    pcie = tuple(PcieReading(i, 1, 5, 16, 16, 0) for i in range(2))
    links = tuple(NvLinkReading(i, 0, True, 0, 0, 0, 0) for i in range(2))
    health = LinkHealth(pcie, links, (), under_load=False, read_at=1.0)
    ok = telemetry_row(4242, health, [gpu(0, (77,)), gpu(1)])
    assert (ok.status, ok.measured) == ("PASS", "2 GPUs' PCIe, 2 NVLinks (2 active)")
    held = telemetry_row(4242, health, [gpu(0), gpu(1, (4242,))])
    assert held.status == "FAIL" and "compute process on GPU(s) [1]" in held.detail
    missed = telemetry_row(4242, health, [gpu(0), gpu(1), gpu(2)])
    assert missed.status == "FAIL" and missed.detail == "no PCIe reading for GPU(s) [2]"


def test_zygote_row_fails_on_a_cuda_context_in_the_zygote_or_spawned_ranks() -> None:
    from netmon.gpu.idle import GpuReading
    from netmon.selftest.checks import zygote_row

    spec = ProbeSpec(backend="gloo", ranks=2, op="all_reduce", sizes=(8,))
    forked = outcome_of(spec, {8: 1e6}).model_copy(update={"ranks_forked": 2})
    spawned = outcome_of(spec, {8: 1e6}).model_copy(
        update={"ranks_spawned": 2, "fork_fallback": "wrapper"}
    )
    gpu = GpuReading(0, "GPU-0", 0.0, 1 << 20, (4242,))
    assert zygote_row([forked], 4242, None).status == "PASS"
    assert zygote_row([forked], 77, [gpu]).status == "PASS"
    held = zygote_row([forked], 4242, [gpu])
    assert held.status == "FAIL" and "holds a CUDA context on GPU(s) [0]" in held.detail
    fell = zygote_row([forked, spawned], 4242, None)
    assert fell.status == "FAIL" and fell.detail == "spawned instead: wrapper"
    assert fell.measured == "2 of 4 ranks forked"


def test_verdict_noise_says_how_deep_a_fall_counts_on_this_node() -> None:
    spec = spec_of(sizes=("1K", "64M"))
    policy = NetmonConfig().baseline

    def runs(*rates: float) -> list[ProbeOutcome]:
        return [outcome_of(spec, {1 << 10: 1e6, 64 << 20: rate}) for rate in rates]

    # A few percent run to run (a GPU node): the plain ratio, 80 %, is the line.
    quiet = checks.noise_row(runs(100e9, 101e9, 99e9, 100.5e9, 99.5e9), policy)
    assert quiet.status == "PASS", quiet
    assert quiet.measured == "64M: spread 0.7%, low under 80%"  # 1K is latency-bound: not judged
    # 20 % run to run: a 30 % loss would hide in the noise.
    noisy = checks.noise_row(runs(100e9, 80e9, 120e9, 100e9, 70e9), policy)
    assert noisy.status == "FAIL" and "only a fall under" in noisy.detail
    assert noisy.figures["sizes"][str(64 << 20)]["low_bound_share"] < checks.NOISE_GOAL
    # Too few runs, or no judged size: nothing to say.
    assert checks.noise_row(runs(100e9, 100e9), policy).status == "SKIP"
    small = [outcome_of(spec_of(sizes=("1K",)))] * 5
    assert checks.noise_row(small, policy).detail == (
        "no size at or over baseline.latency_bound_below"
    )
