"""The pairs probes' record (netmon.serve.pair_record), through the daemon's Results and the
exporter: a reload that removes a pairs probe takes all of its series with it."""

from __future__ import annotations

from pathlib import Path

from netmon import baseline
from netmon.exposition.collector import SnapshotPage
from netmon.probe.pairs import PairOutcome
from netmon.serve.current import CurrentConfig
from netmon.serve.keeper import BaselineKeeper
from netmon.serve.results import Results
from tests.gpu_node import dgx_h100
from tests.test_cardinality import PAIRS, dgx_config, outcome

# Every family of the pairs probes' record with a `probe` label (catalogue group "pairs").
PAIRS_SERIES = ("netmon_link_", "netmon_gpu_suspect", "netmon_pair_skips_total")


def exported(results: Results) -> str:
    return SnapshotPage(results.snapshot)().decode()


def pairs_lines(text: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if line.startswith(PAIRS_SERIES) and 'probe="pairs"' in line
    ]


def test_a_reload_that_removes_a_pairs_probe_removes_its_links_suspects_and_skips(
    tmp_path: Path,
) -> None:
    node = dgx_h100(tmp_path)
    with_pairs = dgx_config()
    with_pairs = with_pairs.model_copy(update={"probes": (*(with_pairs.probes or ()), PAIRS)})
    current = CurrentConfig(with_pairs)
    results = Results(current, BaselineKeeper(baseline.BaselineBook(with_pairs.baseline)))
    pairs = [
        PairOutcome((a, b), str(path), outcome(PAIRS, with_pairs))
        for (a, b), path in node.topology.pairs().items()
    ]
    results.finished_pairs(PAIRS, pairs, 1.0)
    before = pairs_lines(exported(results))
    # 28 pairs' links, and the skip reasons counted from 0.
    assert sum(line.startswith("netmon_link_busbw_bytes_per_second") for line in before) == 28
    assert any(line.startswith("netmon_pair_skips_total") for line in before)

    current.publish(dgx_config())  # the reload: the pairs probe is gone
    assert pairs_lines(exported(results)) == []
