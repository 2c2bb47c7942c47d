"""Passive link telemetry: NVML's NVLink and PCIe state and error counters, read on their own
schedule whether or not jobs hold the GPUs, so the link alerts never go blind while the node
works. NVML reads go to the driver, not to CUDA: they create no CUDA context and take nothing
from a job (docs/FACTS.md, "NVML")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from netmon.gpu.linkhealth import LinkHealth
from netmon.serve.results import Results

log = logging.getLogger(__name__)

# A failing NVML is logged at most this often; every failure is counted.
LOG_EVERY_S = 600.0


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
