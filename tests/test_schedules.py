"""What a reload keeps of the timetable (netmon.serve.schedules): the next run of every job
whose schedule is unchanged, and nothing of a job added, moved or gone."""

from __future__ import annotations

from netmon.config import NetmonConfig
from netmon.serve import schedules


def _config(*probes: dict[str, object], telemetry: float = 30.0) -> NetmonConfig:
    return NetmonConfig.model_validate(
        {"probes": list(probes), "link_telemetry": {"interval": telemetry}}
    )


def test_a_job_keeps_its_next_run_only_while_its_schedule_is_the_same() -> None:
    small = {"name": "small", "sizes": [8], "interval": 60}
    large = {"name": "large", "sizes": ["64M"], "interval": 900}
    before = _config(small, large)
    due = {"small": 1.0, "large": 2.0, "link-telemetry": 3.0, "gone": 4.0, "paused": None}
    keep = schedules.kept(
        schedules.of(before, "link-telemetry", "inspector"),
        schedules.of(_config({**small, "sizes": [8, 16]}, large), "link-telemetry", "inspector"),
        due,
    )
    assert keep == {"small": 1.0, "large": 2.0, "link-telemetry": 3.0}  # sizes are no schedule
    moved = _config({**small, "interval": 120}, {**large, "jitter": 5}, telemetry=10.0)
    keep = schedules.kept(
        schedules.of(before, "link-telemetry", "inspector"),
        schedules.of(moved, "link-telemetry", "inspector"),
        due,
    )
    assert keep == {}
