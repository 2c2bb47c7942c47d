"""Passive link telemetry: NVML's NVLink and PCIe state and error counters, read on their own
schedule whether or not jobs hold the GPUs, so the link alerts never go blind while the node
works. NVML reads go to the driver, not to CUDA: they create no CUDA context and take nothing
from a job (docs/FACTS.md, "NVML")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from netmon.config import NetmonConfig
from netmon.gpu.linkhealth import LinkHealth

if TYPE_CHECKING:  # results publishes load_interval: imported only for the type
    from netmon.serve.results import Results

log = logging.getLogger(__name__)

# A failing NVML is logged at most this often; every failure is counted.
LOG_EVERY_S = 600.0


def load_interval(config: NetmonConfig) -> float:
    """How often the PCIe links are read under load: the shortest interval of the local
    collectives that run the pcie path (netmon.serve.runner reads during their traffic); 0: none."""
    found = [
        p.interval
        for p in config.probes or ()
        if p.scope == "local" and p.kind == "collective" and "pcie" in p.paths
    ]
    return min(found, default=0.0) if config.backend == "nccl" else 0.0


class LinkTelemetry:
    """One scheduled read of link health (idle links: the PCIe generation is not judged)."""

    def __init__(self, reader: Callable[[bool], LinkHealth], results: Results) -> None:
        self.reader = reader
        self.results = results
        self._logged_at = -LOG_EVERY_S

    def read(self) -> None:
        try:
            health = self.reader(False)
        except Exception as exc:  # NVML missing or failing: counted, never raised at the scheduler
            self.results.link_read_failed()
            if time.monotonic() - self._logged_at >= LOG_EVERY_S:
                self._logged_at = time.monotonic()
                log.warning("link telemetry: NVML read failed: %s", exc)
            return
        self.results.set_link_health(health)
