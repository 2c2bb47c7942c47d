"""Thin NVML access (nvidia-ml-py). Never initialises CUDA; every call degrades to "no GPU"."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

_DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")


def gpu_count() -> int:
    """GPUs visible to NVML; 0 on a machine without the driver, never an exception."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError...
        log.debug("NVML unavailable: %s", exc)
    # The driver lists its GPUs here even when libnvidia-ml is not installed.
    try:
        return sum(1 for _ in _DRIVER_GPUS.iterdir())
    except OSError:
        return 0
