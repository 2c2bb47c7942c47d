"""What a probe's ranks reported on their channels, gathered into the outcome's parts: each size's
result, the time spent in collectives, peak memory, the GPU each rank opened, and the versions
and devices the ranks ran with."""

from __future__ import annotations

import socket
from typing import Any

import netmon
from netmon import bandwidth
from netmon.probe import cpushare, graphs
from netmon.probe.spec import ProbeEnvironment, ProbeSpec, SizeResult


class RankReports:
    def __init__(self, spec: ProbeSpec) -> None:
        self.spec = spec
        self.results: list[SizeResult] = []
        self.collective_s = 0.0
        self.peaks: dict[str, int] = {}  # "mem" (device) and "rss" (host): the max over ranks
        self.gpus: dict[int, str] = {}  # rank -> the GPU its CUDA opened
        self.environment_report: dict[str, Any] = {}

    def peak(self, kind: str, peak_bytes: int) -> None:
        self.peaks[kind] = max(self.peaks.get(kind, 0), peak_bytes)

    def size(self, event: dict[str, Any]) -> SizeResult:
        """One size's result from every rank's samples, kept in order."""
        spec = self.spec
        per_rank = [[float(v) for v in times] for times in event["samples"]]
        size_bytes = int(event["size_bytes"])
        samples = bandwidth.combine_ranks(per_rank, spec.rank_stat)
        self.collective_s += sum(samples) * (spec.batch if spec.timing == "batched" else 1)
        cpu = cpushare.rows_of(event.get("cpu"))
        result = SizeResult.of_samples(
            spec, size_bytes, int(event["count"]), samples, per_rank, event.get("check_ok"), cpu
        )
        result = result.carrying(event.get("carried_bytes")).reported(event)
        graphs.note(spec, result)
        self.results.append(result)
        return result

    def environment(self) -> ProbeEnvironment:
        report = self.environment_report
        devices = tuple(filter(None, str(report.get("devices", "")).split(",")))
        return ProbeEnvironment(
            netmon=netmon.__version__,
            torch=report.get("torch"),
            backend=self.spec.backend,
            nccl=report.get("nccl"),
            ranks=self.spec.ranks,
            host=socket.gethostname(),
            python=report.get("python"),
            devices=tuple(self.spec.devices) or devices,
            cuda_uuids=tuple(self.gpus.get(r, "") for r in range(self.spec.ranks)),
        )
