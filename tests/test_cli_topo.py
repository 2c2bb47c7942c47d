"""`netmon topo` on recorded `nvidia-smi topo -m` output (no GPU here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def topo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "netmon", "topo", *args], capture_output=True, text=True, timeout=60
    )


def test_8_gpu_nv18_gives_28_pairs_in_7_rounds_of_4() -> None:
    done = topo(
        "--from-file", str(FIXTURES / "topo_8xH100_sxm_nv18_nonic_mlengineering.txt"), "--json"
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [gpu["index"] for gpu in doc["gpus"]] == list(range(8))
    assert len(doc["pairs"]) == 28
    assert {pair["path"] for pair in doc["pairs"]} == {"NV18"}
    assert {"gpu", "peer_gpu", "path"} <= set(doc["pairs"][0])
    assert [len(r) for r in doc["rounds"]] == [4] * 7
    seen = sorted(tuple(sorted(pair)) for rnd in doc["rounds"] for pair in rnd)
    assert seen == sorted((i, j) for i in range(8) for j in range(i + 1, 8))
    text = topo("--from-file", str(FIXTURES / "topo_8xH100_sxm_nv18_nonic_mlengineering.txt"))
    assert "28 pairs in 7 rounds" in text.stdout


def test_pcie_box_with_nics() -> None:
    done = topo(
        "--from-file", str(FIXTURES / "topo_4x_rtx6000ada_pcie_cx7_asus_esc8000a.txt"), "--json"
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert len(doc["pairs"]) == 6 and len(doc["rounds"]) == 3
    assert doc["nics"]


def test_errors_are_one_line() -> None:
    for args, code in (
        (["--from-file", str(FIXTURES / "topo_p2p_rw_2x_rtx5090_gns.txt")], 2),
        (["--from-file", "/nonexistent"], 2),
        ([], 3),  # no GPU (no NVML) here: could not run, as for probe and selftest
    ):
        done = topo(*args)
        assert done.returncode == code, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_the_table_fits_120_columns_unless_wide() -> None:
    # 8 GPUs beside 9 NICs: 135 columns as nvidia-smi prints it.
    fixture = str(FIXTURES / "topo_8xH100_nv18_9nic_TRUNCATED.txt")
    narrow, wide = topo("--from-file", fixture), topo("--from-file", fixture, "--wide")
    assert narrow.returncode == wide.returncode == 0, narrow.stderr + wide.stderr
    assert max(map(len, narrow.stdout.splitlines())) <= 120
    assert "GPU to NIC paths:" in narrow.stdout
    # --wide: one matrix, GPUs and NICs side by side, as nvidia-smi prints it.
    heading = wide.stdout.splitlines()[0].split()
    assert heading[7:10] == ["GPU7", "NIC0", "NIC1"] and heading[-5:-4] == ["NIC8"]
    assert max(map(len, wide.stdout.splitlines())) > 120
    assert "GPU to NIC paths:" not in wide.stdout
    # Every path of the wide matrix is in the narrow tables: nothing is lost by fitting.
    assert set(wide.stdout.split()) <= set(narrow.stdout.split())
