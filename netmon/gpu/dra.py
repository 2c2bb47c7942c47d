"""Devices Dynamic Resource Allocation gave a container, and which GPU NVIDIA's DRA driver means
by each: pure naming rules, apart from the kubelet's protobuf (netmon.gpu.podresources) and
from NVML's minor numbers they are matched with (netmon.gpu.idle)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class DraDevice:
    """A device Dynamic Resource Allocation gave a container: its driver's name for it, and the
    CDI devices it was prepared as (older kubelets report only these)."""

    claim: str  # "namespace/name" of the ResourceClaim
    driver: str  # "" where the kubelet does not say
    device: str  # "" where the kubelet does not say
    cdi: tuple[str, ...] = ()


# NVIDIA's DRA driver for GPUs (NVIDIA/k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin): its driver
# name, the CDI vendor and class its devices are prepared under, and its device names:
# "gpu-<minor>" for a whole GPU and "gpu-<minor>-mig-<profile>-<id>-<start>" for a MIG device
# (deviceinfo.go and mig.go, CanonicalName); a CDI device is "<claim UID>-<that name>".
DRA_DRIVER = "gpu.nvidia.com"
DRA_CDI_KIND = "k8s.gpu.nvidia.com/"
_DRA_NAME = re.compile(r"(?:^|-)gpu-(\d+)(?:-mig-[a-z0-9-]+)?$")


def nvidia_gpu(device: DraDevice) -> bool:
    """Whether NVIDIA's DRA driver gave this device: by its driver name, or, from a kubelet that
    reports only CDI devices, by their kind."""
    if device.driver:
        return device.driver == DRA_DRIVER
    return any(name.startswith(DRA_CDI_KIND) for name in device.cdi)


def dra_minor(device: DraDevice) -> int | None:
    """The minor number of the GPU a device of NVIDIA's DRA driver is or lies on; None when its
    name does not say (a VFIO passthrough device, a naming not known here)."""
    names = [device.device] if device.device else [n.split("=", 1)[-1] for n in device.cdi]
    for name in names:
        found = _DRA_NAME.search(name)
        if found is not None:
            return int(found.group(1))
    return None
