"""NVML's readings of the GPUs' links, read now: PCIe and NVLink state, error and traffic counters
(link health), and each GPU's NVLink fabric.

Each reader opens NVML through netmon.gpu.nvml's `session` and hands the answers to a pure
translation (netmon.gpu.linkhealth, netmon.gpu.fabric). Never initialises CUDA.
"""

from __future__ import annotations

import ctypes
import logging
import time
from typing import Any

from netmon.gpu import linkhealth
from netmon.gpu.fabric import FabricReading, fabric_from_raw
from netmon.gpu.nvml import as_text, asker, gpu_handles, session

log = logging.getLogger(__name__)

# nvmlFieldValue_t.scopeId asking for a per-link field summed over all of the GPU's links (nvml.h:
# "A scopeId of UINT_MAX returns aggregate value summed up across all links").
_ALL_LINKS = 0xFFFFFFFF


def read_link_health(under_load: bool, nvml: Any = None) -> linkhealth.LinkHealth:
    """PCIe and NVLink state and error counters of every GPU, read now.

    `under_load` is the caller's word that probe traffic flows during this call; only then does a
    lower PCIe generation count as downtrained. The maximum generation read is
    nvmlDeviceGetMaxPcieLinkGeneration, what GPU and host allow together;
    nvmlDeviceGetGpuMaxPcieLinkGeneration (the GPU alone) is not read, as a GPU in a slower slot
    runs as fast as it can. The translation is in netmon.gpu.linkhealth (*_from_raw).

    Raises NvmlUnavailable where NVML cannot be used. A GPU NVML cannot open is left out with a
    warning; a value NVML cannot give (NotSupported, NoPermission, ...) is None.
    """
    with session(nvml) as nv:
        ask = asker(nv)
        counters: dict[linkhealth.NvLinkError, int] = {
            "replay": nv.NVML_NVLINK_ERROR_DL_REPLAY,
            "recovery": nv.NVML_NVLINK_ERROR_DL_RECOVERY,
            "crc_flit": nv.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            "crc_data": nv.NVML_NVLINK_ERROR_DL_CRC_DATA,
        }
        # NotSupported at link 0: a GPU without NVLink. InvalidArgument: past the GPU's last link.
        no_more_links = (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT)
        throughput_fields = [
            (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
            (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
        ]
        read_at = time.time()
        pcie: list[linkhealth.PcieReading] = []
        nvlinks: list[linkhealth.NvLinkReading] = []
        throughput: list[linkhealth.NvLinkThroughput] = []
        for index, handle in gpu_handles(nv, "no link health for it"):
            pcie.append(
                linkhealth.pcie_from_raw(
                    index,
                    gen=ask(nv.nvmlDeviceGetCurrPcieLinkGeneration, handle),
                    gen_max=ask(nv.nvmlDeviceGetMaxPcieLinkGeneration, handle),
                    width=ask(nv.nvmlDeviceGetCurrPcieLinkWidth, handle),
                    width_max=ask(nv.nvmlDeviceGetMaxPcieLinkWidth, handle),
                    replay_counter=ask(nv.nvmlDeviceGetPcieReplayCounter, handle),
                )
            )
            links = []
            for link in range(int(nv.NVML_NVLINK_MAX_LINKS)):
                try:
                    state = nv.nvmlDeviceGetNvLinkState(handle, link)
                except nv.NVMLError as exc:
                    if getattr(exc, "value", None) in no_more_links:
                        break
                    log.debug("NVML: GPU %d NVLink %d state unanswered: %s", index, link, exc)
                    continue
                errors = {
                    name: ask(nv.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)
                    for name, counter in counters.items()
                }
                links.append(linkhealth.nvlink_from_raw(index, link, state=state, errors=errors))
            nvlinks.extend(links)
            if links:  # a GPU without NVLink has no throughput to count
                fields = ask(nv.nvmlDeviceGetFieldValues, handle, throughput_fields)
                tx, rx = (None, None) if fields is None else (fields[0], fields[1])
                sent = linkhealth.throughput_from_fields(index, tx, rx)
                if sent is not None:
                    throughput.append(sent)
    return linkhealth.LinkHealth(
        pcie=tuple(pcie),
        nvlinks=tuple(nvlinks),
        throughput=tuple(throughput),
        under_load=under_load,
        read_at=read_at,
    )


def read_fabric(nvml: Any = None) -> tuple[FabricReading, ...]:
    """Every GPU's NVLink fabric state, read now (nvmlDeviceGetGpuFabricInfoV).

    Raises NvmlUnavailable where NVML cannot be used. A GPU NVML cannot open is left out with a
    warning; one whose fabric NVML cannot read is "unknown", never a guess.
    """
    with session(nvml) as nv:
        ask = asker(nv)
        readings = []
        for index, handle in gpu_handles(nv, "no fabric reading for it"):
            uuid = ask(nv.nvmlDeviceGetUUID, handle)
            info, error = _fabric_info(nv, handle)
            text = None if uuid is None else as_text(uuid)
            readings.append(fabric_from_raw(index, text, info, error))
    return tuple(readings)


def _fabric_info(nv: Any, handle: object) -> tuple[Any, int | None]:
    """(struct, None), or (None, the NVML error code) where NVML answered with an error."""
    error: int | None = None
    # The versioned call first; a driver from before it has only the first form, and an old
    # pynvml neither (its missing names are skipped like the driver's).
    for call, struct in (
        ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
        ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
    ):
        ask, shape = getattr(nv, call, None), getattr(nv, struct, None)
        if ask is None or shape is None:
            continue
        info = shape()  # the V struct sets its own version field
        try:
            ask(handle, ctypes.pointer(info))  # NVML fills the struct the pointer names
        except nv.NVMLError as exc:
            error = getattr(exc, "value", None)
            log.debug("NVML: %s unanswered: %s", call, exc)
            if error == nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                continue
            return None, error
        return info, None
    return None, error
