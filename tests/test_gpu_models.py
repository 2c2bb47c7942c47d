"""The GPU model a node is known by (netmon_node_info): NVML's names read through netmon's
reader of a simulated node, and the pure choice of one model per node among them."""

from __future__ import annotations

from pathlib import Path

import pytest

from netmon.gpu.models import UNKNOWN_MODEL, GpuName, node_model, probed_models
from netmon.gpu.nvml import NvmlUnavailable, gpu_count, read_gpu_names
from tests.gpu_node import dgx_h100, mixed_models

A4000, A6000 = "NVIDIA RTX A4000", "NVIDIA RTX A6000"


def test_a_dgx_is_known_by_its_h100s(tmp_path: Path) -> None:
    node = dgx_h100(tmp_path)
    named = read_gpu_names(node.nvml)
    assert [gpu.index for gpu in named] == list(range(8))
    assert {gpu.uuid for gpu in named} == {node.uuid(i) for i in range(8)}
    assert node_model(probed_models(named, None)) == "NVIDIA H100 80GB HBM3"


def test_mixed_models_give_the_probed_gpus_majority_and_one_value(tmp_path: Path) -> None:
    node = mixed_models(tmp_path)  # NVML's GPU 0 and 2 are A4000s, GPU 1 an A6000
    named = read_gpu_names(node.nvml)
    assert probed_models(named, None) == [A4000, A6000, A4000]
    assert node_model(probed_models(named, None)) == A4000
    # Only the GPUs the probes use count, by index or by UUID.
    assert node_model(probed_models(named, ["1"])) == A6000
    assert node_model(probed_models(named, [node.uuid(1), "2"])) == A6000  # a tie: the first
    assert node_model(probed_models(named, ["2", "1"])) == A6000  # in index order, not listed


def test_a_gpu_nvml_cannot_name_is_left_out_and_none_named_is_unknown() -> None:
    named = (GpuName(0, "GPU-a", None), GpuName(1, "GPU-b", " NVIDIA H100 80GB HBM3 "))
    assert probed_models(named, None) == ["NVIDIA H100 80GB HBM3"]
    assert node_model(probed_models(named, ["0"])) == UNKNOWN_MODEL
    assert node_model([]) == UNKNOWN_MODEL


def test_without_a_driver_nvml_is_unavailable_and_the_daemon_says_unknown() -> None:
    # Without a GPU driver pynvml cannot initialise (the daemon then logs it and exports
    # gpu_model="unknown", netmon.serve.daemon).
    if gpu_count():
        pytest.skip("a GPU driver is here")
    with pytest.raises(NvmlUnavailable):
        read_gpu_names()
