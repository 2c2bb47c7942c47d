"""Whether this machine can run NCCL probes at all: an NVIDIA driver, NVML that lists GPUs, a
torch built with CUDA (netmon.gpu.torch_build), a driver that runs that CUDA and host PIDs
(netmon.gpu.compat). Read without importing torch or creating a CUDA context, so the daemon and
the commands can ask before they start anything; the answer names the first part missing."""

from __future__ import annotations

from pathlib import Path

from netmon import sim
from netmon.gpu.compat import node_fault
from netmon.gpu.torch_build import torch_without_cuda

_DRIVER = Path("/proc/driver/nvidia/version")
_DEVICE = Path("/dev/nvidiactl")


def missing_for_nccl() -> str | None:
    """What keeps NCCL probes from running here, in one phrase; None when nothing does. On a
    simulated node the node file stands for driver and NVML (its `nvml_errors` included), and
    ranks run on gloo: only what the node file can say is asked (netmon.gpu.compat)."""
    real = sim.active() is None
    if real and not (_DRIVER.exists() or _DEVICE.exists()):
        return f"no NVIDIA driver loaded ({_DRIVER} and {_DEVICE} are missing)"
    missing = _nvml_gpus() or (torch_without_cuda() if real else None)
    if missing is not None:
        return missing
    fault = node_fault()
    return fault.message if fault is not None else None


def _nvml_gpus() -> str | None:
    from netmon.gpu.idle import IdleSourceError
    from netmon.gpu.nvml import session

    try:
        with session() as nv:
            count = int(nv.nvmlDeviceGetCount())
    except IdleSourceError as exc:
        return str(exc)
    except Exception as exc:  # NVMLError on the count: a driver that lost its GPUs
        return f"NVML answers no GPU count: {exc}"
    return None if count else "NVML lists no GPU (in a container: is the GPU passed in?)"
