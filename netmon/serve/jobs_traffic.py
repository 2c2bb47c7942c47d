"""The daemon's periodic read of the jobs' NCCL Inspector files (`inspector:`): files to
collectives (netmon.inspector.files), collectives to shape windows (netmon.inspector.shapes),
windows to judged series (Results). A read that fails is logged and counted; the next one runs."""

from __future__ import annotations

import logging
import time

from netmon.inspector.files import DumpReader, Reading
from netmon.inspector.settings import InspectorConfig
from netmon.inspector.shapes import Shapes
from netmon.serve.results import Results

log = logging.getLogger(__name__)

JOB_ID = "inspector"  # the scheduler's id of the read (no probe name)


class JobsTraffic:
    def __init__(self, settings: InspectorConfig, results: Results) -> None:
        self.reader = DumpReader(settings)
        self.shapes = Shapes(settings.max_shapes, settings.shape_idle, settings.window)
        self.results = results

    def read(self) -> None:
        now = time.time()
        try:
            reading = self.reader.read(now)
        except OSError as exc:
            log.warning("inspector: reading %s failed: %s", self.reader.settings.dir, exc)
            reading = Reading()
            reading.rejected["unreadable"] += 1
        self.results.jobs_read(self.shapes.take(reading.collectives, now), reading, now)
