"""The probes' series: the latest point of each size a probe measured, judged by the baseline book
as it is taken, and how many results of each judged probe were judged and were inconclusive.

Not locked itself: netmon.serve.results holds one and calls it under its own lock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from netmon import baseline
from netmon.config import NetmonConfig, ProbeConfig
from netmon.exposition.snapshot import (
    SeriesKey,
    SeriesPoint,
    VerdictPoint,
    forget_verdict,
    series_points,
    verdict_point,
)
from netmon.probe.spec import ProbeOutcome, SizeResult
from netmon.serve.jobs_record import PROBE as JOBS
from netmon.serve.known import judging_counters, judging_probes


class SeriesRecord:
    def __init__(self, config: NetmonConfig, book: baseline.BaselineBook) -> None:
        self._book = book
        self.points: dict[SeriesKey, SeriesPoint] = {}
        # Pre-set to 0 for every probe that judges results, so that increase() sees the first.
        self.inconclusive = judging_counters(config, {})
        # Results of judged series, conclusive or not: the disturbed share's denominator.
        self.series_results = dict.fromkeys(judging_probes(config), 0)

    def reconfigure(self, config: NetmonConfig, names: Collection[str]) -> None:
        """The series of removed probes go; a probe a reload added counts from 0 like one present
        at start."""
        self.points = {k: v for k, v in self.points.items() if k[0] in names}
        self.inconclusive = judging_counters(config, self.inconclusive)
        self.series_results = {p: self.series_results.get(p, 0) for p in judging_probes(config)}

    def learn(
        self, probe: ProbeConfig, outcome: ProbeOutcome, now: float, path: str, paused: bool
    ) -> list[tuple[baseline.BaselineKey, baseline.Verdict]]:
        """The outcome's series points, each judged as it is taken: every verdict, in order."""
        verdicts: list[tuple[baseline.BaselineKey, baseline.Verdict]] = []

        # Other work on the cores disturbs CPU ranks; a GPU's collective does not wait for the
        # host's cores the same way, and a job on its GPU preempts the probe (never judged).
        on_cpu = outcome.spec.backend == "gloo"

        def judge(key: baseline.BaselineKey, result: SizeResult) -> baseline.Verdict:
            foreign = result.foreign_cpu_share if on_cpu else None
            verdict = self._book.observe(
                key, result.busbw_bytes_per_second, result.cv, foreign, at=now, resettle=paused
            )
            # Only judged series: a size that is never judged loses nothing. Only probes still
            # configured: a run that ends after a reload removed its probe is not re-created.
            # Every result counts in the denominator, conclusive or not.
            if verdict.judged and probe.name in self.series_results:
                self.series_results[probe.name] += 1
                if verdict.inconclusive:
                    self.inconclusive[(probe.name, verdict.inconclusive)] += 1
            verdicts.append((key, verdict))
            return verdict

        for point in series_points(
            outcome, probe.name, now, path=path, min_busbw=probe.min_busbw, judge=judge
        ):
            self.points[point.key] = point
        return verdicts

    def forget(
        self, keys: Iterable[baseline.BaselineKey], jobs: dict[SeriesKey, SeriesPoint]
    ) -> None:
        """Series whose baselines were forgotten: their points (the jobs' among them) show no
        verdict until their next result."""
        for key in keys:
            for points in (self.points, jobs):
                if key in points:
                    points[key] = forget_verdict(points[key])

    def exported(self, jobs: Mapping[SeriesKey, SeriesPoint]) -> tuple[SeriesPoint, ...]:
        """Every point, in order, the jobs' after the probes'."""
        return tuple(self.points[key] for key in sorted(self.points)) + tuple(
            jobs[key] for key in sorted(jobs)
        )

    def restored(self, probes: Collection[str]) -> tuple[VerdictPoint, ...]:
        """Verdicts from the state file of series not measured since the start."""
        return tuple(
            verdict_point(key, verdict)
            for key, verdict in sorted(self._book.verdicts().items())
            # A probe a new configuration removed keeps its state (it may come back), but its
            # series are not exported: a degraded one would page forever. A shape of the jobs'
            # traffic shows from its next window only: the book keeps its verdict, not who
            # confirmed it, and a job's word alone is never a verdict (docs/INSPECTOR.md).
            if key not in self.points and key[0] in probes and key[0] != JOBS
        )
