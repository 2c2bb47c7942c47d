"""Pairwise link probes over real links: four gloo ranks in four network namespaces, one shaped.

The verdict must name the shaped rank, and no other, as suspect; with the shaping removed it
must clear. Each rank runs inside its namespace through the rank wrapper (`ip netns exec`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.netns import Namespaces


@pytest.fixture
def namespaces() -> Iterator[Namespaces]:
    spaces = Namespaces(4)
    try:
        yield spaces
    finally:
        spaces.remove()
        assert spaces.existing() == []


def pair_probe(spaces: Namespaces) -> tuple[int, dict[str, Any]]:
    # Best of two passes, and a class-median ratio for a noisy 2-core host: shaping a rank's
    # link to 500 Mbit/s puts its pairs near 0.17 of the median, clean pairs stay above 0.7.
    flags = "--pairs --backend gloo --ranks 4 --sizes 16M -n 3 -w 1 --batch 2 --json -q"
    flags += " --passes 2 --suspect-ratio 0.4 --env GLOO_SOCKET_IFNAME=eth0"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "netmon",
            "probe",
            *flags.split(),
            "--wrapper",
            spaces.wrapper(),
            "--host",
            spaces.host_template(),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_the_shaped_rank_is_the_only_suspect_and_clears(namespaces: Namespaces) -> None:
    namespaces.shape(2, "500mbit")
    status, doc = pair_probe(namespaces)
    assert len(doc["pairs"]) == 6 and len(doc["rounds"]) == 3
    assert all(pair["ok"] for pair in doc["pairs"])
    assert doc["verdict"]["suspect_gpus"] == [2], doc["verdict"]
    assert doc["verdict"]["suspect_pairs"] == []
    assert status == 1
    low = {(p["gpu"], p["peer_gpu"]) for p in doc["pairs"] if p["low"]}
    assert low == {(0, 2), (1, 2), (2, 3)}

    namespaces.unshape(2)
    status, doc = pair_probe(namespaces)
    assert doc["verdict"]["suspect_gpus"] == [] and doc["verdict"]["suspect_pairs"] == []
    assert status == 0
