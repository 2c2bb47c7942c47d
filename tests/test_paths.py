"""Path variants (netmon.probe.paths): the NCCL environment of every (path, op), the combinations
NCCL cannot run refused where they are written (configuration, `netmon probe`), and the nvls
variant skipped where NVML shows no NVSwitch fabric (netmon.gpu.fabric, read through
tests/fake_nvml.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest
from pydantic import ValidationError

from netmon.bandwidth import OPS, OpName
from netmon.cli.main import main
from netmon.config import NetmonConfig, ProbeConfig
from netmon.gpu.fabric import FabricReading, fabric_from_raw, nvls_supported
from netmon.gpu.nvml_links import read_fabric
from netmon.probe import paths
from netmon.probe.build import build_spec
from tests.fake_nvml import FabricNvml

PCIE = {
    "NCCL_P2P_DISABLE": "1",
    "NCCL_SHM_DISABLE": "0",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_ALGO": "Ring",
}
RING = {"NCCL_ALGO": "Ring"}
NO = None  # NCCL cannot run the combination: a ValueError naming why

# Every path against every op. Ring implements every collective; Tree only AllReduce; NVLS
# AllReduce, AllGather and ReduceScatter (NCCL src/graph/tuning.cc); all_gather_object is an
# AllGather of bytes; sendrecv and alltoall are point-to-point, which NCCL_ALGO does not reach.
EXPECTED: dict[tuple[str, OpName], dict[str, str] | None] = {
    **{("default", op): {} for op in OPS},
    **{("pcie", op): PCIE for op in OPS},
    ("ring", "all_reduce"): RING,
    ("ring", "all_gather"): RING,
    ("ring", "reduce_scatter"): RING,
    ("ring", "broadcast"): RING,
    ("ring", "all_gather_object"): RING,
    ("ring", "alltoall"): NO,
    ("ring", "sendrecv"): NO,
    ("tree", "all_reduce"): {"NCCL_ALGO": "AllReduce:Tree"},
    ("tree", "all_gather"): NO,
    ("tree", "reduce_scatter"): NO,
    ("tree", "broadcast"): NO,
    ("tree", "all_gather_object"): NO,
    ("tree", "alltoall"): NO,
    ("tree", "sendrecv"): NO,
    ("nvls", "all_reduce"): {"NCCL_ALGO": "AllReduce:NVLS"},
    ("nvls", "all_gather"): {"NCCL_ALGO": "AllGather:NVLS"},
    ("nvls", "reduce_scatter"): {"NCCL_ALGO": "ReduceScatter:NVLS"},
    ("nvls", "all_gather_object"): {"NCCL_ALGO": "AllGather:NVLS"},
    ("nvls", "broadcast"): NO,
    ("nvls", "alltoall"): NO,
    ("nvls", "sendrecv"): NO,
}


def test_the_table_covers_every_path_and_op() -> None:
    assert set(EXPECTED) == {(path, op) for path in paths.PATHS for op in OPS}
    assert paths.PATHS == ("default", "pcie", "ring", "tree", "nvls")
    assert set(paths.NCCL_FUNCTION) == set(OPS)


@pytest.mark.parametrize(("path", "op"), sorted(EXPECTED))
def test_the_environment_of_every_path_and_op(path: str, op: OpName) -> None:
    expected = EXPECTED[(path, op)]
    if expected is None:
        with pytest.raises(ValueError, match=f"^{path} "):
            paths.variant_env(path, op)
        assert paths.cannot_run(path, op) is not None
        assert not paths.runs(path, op)
    else:
        assert paths.variant_env(path, op) == expected
        assert paths.cannot_run(path, op) is None
        # NCCL's own multicast check stays in force: nothing forces NVLS on (nvls.cc reads 1 as
        # "enable without asking CUDA").
        assert paths.variant_env(path, op).get("NCCL_NVLS_ENABLE") in (None, "0")


def test_the_reasons_name_the_algorithm_and_the_paths_that_can_run() -> None:
    assert paths.cannot_run("tree", "all_gather") == (
        "tree cannot run all_gather (NCCL's Tree algorithm implements all_reduce only); "
        "use default, pcie, ring or nvls"
    )
    assert paths.cannot_run("nvls", "broadcast") == (
        "nvls cannot run broadcast (NCCL's NVLS algorithm implements all_reduce, all_gather and "
        "reduce_scatter only); use default, pcie or ring"
    )
    assert paths.cannot_run("ring", "sendrecv") == (
        "ring does not apply to sendrecv: it is point-to-point, and NCCL_ALGO only chooses the "
        "algorithm of collectives; use default or pcie"
    )
    assert paths.cannot_run("warp", "all_reduce") == (
        "unknown path 'warp'; use one of default, pcie, ring, tree, nvls"
    )


def test_build_spec_gives_the_op_its_variant() -> None:
    node = NetmonConfig(backend="nccl", devices=("0", "1"))
    probe = ProbeConfig(name="x", op="all_gather", sizes=(8,), paths=("default", "nvls", "ring"))
    envs = {path: dict(build_spec(probe, node, path=path).env) for path in probe.paths}
    assert envs == {"default": {}, "nvls": {"NCCL_ALGO": "AllGather:NVLS"}, "ring": RING}


# --- the combinations refused where they are written


@pytest.mark.parametrize(
    ("op", "given", "wanted"),
    [
        ("all_gather", ["default", "tree"], "tree cannot run all_gather"),
        ("reduce_scatter", "tree", "tree cannot run reduce_scatter"),
        ("broadcast", ["nvls"], "nvls cannot run broadcast"),
        ("sendrecv", ["default", "ring"], "ring does not apply to sendrecv"),
        ("alltoall", ["pcie", "nvls"], "nvls does not apply to alltoall"),
    ],
)
def test_a_probe_refuses_what_nccl_cannot_run(op: str, given: object, wanted: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ProbeConfig.model_validate({"name": "x", "op": op, "sizes": [8], "paths": given})
    errors = caught.value.errors()
    assert [e["loc"] for e in errors] == [("paths",)]
    assert wanted in errors[0]["msg"]


def test_every_runnable_combination_is_accepted() -> None:
    for op in OPS:
        runnable = tuple(p for p in paths.PATHS if paths.runs(p, op))
        assert ProbeConfig(name="x", op=op, sizes=(8,), paths=runnable).paths == runnable


def test_netmon_probe_names_the_paths_flag(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["probe", "--backend", "gloo", "--op", "all_gather", "--paths", "default,tree"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("netmon: --paths: tree cannot run all_gather")
    assert "use default, pcie, ring or nvls" in err


def test_netmon_probe_names_the_paths_flag_for_each_op(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Several ops in one call: the one that cannot run the path is named.
    argv = ["probe", "--backend", "gloo", "--op", "all_reduce,broadcast", "--paths", "nvls"]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("netmon: --paths: nvls cannot run broadcast")


# --- where the node decides: NVSwitch multicast for nvls, NCCL's version for tree and nvls


def h100() -> FabricNvml:
    return FabricNvml((3, 3))  # every GPU registered with the fabric manager


def pcie_node() -> FabricNvml:
    return FabricNvml(error=pynvml.NVML_ERROR_NOT_SUPPORTED)


def test_fabric_readings_of_an_nvswitch_node() -> None:
    nv = h100()
    readings = read_fabric(nv)
    assert readings == (
        FabricReading(0, "GPU-synthetic-0", "completed", 0, 0, None),
        FabricReading(1, "GPU-synthetic-1", "completed", 0, 0, None),
    )  # the lost third GPU is left out
    assert nv.times_called("nvmlDeviceGetGpuFabricInfoV") == 2
    assert nv.times_called("nvmlDeviceGetGpuFabricInfo") == 0
    assert nv.shutdowns == 1
    # Two GPUs suffice for NVLS since NCCL 2.28.7 (test_nvls_needs_three_gpus_before_nccl_2_28_7).
    assert nvls_supported(readings, nccl=(2, 28, 7)) == (
        True,
        "every GPU joined an NVLink fabric; NCCL still checks multicast support itself",
    )


def test_fabric_readings_from_a_driver_without_the_versioned_call() -> None:
    nv = FabricNvml((3, 2), versioned=False)
    readings = read_fabric(nv)
    assert [r.state for r in readings] == ["completed", "in_progress"]
    assert nv.times_called("nvmlDeviceGetGpuFabricInfo") == 2
    assert nvls_supported(readings)[0] is False


@pytest.mark.parametrize(
    ("nvml", "reason"),
    [
        (pcie_node(), "GPU 0 is in no NVLink fabric (no NVSwitch, or before Hopper)"),
        (
            FabricNvml((1, 1)),  # no fabric manager running
            "GPU 0 has not finished joining the NVLink fabric (not_started); "
            "is the fabric manager running?",
        ),
        (
            FabricNvml((3, 3), status=pynvml.NVML_ERROR_UNKNOWN),
            "GPU 0 failed to join the NVLink fabric (NVML status 999)",
        ),
        (
            FabricNvml(error=pynvml.NVML_ERROR_NO_PERMISSION),
            "NVML could not read the NVLink fabric state of GPU 0",
        ),
        (FabricNvml((3, 1)), "GPU 1 has not finished joining the NVLink fabric (not_started)"),
    ],
)
def test_nvls_is_refused_without_a_registered_fabric(nvml: FabricNvml, reason: str) -> None:
    supported, why = nvls_supported(read_fabric(nvml))
    assert supported is False
    assert why.startswith(reason)


def test_nvls_decision_on_the_probes_own_gpus() -> None:
    readings = read_fabric(FabricNvml((3, 1)))
    new = (2, 28, 7)
    # GPU 1 has not joined the fabric: a probe on GPU 0 alone is not refused for it, only for
    # being one GPU, whatever names it goes by (NCCL counts GPUs, not ranks).
    one_gpu = (False, "NCCL turns NVLS on only with 2 or more GPUs of one node; 1 here")
    assert nvls_supported(readings, ["0"], new) == one_gpu
    assert nvls_supported(readings, ["0", "GPU-synthetic-0"], new) == one_gpu
    assert nvls_supported(readings, ["0", "1"], new)[1].startswith("GPU 1 has not finished")
    assert nvls_supported(readings, ["0", "2"]) == (False, "no NVML fabric reading for GPU 2")
    assert nvls_supported((), nccl=new) == (
        False,
        "NCCL turns NVLS on only with 2 or more GPUs of one node; 0 here",
    )


def joined(count: int) -> tuple[FabricReading, ...]:
    """An NVSwitch node's GPUs, each registered with the fabric (state completed, status 0)."""
    return tuple(FabricReading(i, f"GPU-{i}", "completed", 0, 0, None) for i in range(count))


@pytest.mark.parametrize(
    ("gpus", "nccl", "runs"),
    [
        # NCCL 2.18.1 to 2.28.3 turn NVLS off unless the node has 3 or more of the
        # communicator's GPUs (src/transport/nvls.cc: gpuCount <= 2); 2.28.7 made it gpuCount < 2.
        (2, (2, 24, 3), False),
        (2, (2, 28, 3), False),
        (2, (2, 28, 7), True),
        (2, (2, 29, 2), True),
        (2, None, False),  # version unknown: the older rule
        (3, (2, 24, 3), True),
        (3, None, True),
        (1, (2, 28, 7), False),
    ],
)
def test_nvls_needs_three_gpus_before_nccl_2_28_7(
    gpus: int, nccl: tuple[int, int, int] | None, runs: bool
) -> None:
    assert nvls_supported(joined(gpus), nccl=nccl)[0] is runs


def test_nvls_counts_the_probes_gpus_not_the_nodes() -> None:
    # NCCL counts the GPUs of its communicator on the node (the GPUs in its topology, which holds
    # only its own ranks' GPUs): a 2-GPU probe on an 8-GPU node has 2.
    node = joined(8)
    assert nvls_supported(node, ["0", "1"], (2, 27, 5)) == (
        False,
        "NCCL 2.27.5 turns NVLS on only with 3 or more GPUs of one node (2 since NCCL 2.28.7); "
        "2 here",
    )
    assert nvls_supported(node, ["0", "1", "GPU-1"], (2, 27, 5))[0] is False  # GPU 1 twice
    assert nvls_supported(node, ["0", "1", "7"], (2, 27, 5))[0] is True
    # Through the variant's skip, with the version the ranks of an earlier probe reported.
    assert paths.unsupported("nvls", "all_reduce", node, devices=["0", "1"], nccl="2.27.5") == (
        "nvls needs NVSwitch multicast: NCCL 2.27.5 turns NVLS on only with 3 or more GPUs of "
        "one node (2 since NCCL 2.28.7); 2 here"
    )
    assert paths.unsupported("nvls", "all_reduce", node, devices=["0", "1"], nccl="2.28.7") is None
    unknown = paths.unsupported("nvls", "all_reduce", node, devices=["0", "1"])
    assert unknown is not None and "NCCL version is not known yet" in unknown
    assert paths.unsupported("nvls", "all_reduce", node) is None  # all 8 GPUs


def test_fabric_from_raw() -> None:
    raw = SimpleNamespace(state=3, status=0, cliqueId=7, clusterUuid=[0] * 15 + [1])
    reading = fabric_from_raw(4, "GPU-x", raw)
    assert reading == FabricReading(4, "GPU-x", "completed", 0, 7, "00" * 15 + "01")
    waiting = fabric_from_raw(
        0, None, SimpleNamespace(state=2, status=5, cliqueId=0, clusterUuid=[0] * 16)
    )
    assert (waiting.state, waiting.status, waiting.clique_id) == ("in_progress", None, None)
    assert (
        fabric_from_raw(
            0, None, SimpleNamespace(state=9, status=0, cliqueId=0, clusterUuid=[0] * 16)
        ).state
        == "unknown"
    )
    assert fabric_from_raw(0, None, None, pynvml.NVML_ERROR_NOT_SUPPORTED).state == "not_supported"
    assert fabric_from_raw(0, None, None, None).state == "unknown"


def test_unsupported_variants_are_skipped_with_a_reason() -> None:
    hgx, pcie = read_fabric(h100()), read_fabric(pcie_node())
    assert paths.SKIP_REASON == "path_unsupported"
    assert paths.unsupported("nvls", "all_reduce", hgx, nccl="2.28.7") is None
    assert paths.unsupported("nvls", "all_reduce", pcie) == (
        "nvls needs NVSwitch multicast: "
        "GPU 0 is in no NVLink fabric (no NVSwitch, or before Hopper)"
    )
    # Not asked (CPU ranks): NCCL's variables mean nothing there, so nothing to skip.
    assert paths.unsupported("nvls", "all_reduce", None) is None
    # NVML gave nothing on an NCCL node: not known to be there, so skipped.
    assert paths.unsupported("nvls", "all_gather", ()) is not None
    # The other variants do not need the fabric.
    for path in ("default", "pcie", "ring", "tree"):
        assert paths.unsupported(path, "all_reduce", pcie) is None
    # What the configuration refuses is refused here too.
    assert paths.unsupported("tree", "broadcast", hgx) == paths.cannot_run("tree", "broadcast")
    # An NCCL older than 2.24 reads "AllReduce:Tree" as one unknown algorithm name.
    assert paths.unsupported("tree", "all_reduce", hgx, nccl="2.23.4") == (
        "tree needs NCCL 2.24 or later to force one collective's algorithm; "
        "the ranks run NCCL 2.23.4"
    )
    assert paths.unsupported("tree", "all_reduce", hgx, nccl="2.24.3") is None
    assert paths.unsupported("ring", "all_reduce", hgx, nccl="2.18.1") is None
    by_uuid = paths.unsupported(
        "nvls", "all_reduce", hgx, devices=["GPU-synthetic-1", "0"], nccl="2.28.9"
    )
    assert by_uuid is None
