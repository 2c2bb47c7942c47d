"""The daemon's periodic read of the jobs' NCCL Inspector files (`inspector:`): files to
collectives (netmon.inspector.files), collectives to shape windows (netmon.inspector.shapes),
windows to judged series (Results). A read that fails is logged and counted; the next one runs."""

from __future__ import annotations

import logging
import time

from netmon.inspector.files import DumpReader, Reading
from netmon.inspector.jobdirs import check_root
from netmon.inspector.settings import InspectorConfig
from netmon.inspector.shapes import Shapes
from netmon.serve.results import Results

log = logging.getLogger(__name__)

JOB_ID = "inspector"  # the scheduler's id of the read (no probe name)


class JobsTraffic:
    def __init__(self, settings: InspectorConfig, results: Results) -> None:
        # Refused at start (ConfigError, one line) unless the directory is marked as netmon's:
        # the reader removes ended jobs' directories in it.
        check_root(settings.dir)
        self.reader = DumpReader(settings)
        self.shapes = Shapes(settings.max_shapes, settings.shape_idle, settings.window)
        self.results = results

    def read(self) -> None:
        now = time.time()
        try:
            # Ages and budgets on the monotonic clock: a step of the wall clock removes nothing.
            reading = self.reader.read(time.monotonic())
        except OSError as exc:
            log.warning("inspector: reading %s failed: %s", self.reader.settings.dir, exc)
            reading = Reading()
            reading.rejected["unreadable"] += 1
        except Exception:  # a defect: logged with its traceback, counted, the next read runs
            log.exception("inspector: reading %s failed", self.reader.settings.dir)
            reading = Reading()
            reading.rejected["internal"] += 1
        # The shapes' windows and idle times are elapsed time in this process: monotonic, so a
        # step of the wall clock neither closes every window nor expires every shape.
        round_ = self.shapes.take(reading.collectives, time.monotonic())
        self.results.jobs_read(round_, reading, now)
