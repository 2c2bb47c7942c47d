"""PCIe and NVLink health: recorded nvidia-smi output -> readings -> verdicts -> metric families
(the exporter's link_health collector), read_link_health on a stand-in pynvml (this machine has no
GPU), and the runner marking a pcie-path probe's own GPUs in the reading taken under its traffic.

The fixtures are published real outputs (tests/fixtures/SOURCES.md, "nvlink / PCIe"). The
stand-in pynvml (tests/fake_nvml.py) binds every call against the installed module's real
signature, and returns values shaped as the recorded machines report them.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from netmon.exposition.collector import link_health_families
from netmon.exposition.snapshot import Snapshot
from netmon.gpu.idle import IdleSourceError
from netmon.gpu.linkhealth import (
    DOWNTRAIN_REASONS,
    NVLINK_ERRORS,
    LinkHealth,
    NvLinkReading,
    NvLinkThroughput,
    PcieReading,
    downtrained,
    field_number,
    marked_loaded,
    nvlink_from_raw,
    parse_nvidia_smi_q_pci,
    parse_nvlink_status,
    parse_pcie_query_csv,
    pcie_from_raw,
    throughput_from_fields,
)
from netmon.gpu.nvml import NvmlUnavailable
from netmon.gpu.nvml_links import read_link_health
from tests.fake_nvml import LinkHealthNvml, nvml_error

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def pcie(
    gpu: int = 0,
    gen: int | None = 4,
    gen_max: int | None = 4,
    width: int | None = 16,
    width_max: int | None = 16,
    replay_counter: int | None = 0,
    loaded: bool = False,
) -> PcieReading:
    return PcieReading(gpu, gen, gen_max, width, width_max, replay_counter, loaded)


# --- recorded outputs -> readings ---------------------------------------------------------------


def test_rtx4070_laptop_q_block_is_gen4_x8_healthy() -> None:
    (reading,) = parse_nvidia_smi_q_pci(fixture("pcie_q_rtx4070_laptop_gen4_x8_healthy.txt"))
    assert reading == PcieReading(gpu=0, gen=4, gen_max=4, width=8, width_max=8, replay_counter=0)
    # A laptop part is natively x8: that is its maximum, not a fault.
    assert downtrained(reading, under_load=True) == []
    assert downtrained(reading, under_load=False) == []


def test_q_block_numbering_and_device_host_max_only() -> None:
    # `nvidia-smi -q -i 3` prints one block; the caller knows the index.
    text = fixture("pcie_q_rtx4070_laptop_gen4_x8_healthy.txt")
    assert [r.gpu for r in parse_nvidia_smi_q_pci(text, first_gpu=3)] == [3]
    # Two blocks (full `nvidia-smi -q`): numbered in order.
    assert [r.gpu for r in parse_nvidia_smi_q_pci(text + text)] == [0, 1]
    # Without the combined `Max` line, the lower of Device Max and Host Max is the bound, and
    # `Device Max` is never taken for `Max`.
    host_limited = text.replace("Max                       : 4", "Removed : x").replace(
        "Host Max                  : 4", "Host Max                  : 3"
    )
    (reading,) = parse_nvidia_smi_q_pci(host_limited)
    assert (reading.gen, reading.gen_max, reading.width_max) == (4, 3, 8)
    assert parse_nvidia_smi_q_pci("") == []


def test_q_block_with_not_available_values() -> None:
    text = (
        "    PCI\n"
        "        GPU Link Info\n"
        "            PCIe Generation\n"
        "                Max                       : N/A\n"
        "                Current                   : 1\n"
        "            Link Width\n"
        "                Max                       : 16x\n"
        "                Current                   : N/A\n"
    )
    (reading,) = parse_nvidia_smi_q_pci(text)
    assert reading == PcieReading(0, 1, None, None, 16, None)
    assert downtrained(reading, under_load=True) == []  # nothing to compare with


def test_rtx5060ti_csv_is_width_4_of_16() -> None:
    readings = parse_pcie_query_csv(fixture("pcie_query_csv_2x_rtx5060ti_gen3_x4_of_x16.txt"))
    assert len(readings) == 20  # ten samples of GPUs 1 and 2, in file order
    assert [r.gpu for r in readings[:4]] == [1, 2, 1, 2]
    assert set(readings) == {
        PcieReading(gpu=1, gen=3, gen_max=3, width=4, width_max=16, replay_counter=None),
        PcieReading(gpu=2, gen=3, gen_max=3, width=4, width_max=16, replay_counter=None),
    }
    for reading in readings:
        assert downtrained(reading, under_load=False) == ["width"]
        assert downtrained(reading, under_load=True) == ["width"]


def test_csv_columns_are_found_by_name() -> None:
    # nvidia-smi's own `--format=csv`: ", " separators, units in headers, [N/A] values.
    text = (
        "pcie.link.width.max, index, memory.used [MiB], pcie.link.gen.current,"
        " pcie.link.gen.max, pcie.link.width.current\n"
        "16, 0, 100 MiB, 1, 4, 16\n"
        "[N/A], 1, 100 MiB, [N/A], 5, 8\n"
    )
    assert parse_pcie_query_csv(text) == [
        PcieReading(0, 1, 4, 16, 16, None),
        PcieReading(1, None, 5, 8, None, None),
    ]
    assert parse_pcie_query_csv("") == []
    with pytest.raises(ValueError, match="index"):
        parse_pcie_query_csv("1,3,3,4,16\n")  # noheader: columns cannot be named


def test_generation_drop_counts_only_on_a_link_under_load() -> None:
    # An idle GPU parks its link at Gen1 (nvtop#6); on a link carrying probe traffic that is a
    # fault.
    parked = pcie(gen=1, gen_max=4, loaded=True)
    assert downtrained(parked, under_load=False) == []
    assert downtrained(parked, under_load=True) == ["generation"]
    both = pcie(gen=3, gen_max=4, width=8, width_max=16, loaded=True)
    assert downtrained(both, under_load=True) == ["generation", "width"]
    assert downtrained(both, under_load=False) == ["width"]
    assert downtrained(pcie(gen=None, width=None, loaded=True), under_load=True) == []
    # Read at the same moment but idle (not one of the probe's GPUs): the generation is not
    # judged; the width is, as ever.
    resting = pcie(gen=1, gen_max=4, width=8, width_max=16)
    assert downtrained(resting, under_load=True) == ["width"]
    assert DOWNTRAIN_REASONS == ("generation", "width")


def test_marked_loaded_marks_the_probes_gpus_only_and_only_under_load() -> None:
    readings = tuple(pcie(gpu, gen=1, gen_max=5) for gpu in range(4))
    load = marked_loaded(LinkHealth(readings, (), (), under_load=True, read_at=1.0), [1, 3, 9])
    assert [r.loaded for r in load.pcie] == [False, True, False, True]
    assert load.loaded == {1, 3}  # GPU 9 is not in the reading: nothing to mark
    assert load.pcie[1] == pcie(1, gen=1, gen_max=5, loaded=True)
    # Marks follow the latest probe: an earlier probe's GPUs are unmarked.
    assert marked_loaded(load, [0]).loaded == {0}
    # A reading not under load (an idle read, or one that came back after the traffic ended)
    # marks none, whatever GPUs the probe had.
    resting = LinkHealth(load.pcie, (), (), under_load=False, read_at=2.0)
    assert marked_loaded(resting, [0, 1]).loaded == frozenset()
    assert marked_loaded(load, []).loaded == frozenset()


def test_nvlink_status_bridged_pair_and_unbridged_gpu() -> None:
    readings = parse_nvlink_status(fixture("nvlink_status_3x_rtxa6000_one_unbridged.txt"))
    assert [(r.gpu, r.link) for r in readings] == [(g, n) for g in (0, 1) for n in range(4)]
    assert all(r.active for r in readings)
    assert all(r.errors() == dict.fromkeys(NVLINK_ERRORS) for r in readings)
    assert not [r for r in readings if r.gpu == 2]  # "all links are inActive"


def test_nvlink_status_inactive_link() -> None:
    text = "GPU 0: NVIDIA A100 (UUID: GPU-x)\n\t Link 0: 25 GB/s\n\t Link 1: <inactive>\n"
    assert [(r.link, r.active) for r in parse_nvlink_status(text)] == [(0, True), (1, False)]


# --- pynvml values -> readings ------------------------------------------------------------------


def field(value: int, *, ret: int = pynvml.NVML_SUCCESS, kind: int = 3) -> Any:
    """A real c_nvmlFieldValue_t, as nvmlDeviceGetFieldValues returns it."""
    raw = pynvml.c_nvmlFieldValue_t()
    raw.nvmlReturn = ret
    raw.valueType = kind
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        raw.value.uiVal = value
    else:
        raw.value.ullVal = value
    return raw


def test_pcie_from_raw() -> None:
    assert pcie_from_raw(
        1, gen=1, gen_max=4, width=16, width_max=16, replay_counter=12
    ) == PcieReading(1, 1, 4, 16, 16, 12)
    # Unanswered calls, and NVML_VALUE_NOT_AVAILABLE returned as a value, are unknown.
    assert pcie_from_raw(
        0, gen=None, gen_max=0xFFFFFFFF, width=None, width_max=None, replay_counter=None
    ) == PcieReading(0, None, None, None, None, None)


def test_nvlink_from_raw() -> None:
    reading = nvlink_from_raw(
        3,
        7,
        state=pynvml.NVML_FEATURE_ENABLED,
        errors={"replay": 5, "recovery": 0, "crc_flit": 2, "crc_data": None},
    )
    assert reading == NvLinkReading(3, 7, True, 5, 0, 2, None)
    down = nvlink_from_raw(3, 8, state=pynvml.NVML_FEATURE_DISABLED, errors={})
    assert down == NvLinkReading(3, 8, False, None, None, None, None)


def test_throughput_from_fields_converts_kib() -> None:
    assert throughput_from_fields(0, field(3), field(1 << 40)) == NvLinkThroughput(
        0, 3 * 1024, (1 << 40) * 1024
    )
    unsupported = field(0, ret=pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert throughput_from_fields(0, field(2), unsupported) == NvLinkThroughput(0, 2048, None)
    assert throughput_from_fields(0, unsupported, unsupported) is None
    assert throughput_from_fields(0, None, None) is None
    assert field_number(field(9, kind=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT)) == 9
    assert field_number(field(9, kind=99)) is None


# --- metric families ----------------------------------------------------------------------------


class Fixed:
    def __init__(self, families: Sequence[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def health_families(health: LinkHealth | None, per_link: bool = True) -> list[Metric]:
    """As the daemon's results publish a reading: one under load is also the generation's."""
    load = health if health is not None and health.under_load else None
    snapshot = Snapshot(link_health=health, link_load=load, nvlink_per_link=per_link)
    return list(link_health_families(snapshot))


def registry_of(health: LinkHealth | None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed(health_families(health)))
    return registry


def test_families_from_the_recorded_5060ti_under_load() -> None:
    readings = parse_pcie_query_csv(fixture("pcie_query_csv_2x_rtx5060ti_gen3_x4_of_x16.txt"))
    latest = tuple({r.gpu: r for r in readings}.values())
    load = LinkHealth(latest, (), (), under_load=True, read_at=1781646033.289)
    registry = registry_of(marked_loaded(load, [1, 2]))
    value = registry.get_sample_value
    assert value("netmon_pcie_link_generation", {"gpu": "1"}) == 3
    assert value("netmon_pcie_link_generation_max", {"gpu": "2"}) == 3
    assert value("netmon_pcie_link_width", {"gpu": "1"}) == 4
    assert value("netmon_pcie_link_width_max", {"gpu": "1"}) == 16
    assert value("netmon_pcie_link_downtrained", {"gpu": "1", "reason": "width"}) == 1
    assert value("netmon_pcie_link_downtrained", {"gpu": "2", "reason": "generation"}) == 0
    assert value("netmon_pcie_replay_errors_total", {"gpu": "1"}) is None  # not in the CSV
    assert value("netmon_link_health_read_timestamp_seconds") == 1781646033.289
    assert value("netmon_link_health_under_load") == 1


def test_families_idle_reading_has_no_generation_verdict() -> None:
    health = LinkHealth((pcie(gen=1, gen_max=4, replay_counter=7),), (), (), False, 5.0)
    registry = registry_of(health)
    value = registry.get_sample_value
    assert value("netmon_pcie_link_generation", {"gpu": "0"}) == 1
    assert value("netmon_pcie_link_downtrained", {"gpu": "0", "reason": "generation"}) is None
    assert value("netmon_pcie_link_downtrained", {"gpu": "0", "reason": "width"}) == 0
    assert value("netmon_pcie_replay_errors_total", {"gpu": "0"}) == 7
    assert value("netmon_link_health_under_load") == 0
    under_load = registry_of(marked_loaded(LinkHealth(health.pcie, (), (), True, 5.0), [0]))
    labels = {"gpu": "0", "reason": "generation"}
    assert under_load.get_sample_value("netmon_pcie_link_downtrained", labels) == 1


def downtrains(health: LinkHealth) -> dict[tuple[int, str], float]:
    """netmon_pcie_link_downtrained of a reading published as the daemon publishes it."""
    registry = registry_of(health)
    return {
        (int(sample.labels["gpu"]), sample.labels["reason"]): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == "netmon_pcie_link_downtrained"
    }


def test_an_under_load_reading_judges_the_generation_only_on_the_probes_gpus() -> None:
    # A pcie-path probe on GPUs 0 and 1 of an 8-GPU node: NVML reads all eight at that moment.
    # The probe's links run at Gen5; the other six sit idle at Gen1, saving power, and GPU 6
    # has lost half its lanes, which shows at idle too.
    def node(gen_of_1: int) -> LinkHealth:
        gens = [5, gen_of_1, 1, 1, 1, 1, 1, 1]
        readings = tuple(
            pcie(gpu, gen=gen, gen_max=5, width=8 if gpu == 6 else 16, width_max=16)
            for gpu, gen in enumerate(gens)
        )
        return marked_loaded(LinkHealth(readings, (), (), under_load=True, read_at=1.0), [0, 1])

    healthy = downtrains(node(gen_of_1=5))
    flagged = {key for key, value in healthy.items() if value == 1}
    assert flagged == {(6, "width")}
    assert healthy[(0, "generation")] == healthy[(1, "generation")] == 0
    for gpu in range(2, 8):  # idle, not judged: never flagged (0 or left out)
        assert healthy.get((gpu, "generation")) in (None, 0)
        assert (gpu, "width") in healthy
    # A loaded link trained to Gen3 of Gen5 is still a fault.
    slow = downtrains(node(gen_of_1=3))
    assert {key for key, value in slow.items() if value == 1} == {(1, "generation"), (6, "width")}


def test_families_nvlink_and_help_texts() -> None:
    recorded = parse_nvlink_status(fixture("nvlink_status_3x_rtxa6000_one_unbridged.txt"))
    links = (*recorded, NvLinkReading(2, 0, False, 1, 2, 3, None))
    health = LinkHealth((), links, (NvLinkThroughput(0, 4096, None),), True, 10.0)
    registry = registry_of(health)
    value = registry.get_sample_value
    assert value("netmon_nvlink_up", {"gpu": "1", "link": "3"}) == 1
    assert value("netmon_nvlink_up", {"gpu": "2", "link": "0"}) == 0
    for error, count in (("replay", 1), ("recovery", 2), ("crc_flit", 3)):
        labels = {"gpu": "2", "link": "0", "error": error}
        assert value("netmon_nvlink_errors_total", labels) == count
    assert (
        value("netmon_nvlink_errors_total", {"gpu": "2", "link": "0", "error": "crc_data"}) is None
    )
    assert value("netmon_nvlink_errors_total", {"gpu": "0", "link": "0", "error": "replay"}) is None
    assert value("netmon_nvlink_throughput_bytes_total", {"gpu": "0", "direction": "tx"}) == 4096
    assert value("netmon_nvlink_throughput_bytes_total", {"gpu": "0", "direction": "rx"}) is None
    text = generate_latest(registry).decode()
    assert "# TYPE netmon_nvlink_errors_total counter" in text
    assert "# TYPE netmon_nvlink_throughput_bytes_total counter" in text
    for family in health_families(health):
        assert "not at scrape time" in family.documentation or family.name.endswith("under_load")
        assert "probe" in family.documentation


def test_no_reading_no_families() -> None:
    assert health_families(None) == []
    assert generate_latest(registry_of(None)) == b""


# --- read_link_health on a stand-in pynvml -------------------------------------------------------


def test_read_link_health_reads_and_degrades() -> None:
    fake = LinkHealthNvml()
    health = read_link_health(under_load=False, nvml=fake)
    assert health.pcie == (
        PcieReading(0, 4, 4, 16, 16, 2),
        PcieReading(1, 1, 4, 8, 16, None),
    )
    assert [(r.gpu, r.link, r.active) for r in health.nvlinks] == [
        (0, link, link < 4) for link in range(6)
    ]
    assert health.nvlinks[0] == NvLinkReading(0, 0, True, 11, 1, 40, None)
    assert health.nvlinks[5] == NvLinkReading(0, 5, False, 0, 0, 0, None)
    assert health.throughput == (NvLinkThroughput(0, 5 * 1024, 7 * 1024),)
    assert not health.under_load
    assert health.read_at > 1.7e9
    # Link enumeration stops at InvalidArgument (GPU 0) and at NotSupported on link 0 (GPU 1).
    states = [args for name, args in fake.calls if name == "nvmlDeviceGetNvLinkState"]
    assert states == [(0, link) for link in range(7)] + [(1, 0)]
    # No field values asked of a GPU without NVLink, nothing asked of the lost GPU.
    assert [args[0] for name, args in fake.calls if name == "nvmlDeviceGetFieldValues"] == [0]
    assert [name for name, args in fake.calls if args[:1] == (2,)] == ["nvmlDeviceGetHandleByIndex"]
    assert fake.shutdowns == 1
    # Read idle, GPU 1's Gen1 is no fault; its x8 of x16 is.
    assert [downtrained(p, health.under_load) for p in health.pcie] == [[], ["width"]]


def test_read_link_health_families_end_to_end() -> None:
    health = read_link_health(under_load=True, nvml=LinkHealthNvml())
    assert health.loaded == frozenset()  # NVML does not know which GPUs the probe used
    registry = registry_of(marked_loaded(health, [0, 1]))
    value = registry.get_sample_value
    assert value("netmon_pcie_link_downtrained", {"gpu": "1", "reason": "generation"}) == 1
    assert value("netmon_pcie_link_downtrained", {"gpu": "0", "reason": "generation"}) == 0
    assert value("netmon_pcie_replay_errors_total", {"gpu": "0"}) == 2
    assert value("netmon_nvlink_up", {"gpu": "0", "link": "4"}) == 0
    assert value("netmon_nvlink_errors_total", {"gpu": "0", "link": "0", "error": "crc_flit"}) == 40
    assert value("netmon_nvlink_throughput_bytes_total", {"gpu": "0", "direction": "rx"}) == 7168
    assert value("netmon_link_health_under_load") == 1


def test_read_link_health_unsupported_everywhere() -> None:
    class Blind(LinkHealthNvml):
        def __getattr__(self, name: str) -> Any:
            call = super().__getattr__(name)
            answered = (
                "nvmlInit",
                "nvmlShutdown",
                "nvmlDeviceGetCount",
                "nvmlDeviceGetHandleByIndex",
            )
            if name in answered or not name.startswith("nvml"):
                return call

            def refuse(*args: Any) -> Any:
                inspect.signature(getattr(pynvml, name)).bind(*args)
                raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

            return refuse

    blind = Blind()
    health = read_link_health(under_load=True, nvml=blind)
    assert health.pcie == tuple(PcieReading(gpu, None, None, None, None, None) for gpu in (0, 1))
    assert health.nvlinks == ()
    assert health.throughput == ()
    registry = registry_of(health)
    assert registry.get_sample_value("netmon_pcie_link_width", {"gpu": "0"}) is None
    assert registry.get_sample_value("netmon_link_health_under_load") == 1
    assert blind.shutdowns == 1


def test_read_link_health_shuts_down_after_a_failure() -> None:
    class Broken(LinkHealthNvml):
        def _nvmlDeviceGetCount(self) -> int:
            raise nvml_error(pynvml.NVML_ERROR_UNKNOWN)

    broken = Broken()
    with pytest.raises(pynvml.NVMLError):
        read_link_health(under_load=False, nvml=broken)
    assert broken.shutdowns == 1


def test_read_link_health_without_a_driver_fails_cleanly() -> None:
    fake = LinkHealthNvml(init_error=nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    with pytest.raises(NvmlUnavailable, match="NVML unavailable: Driver Not Loaded"):
        read_link_health(under_load=False, nvml=fake)
    assert fake.shutdowns == 0


def test_read_link_health_on_this_machine() -> None:
    # The real pynvml: without the NVIDIA driver (this machine) it fails with a clear message.
    try:
        health = read_link_health(under_load=False)
    except NvmlUnavailable as exc:
        assert str(exc).startswith("NVML unavailable: ")
        assert isinstance(exc, IdleSourceError)
        return
    assert all(isinstance(r, PcieReading) for r in health.pcie)  # a GPU machine


def test_stand_in_field_values_are_real_structs() -> None:
    # The fake's field values are pynvml's own ctypes structs, so field_number reads them as it
    # would read the driver's.
    values = LinkHealthNvml().nvmlDeviceGetFieldValues(
        0, [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF)]
    )
    assert field_number(values[0]) == 5


def test_nvlinks_are_summed_per_gpu_by_default() -> None:
    def link(gpu: int, number: int, active: bool, replay: int | None) -> NvLinkReading:
        return NvLinkReading(gpu, number, active, replay, 0, None, 0)

    nvlinks = (
        link(0, 0, True, 2),
        link(0, 1, False, 3),
        link(0, 2, True, None),
        link(1, 0, True, 0),
    )
    health = LinkHealth((), nvlinks, (), under_load=False, read_at=1.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed(health_families(health, per_link=False)))
    value = registry.get_sample_value
    assert value("netmon_nvlink_links", {"gpu": "0"}) == 3
    assert value("netmon_nvlink_active_links", {"gpu": "0"}) == 2
    assert value("netmon_nvlink_gpu_errors_total", {"gpu": "0", "error": "replay"}) == 5
    assert value("netmon_nvlink_gpu_errors_total", {"gpu": "1", "error": "replay"}) == 0
    # A counter no link reports is left out, never summed to 0.
    assert value("netmon_nvlink_gpu_errors_total", {"gpu": "0", "error": "crc_flit"}) is None
    # Per-link series only when asked for (link_telemetry.nvlink_detail: link).
    assert value("netmon_nvlink_up", {"gpu": "0", "link": "1"}) is None
    text = generate_latest(registry).decode()
    assert "netmon_nvlink_errors_total" not in text and "netmon_nvlink_up" not in text


def test_generation_is_judged_on_the_last_reading_under_load_and_width_on_the_latest() -> None:
    # Under pcie-path traffic GPU 0 ran Gen4 of Gen5 (downtrained); the passive reading after it
    # shows Gen1 at idle (power saving, not judged) and a width that has since dropped to x8.
    load = LinkHealth((pcie(0, 4, 5, 16, 16, 0, True),), (), (), under_load=True, read_at=10.0)
    idle = LinkHealth((PcieReading(0, 1, 5, 8, 16, 0),), (), (), under_load=False, read_at=40.0)
    snapshot = Snapshot(link_health=idle, link_load=load, link_interval_s=30.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed(list(link_health_families(snapshot))))
    value = registry.get_sample_value
    assert value("netmon_pcie_link_downtrained", {"gpu": "0", "reason": "generation"}) == 1
    assert value("netmon_pcie_link_downtrained", {"gpu": "0", "reason": "width"}) == 1
    assert value("netmon_pcie_link_generation", {"gpu": "0"}) == 1  # what the link does now
    assert value("netmon_link_health_read_timestamp_seconds") == 40.0
    assert value("netmon_pcie_link_load_read_timestamp_seconds") == 10.0
    assert value("netmon_link_health_under_load") == 0
    assert value("netmon_link_health_interval_seconds") == 30.0
