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
    for args in (
        ["--from-file", str(FIXTURES / "topo_p2p_rw_2x_rtx5090_gns.txt")],
        ["--from-file", "/nonexistent"],
        [],
    ):
        done = topo(*args)
        assert done.returncode == 2
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
