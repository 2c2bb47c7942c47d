"""The SM clock of a rank's own GPU, read by the rank right after a size's measured loop, while
its kernels have just run: a latency read at an idle GPU's low clock is slower for a reason
that is no link's (docs/METRICS.md, `netmon_sm_clock_hertz`).

NVML is opened once per rank and kept until the rank exits (nvmlInit can take tens of
milliseconds). A rank that cannot read it reports nothing; it never fails the probe.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

log = logging.getLogger(__name__)


class SmClock:
    """Reads the current SM clock (MHz) of the GPU `visible` names (CUDA_VISIBLE_DEVICES' first
    entry: a UUID as netmon sets it, or an NVML index)."""

    def __init__(self, visible: str) -> None:
        self._visible = visible.split(",")[0].strip()
        self._stack = contextlib.ExitStack()
        self._nv: Any = None
        self._handle: Any = None
        self._failed = False

    def read_mhz(self) -> int | None:
        if self._failed or not self._visible:
            return None
        try:
            if self._handle is None:
                self._open()
            return int(self._nv.nvmlDeviceGetClockInfo(self._handle, self._nv.NVML_CLOCK_SM))
        except Exception as exc:  # NVML missing, NotSupported, a lost GPU: nothing to report
            log.debug("SM clock of %s unread: %s", self._visible, exc)
            self._failed = True
            return None

    def _open(self) -> None:
        from netmon.gpu.nvml import session

        self._nv = self._stack.enter_context(session())
        if self._visible.startswith(("GPU-", "MIG-")):
            self._handle = self._nv.nvmlDeviceGetHandleByUUID(self._visible)
        else:
            self._handle = self._nv.nvmlDeviceGetHandleByIndex(int(self._visible))

    def close(self) -> None:
        self._stack.close()
