"""bench/false_alarms.py, the false-alarm budget's measure: its rate bound, its outages, and a
short run of two classes whose document adds up. In process (--jobs 1 runs its trials in
this one): the bench is pure Python over netmon's replay engine, a day a trial a second."""

from __future__ import annotations

import io
import json
import math
import random
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import false_alarms as fa
import streams as s


@pytest.mark.parametrize(
    ("count", "bound"),
    # The exact one-sided 95 % upper bounds of a Poisson mean seen 0, 1, 2 and 10 times
    # (chi-square(0.95, 2k + 2) / 2): the rule of three for none.
    [(0, 2.9957), (1, 4.7439), (2, 6.2958), (10, 16.9622)],
)
def test_the_rate_bound_is_the_exact_poisson_one(count: int, bound: float) -> None:
    assert fa.upper_95(count, 1.0) == pytest.approx(bound, abs=1e-3)
    assert fa.upper_95(count, 30.0) == pytest.approx(bound / 30, abs=1e-4)


def test_an_outage_leaves_no_result_inside_it_and_may_end_in_a_restart() -> None:
    results = list(s.stream(s.Shape(s.flat, s.no_fault), 1, 1.0))
    gaps = [(2 * 3600.0, 5 * 3600.0), (10 * 3600.0, 10.5 * 3600.0)]
    kept = fa.without_gaps(results, gaps, random.Random(1))
    offsets = [float(r["t"]) - s.T0 for r in kept]
    assert not [t for t in offsets if any(a <= t < b for a, b in gaps)]
    assert len(kept) == len(results) - (3 * 60 + 30)
    restarted = [t for t, r in zip(offsets, kept, strict=True) if r.get("restart")]
    assert set(restarted) <= {5 * 3600.0, 10.5 * 3600.0}


def test_a_short_run_reports_each_class_with_its_exposure() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        code = fa.main(
            ["--classes", "outages,step", "--days", "1", "--series-years", "0.005", "--jobs", "1"]
        )
    assert code == 0
    document = json.loads(out.getvalue())
    assert document["setup"]["trials_a_class"] == 2  # 0.005 series-years in trials of a day
    for name in ("outages", "step"):
        summary = document["classes"][name]
        assert summary["trials"] == 2
        assert summary["series_years"] == round(2 / 365, 2)
        years = 2 / 365
        assert summary["upper_95_per_series_year"] == pytest.approx(
            fa.upper_95(summary["episodes_10"], years), rel=1e-2
        )
        assert 0 <= summary["degraded_share"] <= 1
        assert all(e["results"] >= fa.EPISODE for e in summary["episodes"])
    assert math.isfinite(document["seconds"])


def test_an_unknown_class_is_refused_naming_the_classes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped:
        fa.main(["--classes", "gaussian,nosuch"])
    assert stopped.value.code == 2
    assert "--classes: unknown nosuch (classes: gaussian," in capsys.readouterr().err
