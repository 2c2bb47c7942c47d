"""PCIe and NVLink health as NVML reports it: pure readings, verdicts, parsers of nvidia-smi text.

The live reader is netmon.gpu.nvml_links.read_link_health; it hands pynvml's raw values to the
*_from_raw functions here, and the parsers turn recorded nvidia-smi output into the same readings.
The exporter's link_health collector (netmon.exposition.collector) turns readings into metrics.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol, get_args

DowntrainReason = Literal["generation", "width"]
DOWNTRAIN_REASONS: tuple[DowntrainReason, ...] = get_args(DowntrainReason)
NvLinkError = Literal["replay", "recovery", "crc_flit", "crc_data"]
NVLINK_ERRORS: tuple[NvLinkError, ...] = get_args(NvLinkError)

# NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX count KiB of payload (nvml.h: "NVLink TX Data
# throughput in KiB"; without protocol overhead, which the _RAW_ fields add).
KIB = 1024


@dataclass(frozen=True)
class PcieReading:
    """One GPU's PCIe link. `gen_max` and `width_max` are what this GPU *and its slot* allow
    (nvmlDeviceGetMaxPcieLinkGeneration/-Width, nvidia-smi's `Max`, `pcie.link.gen.max`), not
    the GPU's own maximum: a Gen4 card in a Gen3 slot runs at its best at Gen3.

    `loaded` is not NVML's: the daemon sets it (marked_loaded) on the links of the GPUs whose
    pcie-path probe traffic flowed as the reading was taken, the only links whose generation
    can be judged.
    """

    gpu: int
    gen: int | None
    gen_max: int | None
    width: int | None
    width_max: int | None
    replay_counter: int | None  # PCIe replays since the last GPU reset
    loaded: bool = False


@dataclass(frozen=True)
class NvLinkReading:
    gpu: int
    link: int
    active: bool
    # Data-link-layer error counters since the last reset; None where NVML cannot give them.
    replay_errors: int | None
    recovery_errors: int | None
    crc_flit_errors: int | None
    crc_data_errors: int | None

    def errors(self) -> dict[NvLinkError, int | None]:
        return {
            "replay": self.replay_errors,
            "recovery": self.recovery_errors,
            "crc_flit": self.crc_flit_errors,
            "crc_data": self.crc_data_errors,
        }


@dataclass(frozen=True)
class NvLinkThroughput:
    """Payload bytes over all of one GPU's NVLinks since the counters last reset (cumulative)."""

    gpu: int
    tx_bytes: int | None
    rx_bytes: int | None


@dataclass(frozen=True)
class LinkHealth:
    """Every GPU's links, read at once. `under_load`: read while a probe's traffic flowed. NVML
    reads the whole node, so a reading under load also holds the links of GPUs the probe did not
    use, perhaps idle at Gen1; the probe's own are marked (PcieReading.loaded, `loaded`)."""

    pcie: tuple[PcieReading, ...]
    nvlinks: tuple[NvLinkReading, ...]
    throughput: tuple[NvLinkThroughput, ...]
    under_load: bool  # read while probe traffic flowed over the links
    read_at: float  # Unix time

    @property
    def loaded(self) -> frozenset[int]:
        """The GPUs whose PCIe links carried the probe traffic this reading was taken under."""
        return frozenset(reading.gpu for reading in self.pcie if reading.loaded)


def marked_loaded(health: LinkHealth, gpus: Collection[int]) -> LinkHealth:
    """`health` with the PCIe links of `gpus` (NVML indexes: the probe's GPUs) marked as having
    carried its traffic and every other link unmarked. A reading not under load marks none."""
    carried = frozenset(gpus) if health.under_load else frozenset()
    pcie = tuple(replace(reading, loaded=reading.gpu in carried) for reading in health.pcie)
    return replace(health, pcie=pcie)


def downtrained(reading: PcieReading, under_load: bool) -> list[DowntrainReason]:
    """Why the link runs below what GPU and slot allow; empty when healthy or unknown.

    A narrower link is a fault whenever it is seen (lanes are trained once, at boot or reset). A
    lower generation is one only on a link that carried probe traffic as it was read: an idle
    GPU drops its link to Gen1 to save power (nvtop#6), and returns to full speed when traffic
    comes. So the generation is judged only when the caller asks for it on a reading taken under
    load (`under_load`) and this link was one the traffic went over (`reading.loaded`); a GPU the
    probe left idle is not judged, though it was read at the same moment.

    Caveat: some boards report the slot's mechanical width as `width_max` although it is wired
    narrower; such a slot is reported as downtrained on every reading.
    """
    reasons: list[DowntrainReason] = []
    if (
        under_load
        and reading.loaded
        and reading.gen is not None
        and reading.gen_max is not None
        and reading.gen < reading.gen_max
    ):
        reasons.append("generation")
    if (
        reading.width is not None
        and reading.width_max is not None
        and reading.width < reading.width_max
    ):
        reasons.append("width")
    return reasons


# --- pynvml values -> readings ------------------------------------------------------------------

# NVML_VALUE_NOT_AVAILABLE as an unsigned int, which a few getters return instead of an error.
_NOT_AVAILABLE_32 = (1 << 32) - 1
_NOT_AVAILABLE_64 = (1 << 64) - 1


def _count(value: int | None) -> int | None:
    if value is None or value in (_NOT_AVAILABLE_32, _NOT_AVAILABLE_64) or value < 0:
        return None
    return int(value)


def pcie_from_raw(
    gpu: int,
    *,
    gen: int | None,
    gen_max: int | None,
    width: int | None,
    width_max: int | None,
    replay_counter: int | None,
) -> PcieReading:
    """A PcieReading from pynvml's answers (None for each call NVML could not answer)."""
    return PcieReading(
        gpu=gpu,
        gen=_count(gen),
        gen_max=_count(gen_max),
        width=_count(width),
        width_max=_count(width_max),
        replay_counter=_count(replay_counter),
    )


_FEATURE_ENABLED = 1  # NVML_FEATURE_ENABLED: nvmlDeviceGetNvLinkState's "link is active"


def nvlink_from_raw(
    gpu: int, link: int, *, state: int, errors: Mapping[NvLinkError, int | None]
) -> NvLinkReading:
    """A NvLinkReading from nvmlDeviceGetNvLinkState and its four DL error counters."""
    return NvLinkReading(
        gpu=gpu,
        link=link,
        active=state == _FEATURE_ENABLED,
        replay_errors=_count(errors.get("replay")),
        recovery_errors=_count(errors.get("recovery")),
        crc_flit_errors=_count(errors.get("crc_flit")),
        crc_data_errors=_count(errors.get("crc_data")),
    )


class RawFieldValue(Protocol):
    """pynvml's c_nvmlFieldValue_t, as far as it is read."""

    @property
    def nvmlReturn(self) -> int: ...  # this field's own NVML return code; 0 = NVML_SUCCESS

    @property
    def valueType(self) -> int: ...  # nvmlValueType_t, selects the member of `value`

    @property
    def value(self) -> object: ...  # c_nvmlValue_t union


# nvmlValueType_t -> member of the c_nvmlValue_t union
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def field_number(field: RawFieldValue | None) -> int | None:
    """The integer in one NVML field value; None when NVML did not answer that field."""
    if field is None or field.nvmlReturn != 0:
        return None
    if not 0 <= field.valueType < len(_VALUE_MEMBERS):
        return None
    number = getattr(field.value, _VALUE_MEMBERS[field.valueType])
    return _count(int(number))


def throughput_from_fields(
    gpu: int, tx: RawFieldValue | None, rx: RawFieldValue | None
) -> NvLinkThroughput | None:
    """NVLink payload bytes from the NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX field values (KiB,
    summed over links by scopeId UINT_MAX); None when NVML answered neither."""
    tx_kib, rx_kib = field_number(tx), field_number(rx)
    if tx_kib is None and rx_kib is None:
        return None
    return NvLinkThroughput(
        gpu=gpu,
        tx_bytes=None if tx_kib is None else tx_kib * KIB,
        rx_bytes=None if rx_kib is None else rx_kib * KIB,
    )


# --- nvidia-smi text -> readings ----------------------------------------------------------------


def _number(text: str | None) -> int | None:
    """ "4", "8x", " 16 " -> int; "N/A", "[Not Supported]", "" -> None."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*x?\s*", text)
    return int(match.group(1)) if match else None


def _column(name: str) -> str:
    # `--format=csv` headers carry units ("memory.used [MiB]"); the pcie.* fields have none.
    return name.split("[", 1)[0].strip().lower()


def parse_pcie_query_csv(text: str) -> list[PcieReading]:
    """Rows of `nvidia-smi --query-gpu=index,pcie.link.gen.current,pcie.link.gen.max,
    pcie.link.width.current,pcie.link.width.max --format=csv`, one reading per row, in order.

    Columns are found by header name, so extra columns and any order are fine; `index` is
    required. Repeated samples (`-l 1`) give several readings per GPU. No replay counter exists
    among the query fields, so `replay_counter` is None.
    """
    rows = [row for row in csv.reader(text.splitlines()) if any(cell.strip() for cell in row)]
    if not rows:
        return []
    header = {_column(name): position for position, name in enumerate(rows[0])}
    if "index" not in header:
        raise ValueError("nvidia-smi CSV without a header row naming the 'index' column")

    def cell(row: Sequence[str], name: str) -> str | None:
        position = header.get(name)
        return row[position] if position is not None and position < len(row) else None

    readings = []
    for row in rows[1:]:
        gpu = _number(cell(row, "index"))
        if gpu is None:
            raise ValueError(f"nvidia-smi CSV row without a GPU index: {','.join(row)!r}")
        readings.append(
            PcieReading(
                gpu=gpu,
                gen=_number(cell(row, "pcie.link.gen.current")),
                gen_max=_number(cell(row, "pcie.link.gen.max")),
                width=_number(cell(row, "pcie.link.width.current")),
                width_max=_number(cell(row, "pcie.link.width.max")),
                replay_counter=None,
            )
        )
    return readings


def _sections(text: str) -> Iterable[tuple[tuple[str, ...], str, str]]:
    """(enclosing section names, key, value) for each `key : value` line of `nvidia-smi -q`."""
    stack: list[tuple[int, str]] = []
    for raw in text.expandtabs().splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = tuple(name for _, name in stack)
        if re.search(r"\s:(\s|$)", line):
            key, _, value = line.partition(" :")
            yield path, key.strip(), value.strip()
        else:
            stack.append((indent, line.strip()))
            yield (*path, line.strip()), "", ""


def parse_nvidia_smi_q_pci(text: str, first_gpu: int = 0) -> list[PcieReading]:
    """The PCI blocks of `nvidia-smi -q` (or `-q -i N`: pass first_gpu=N), one reading each.

    GPUs are numbered in the order their blocks appear, which is nvidia-smi's index order.
    `Max` under "PCIe Generation" is the GPU-and-host maximum; where an nvidia-smi prints only
    "Device Max" and "Host Max", the lower of them is used. "Replay Number Rollovers" is ignored:
    NVML's replay counter does not include it either.
    """
    blocks: list[dict[tuple[str, str], str]] = []
    for path, key, value in _sections(text):
        if not key and path and path[-1] == "PCI":
            blocks.append({})
            continue
        if not key or not blocks or "PCI" not in path:
            continue
        section = path[-1] if path[-1] != "PCI" else ""
        blocks[-1][(section, key.lower())] = value

    readings = []
    for offset, fields in enumerate(blocks):
        gen_max = _number(fields.get(("PCIe Generation", "max")))
        if gen_max is None:
            bounds = [
                _number(fields.get(("PCIe Generation", "device max"))),
                _number(fields.get(("PCIe Generation", "host max"))),
            ]
            known = [bound for bound in bounds if bound is not None]
            gen_max = min(known) if known else None
        readings.append(
            PcieReading(
                gpu=first_gpu + offset,
                gen=_number(fields.get(("PCIe Generation", "current"))),
                gen_max=gen_max,
                width=_number(fields.get(("Link Width", "current"))),
                width_max=_number(fields.get(("Link Width", "max"))),
                replay_counter=_number(fields.get(("", "replays since reset"))),
            )
        )
    return readings


_GPU_LINE = re.compile(r"^GPU (\d+):")
_LINK_LINE = re.compile(r"^\s*Link (\d+):\s*(.*?)\s*$")
_SPEED = re.compile(r"\d+(\.\d+)?\s*[GM]B/s")


def parse_nvlink_status(text: str) -> list[NvLinkReading]:
    """`nvidia-smi nvlink -s`: a link with a speed ("14.062 GB/s") is active, "<inactive>" is
    not. A GPU printed with "all links are inActive" (no NVLink in use, or no bridge) gives no
    readings: nvidia-smi does not say how many links it has. Error counters are not in this
    output (they are in `nvidia-smi nvlink -e`), so they are None.
    """
    readings = []
    gpu: int | None = None
    for line in text.splitlines():
        if found := _GPU_LINE.match(line):
            gpu = int(found.group(1))
        elif (link := _LINK_LINE.match(line)) and gpu is not None:
            readings.append(
                NvLinkReading(
                    gpu=gpu,
                    link=int(link.group(1)),
                    active=_SPEED.match(link.group(2)) is not None,
                    replay_errors=None,
                    recovery_errors=None,
                    crc_flit_errors=None,
                    crc_data_errors=None,
                )
            )
    return readings


@dataclass(frozen=True)
class NvLinkSums:
    """One GPU's NVLinks in a few numbers: how many NVML lists, how many are active, and each
    error counter summed over the links that report it (absent when none does)."""

    links: int
    active: int
    errors: dict[NvLinkError, int]


def nvlink_sums(readings: Iterable[NvLinkReading]) -> dict[int, NvLinkSums]:
    by_gpu: dict[int, list[NvLinkReading]] = {}
    for reading in readings:
        by_gpu.setdefault(reading.gpu, []).append(reading)
    sums = {}
    for gpu, links in by_gpu.items():
        errors: dict[NvLinkError, int] = {}
        for link in links:
            for error, count in link.errors().items():
                if count is not None:
                    errors[error] = errors.get(error, 0) + count
        sums[gpu] = NvLinkSums(len(links), sum(link.active for link in links), errors)
    return sums
