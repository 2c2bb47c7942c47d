"""The metric contract as a golden file: metric names, types and labels, recorded from a real daemon
in a fixed state and from a snapshot with every optional family, must not change by accident.

`python -m tests.test_golden --write` records the golden file again (after a deliberate change).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_for
from tests.daemon_harness import DaemonProcess
from tests.test_exporter import FULL_SNAPSHOT, collect

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "golden_metrics.json"
# Label values that depend on the machine or the moment, not on the state: kept as names only.
VOLATILE_LABELS = {"version", "torch", "nccl"}


def contract(families: Iterable[Metric]) -> dict[str, Any]:
    """Per family: its type, and every sample's name with its labels (volatile values blanked)."""
    found: dict[str, Any] = {}
    for family in families:
        samples = sorted(
            {
                json.dumps(
                    [
                        sample.name,
                        {k: ("*" if k in VOLATILE_LABELS else v) for k, v in sample.labels.items()},
                    ],
                    sort_keys=True,
                )
                for sample in family.samples
            }
        )
        found[family.name] = {"type": family.type, "samples": samples}
    return dict(sorted(found.items()))


def daemon_config(tmp_path: Path) -> dict[str, Any]:
    """A fixed state: one collective probe and one pairs probe, each run once, on gloo."""
    return {
        "listen": "127.0.0.1:0",
        "state_dir": str(tmp_path / "state"),
        "backend": "gloo",
        "ranks": 2,
        "pause_file": str(tmp_path / "pause"),
        "pause_dir": str(tmp_path / "pause.d"),
        "probes": [
            {"name": "small", "sizes": [8, "1K"], "interval": "1h", "iters": 3, "warmup": 1},
            {
                "name": "pairs",
                "kind": "pairs",
                "sizes": ["64K"],
                "interval": "1h",
                "iters": 3,
                "warmup": 1,
            },
        ],
    }


def scrape_fixed_daemon(tmp_path: Path) -> dict[str, Any]:
    daemon = DaemonProcess(tmp_path, daemon_config(tmp_path))
    try:

        def both_ran() -> str | None:
            text = daemon.get()
            done = 'netmon_probe_last_run_timestamp_seconds{probe="small"}' in text
            return text if done and 'netmon_link_suspect{gpu="0"' in text else None

        text = wait_for(both_ran, 120, "both probes to report")
        assert daemon.stop() == 0
    finally:
        daemon.kill_all()
    return contract(text_string_to_metric_families(text))


def snapshot_contract() -> dict[str, Any]:
    return contract(collect(FULL_SNAPSHOT))


def test_a_daemon_in_a_fixed_state_exports_the_recorded_contract(tmp_path: Path) -> None:
    golden = json.loads(GOLDEN.read_text())
    assert scrape_fixed_daemon(tmp_path) == golden["daemon"]


def test_every_optional_family_keeps_its_recorded_names_types_and_labels() -> None:
    golden = json.loads(GOLDEN.read_text())
    assert snapshot_contract() == golden["snapshot"]


def test_the_golden_file_is_not_empty() -> None:
    golden = json.loads(GOLDEN.read_text())
    assert len(golden["snapshot"]) > 40 and len(golden["daemon"]) > 30
    assert dataclasses.is_dataclass(FULL_SNAPSHOT)


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        recorded = {"daemon": scrape_fixed_daemon(Path(directory)), "snapshot": snapshot_contract()}
    GOLDEN.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}: {len(recorded['daemon'])} + {len(recorded['snapshot'])} families")
