"""The idle decision over replayed NVML readings, and NvmlSource's translation of pynvml values.

tests/fixtures/recorded_idle_2gpu.json is SYNTHETIC: written by hand in the shape NvmlSource reads
a 2-GPU node (this machine has no GPU to record from). NvmlSource itself is driven through a
stand-in pynvml (tests/fake_nvml.py) whose every call is checked against the installed module's
real signatures.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pydantic
import pynvml
import pytest

from netmon.gpu.idle import (
    REASONS,
    GpuReading,
    IdleSourceError,
    decide,
    find_reading,
    foreign_processes,
)
from netmon.gpu.idle_policy import IdlePolicy
from netmon.gpu.idle_reading import reading_from_raw
from netmon.gpu.idle_sources import NoGpuSource, ReplaySource, check, sample
from netmon.gpu.nvml import NvmlSource, NvmlUnavailable
from tests.fake_nvml import IdleNvml, nvml_error

FIXTURE = Path(__file__).parent / "fixtures" / "recorded_idle_2gpu.json"
U0 = "GPU-3f2a9c1e-7b4d-4e0a-9a61-2c5d8e0f1b77"
U1 = "GPU-b81d0e44-19a3-4c2f-8d7e-5e6a0c93d2f1"
MiB = 1 << 20
POLICY = IdlePolicy()


class Sleeps:
    """An injected sleep: records the waits instead of waiting."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def scenario(name: str) -> ReplaySource:
    data = json.loads(FIXTURE.read_text())
    return ReplaySource.from_records(data["scenarios"][name])


def readings(name: str, policy: IdlePolicy = POLICY) -> list[list[GpuReading]]:
    return sample(scenario(name), policy, sleep=Sleeps())


def gpu(index: int = 0, **fields: Any) -> GpuReading:
    base = GpuReading(
        index=index,
        uuid=(U0, U1)[index],
        utilization=0.0,
        memory_used=3 * MiB,
        compute_pids=(),
    )
    return replace(base, **fields)


# --- decide() over the recorded scenarios ------------------------------------------------------


def test_idle_gpus_are_idle() -> None:
    decision = decide(readings("idle"), ["0", "1"], own_pids=(), policy=POLICY)
    assert decision.idle
    assert decision.reason is None
    assert decision.busy == {}


def test_a_foreign_process_makes_its_gpu_busy() -> None:
    decision = decide(readings("job_starts"), ["0", "1"], own_pids={1}, policy=POLICY)
    assert not decision.idle
    assert decision.reason == "gpu_busy_process"  # precedes utilization and memory
    assert decision.busy == {"1": "gpu_busy_process"}
    # The detail names the GPU and every finding, for the operator.
    assert f"GPU 1 ({U1})" in decision.detail
    assert "48213" in decision.detail
    assert "utilization up to 87%" in decision.detail
    assert "MiB used by others" in decision.detail


def test_our_own_process_is_ignored_with_its_memory() -> None:
    # A rank of ours still on the GPU (a re-check between sweeps): its PID and its 1.5 GiB are ours.
    ours = gpu(compute_pids=(4242,), process_memory=(1536 * MiB,), memory_used=1540 * MiB)
    assert decide([[ours]] * 3, ["0"], own_pids={4242}, policy=POLICY).idle
    assert decide([[ours]] * 3, ["0"], own_pids=(), policy=POLICY).busy == {"0": "gpu_busy_process"}


def test_our_process_of_unknown_memory_counts_against_the_limit() -> None:
    # NVML cannot say how much is ours (WDDM, some containers): the whole 1.5 GiB stays counted.
    ours = gpu(compute_pids=(4242,), process_memory=(None,), memory_used=1540 * MiB)
    decision = decide([[ours]], ["0"], own_pids={4242}, policy=POLICY)
    assert decision.busy == {"0": "gpu_busy_memory"}


def test_utilization_in_one_sample_of_three_is_busy() -> None:
    samples = readings("utilization_blip")
    assert [s[0].utilization for s in samples] == [0.0, 12.0, 0.0]
    decision = decide(samples, ["0"], own_pids=(), policy=POLICY)
    assert decision.reason == "gpu_busy_utilization"
    assert "12% in 1 of 3 samples" in decision.detail
    assert decide(samples, ["1"], own_pids=(), policy=POLICY).idle
    assert decide(samples, ["0"], (), IdlePolicy(max_utilization=13)).idle


def test_utilization_limit_is_exclusive() -> None:
    at_limit = [[gpu(utilization=5.0)]]
    assert decide(at_limit, ["0"], (), POLICY).reason == "gpu_busy_utilization"
    assert decide([[gpu(utilization=4.0)]], ["0"], (), POLICY).idle


def test_memory_held_without_a_process_is_busy() -> None:
    decision = decide(readings("memory_held"), ["0", "1"], own_pids=(), policy=POLICY)
    assert decision.busy == {"1": "gpu_busy_memory"}
    assert "6144 MiB used by others (limit 1024 MiB)" in decision.detail
    # The limit itself is allowed; one byte over is not.
    assert decide([[gpu(memory_used=1 << 30)]], ["0"], (), POLICY).idle
    assert not decide([[gpu(memory_used=(1 << 30) + 1)]], ["0"], (), POLICY).idle


def test_mig_gpus_are_skipped() -> None:
    samples = readings("mig")
    decision = decide(samples, ["0", "1"], own_pids=(), policy=POLICY)
    assert decision.busy == {"0": "gpu_mig"}
    assert "MIG enabled" in decision.detail
    # Not skipped: the MIG GPU's missing utilization now decides.
    no_skip = IdlePolicy(skip_mig=False)
    assert decide(samples, ["0"], (), no_skip).busy == {"0": "gpu_unknown"}
    assert decide(samples, ["0"], (), IdlePolicy(skip_mig=False, unknown_is_busy=False)).idle


def test_compute_mode_other_than_default_is_busy() -> None:
    samples = readings("exclusive_process")
    decision = decide(samples, ["0", "1"], own_pids=(), policy=POLICY)
    assert decision.busy == {"1": "gpu_compute_mode"}
    assert "compute mode exclusive_process" in decision.detail
    assert decide(samples, ["1"], (), IdlePolicy(require_default_compute_mode=False)).idle
    unknown_mode = [[gpu(compute_mode="unknown")]]
    assert decide(unknown_mode, ["0"], (), POLICY).reason == "gpu_compute_mode"


def test_a_device_missing_from_the_readings() -> None:
    decision = decide(readings("idle"), ["0", "7"], own_pids=(), policy=POLICY)
    assert decision.busy == {"7": "gpu_missing"}
    assert "GPU 7: not found by NVML" in decision.detail
    lost = decide(readings("gpu_lost"), ["0", U1], own_pids=(), policy=POLICY)
    assert lost.busy == {U1: "gpu_missing"}
    assert "missing in sample(s) 2, 3 of 3" in lost.detail


def test_devices_by_index_or_uuid() -> None:
    samples = readings("job_starts")
    by_index = decide(samples, ["1"], (), POLICY)
    by_uuid = decide(samples, [U1], (), POLICY)
    by_upper = decide(samples, [U1.upper()], (), POLICY)
    assert by_index.reason == by_uuid.reason == by_upper.reason == "gpu_busy_process"
    # Busy devices are keyed as the caller named them.
    assert by_uuid.busy == {U1: "gpu_busy_process"}
    assert by_upper.busy == {U1.upper(): "gpu_busy_process"}
    assert decide(samples, [U0, "0"], (), POLICY).idle
    assert find_reading(samples[0], "GPU-nonexistent") is None


def test_cpu_nodes_with_no_devices_are_idle() -> None:
    samples = sample(NoGpuSource(), POLICY, sleep=Sleeps())
    assert samples == [[], [], []]
    assert decide(samples, (), own_pids=(), policy=POLICY).idle
    # A GPU asked for on a node without any is missing, not idle.
    assert decide(samples, ["0"], (), POLICY).reason == "gpu_missing"


def test_reason_precedence_over_devices() -> None:
    samples = [[gpu(0, utilization=50.0), gpu(1, mig_enabled=True, compute_pids=(9,))]]
    decision = decide(samples, ["0", "1"], own_pids=(), policy=POLICY)
    assert decision.busy == {"0": "gpu_busy_utilization", "1": "gpu_mig"}
    assert decision.reason == "gpu_mig"  # comes first in REASONS
    assert REASONS.index("gpu_mig") < REASONS.index("gpu_busy_utilization")
    assert "MIG enabled; process(es) 9" in decision.detail


def test_unknown_readings_block_by_default() -> None:
    blind = [[gpu(utilization=None, memory_used=None, processes_known=False)]]
    decision = decide(blind, ["0"], (), POLICY)
    assert decision.busy == {"0": "gpu_unknown"}
    assert "NVML cannot report utilization, memory, processes" in decision.detail
    assert decide(blind, ["0"], (), IdlePolicy(unknown_is_busy=False)).idle


def test_policy_is_validated_and_frozen() -> None:
    with pytest.raises(pydantic.ValidationError):
        IdlePolicy(samples=0)
    with pytest.raises(pydantic.ValidationError):
        IdlePolicy.model_validate({"max_utilisation": 1})
    with pytest.raises(pydantic.ValidationError):
        POLICY.samples = 5  # type: ignore[misc]


# --- while a probe runs ------------------------------------------------------------------------


def test_foreign_processes() -> None:
    reading = [
        gpu(0, compute_pids=(100, 101, 7777)),
        gpu(1, compute_pids=(102,)),
    ]
    ours = {100, 101, 102, 1}
    assert foreign_processes(reading, ["0", "1"], ours) == {"0": (7777,)}
    assert foreign_processes(reading, [U0], ours) == {U0: (7777,)}
    assert foreign_processes(reading, ["1"], ours) == {}
    # Only our devices count; a vanished device or an unreadable process list cannot accuse.
    assert foreign_processes(reading, ["5"], ours) == {}
    blind = [gpu(0, compute_pids=(), processes_known=False)]
    assert foreign_processes(blind, ["0"], ours) == {}
    assert foreign_processes(reading, (), ours) == {}


def test_foreign_process_appearing_in_a_replay() -> None:
    source = scenario("job_starts")
    ours = {1}
    assert foreign_processes(source.read(), ["1"], ours) == {}
    assert foreign_processes(source.read(), ["1"], ours) == {"1": (48213,)}


# --- sampling ----------------------------------------------------------------------------------


def test_sample_spaces_readings_with_the_injected_sleep() -> None:
    sleeps = Sleeps()
    policy = IdlePolicy(samples=4, sample_interval=0.5)
    samples = sample(scenario("utilization_blip"), policy, sleep=sleeps)
    assert len(samples) == 4
    assert sleeps.calls == [0.5, 0.5, 0.5]  # between readings, none after the last
    # The replay's last sample repeats.
    assert samples[3] == samples[2]


def test_replay_repeats_its_last_sample() -> None:
    source = ReplaySource([[gpu(0)], [gpu(0, utilization=40.0)]])
    assert [source.read()[0].utilization for _ in range(4)] == [0.0, 40.0, 40.0, 40.0]


class Failing:
    def __init__(self, good: int) -> None:
        self.good = good

    def read(self) -> list[GpuReading]:
        if self.good <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        self.good -= 1
        return [gpu(0)]


def test_a_failing_source_raises_idle_source_error() -> None:
    sleeps = Sleeps()
    with pytest.raises(IdleSourceError, match=r"reading 2 of 3: NVMLError_GpuIsLost: GPU is lost"):
        sample(Failing(good=1), POLICY, sleep=sleeps)
    assert sleeps.calls == [0.2]


def test_check_turns_a_failing_source_into_nvml_error() -> None:
    decision = check(Failing(good=0), ["0", "1"], own_pids=(), policy=POLICY, sleep=Sleeps())
    assert not decision.idle
    assert decision.reason == "nvml_error"
    assert decision.busy == {"0": "nvml_error", "1": "nvml_error"}
    assert "GPU is lost" in decision.detail


def test_check_samples_then_decides() -> None:
    sleeps = Sleeps()
    decision = check(scenario("utilization_blip"), ["0"], (), POLICY, sleep=sleeps)
    assert decision.reason == "gpu_busy_utilization"
    assert sleeps.calls == [0.2, 0.2]


def test_check_without_devices_reads_nothing() -> None:
    # CPU-only probe: no NVML reading, no waiting, even if NVML is broken.
    sleeps = Sleeps()
    assert check(Failing(good=0), (), (), POLICY, sleep=sleeps).idle
    assert sleeps.calls == []


def test_recordings_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one"):
        ReplaySource([])
    with pytest.raises(ValueError, match="samples"):
        ReplaySource.from_records({"readings": []})
    bad = tmp_path / "recorded_bad.json"
    bad.write_text(json.dumps([[{"index": 0, "uuid": U0, "utilisation": 0}]]))
    with pytest.raises(ValueError):
        ReplaySource.from_json(bad)
    good = tmp_path / "recorded_one.json"
    one = {"index": 0, "uuid": U0, "utilization": 1, "memory_used": 0, "compute_pids": [3]}
    good.write_text(json.dumps({"samples": [[one]]}))
    assert ReplaySource.from_json(good).read() == [
        GpuReading(index=0, uuid=U0, utilization=1.0, memory_used=0, compute_pids=(3,))
    ]


# --- pynvml values -> GpuReading ---------------------------------------------------------------


def test_reading_from_raw_pynvml_values() -> None:
    reading = reading_from_raw(
        2,
        b"GPU-aa",  # older pynvml returns bytes
        utilization=SimpleNamespace(gpu=7, memory=1),
        memory=SimpleNamespace(total=80 << 30, free=(80 << 30) - 700 * MiB, used=700 * MiB),
        processes=[
            SimpleNamespace(pid=11, usedGpuMemory=600 * MiB, gpuInstanceId=0, computeInstanceId=0),
            SimpleNamespace(pid=12, usedGpuMemory=None),  # WDDM: pynvml gives None
            SimpleNamespace(pid=13, usedGpuMemory=(1 << 64) - 1),  # NVML_VALUE_NOT_AVAILABLE
        ],
        mig_mode=[0, 1],  # [current, pending]: enabling is pending until a reset
        compute_mode=pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
    )
    assert reading == GpuReading(
        index=2,
        uuid="GPU-aa",
        utilization=7.0,
        memory_used=700 * MiB,
        compute_pids=(11, 12, 13),
        mig_enabled=False,
        compute_mode="exclusive_process",
        process_memory=(600 * MiB, None, None),
        processes_known=True,
    )


def test_reading_from_raw_when_nvml_cannot_answer() -> None:
    reading = reading_from_raw(
        0,
        "GPU-bb",
        utilization=None,
        memory=None,
        processes=None,
        mig_mode=None,
        compute_mode=None,
    )
    assert reading.utilization is None
    assert reading.memory_used is None
    assert reading.compute_pids == ()
    assert not reading.processes_known
    assert not reading.mig_enabled  # a GPU without MIG support
    assert reading.compute_mode == "default"


@pytest.mark.parametrize(
    ("raw", "mode"),
    [
        (pynvml.NVML_COMPUTEMODE_DEFAULT, "default"),
        (pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD, "exclusive_thread"),
        (pynvml.NVML_COMPUTEMODE_PROHIBITED, "prohibited"),
        (pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS, "exclusive_process"),
        (42, "unknown"),
    ],
)
def test_compute_modes(raw: int, mode: str) -> None:
    reading = reading_from_raw(
        0, "GPU-cc", utilization=None, memory=None, processes=[], mig_mode=None, compute_mode=raw
    )
    assert reading.compute_mode == mode


def test_mig_mode_current_enabled() -> None:
    reading = reading_from_raw(
        0,
        "GPU-dd",
        utilization=None,
        memory=None,
        processes=[],
        mig_mode=[pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE],
        compute_mode=0,
    )
    assert reading.mig_enabled


# --- NvmlSource ---------------------------------------------------------------------------------


def test_nvml_source_reads_and_degrades() -> None:
    fake = IdleNvml(uuids=(U0, U1))
    with NvmlSource(fake) as source:
        first, second = source.read()
    assert first == GpuReading(
        index=0,
        uuid=U0,
        utilization=3.0,
        memory_used=5 * MiB,
        compute_pids=(321,),
        process_memory=(2 * MiB,),
        minor=0,
    )
    assert second == GpuReading(
        index=1,
        uuid=U1,
        utilization=None,
        memory_used=600 * MiB,  # v1, after v2 was refused
        compute_pids=(),
        compute_mode="exclusive_process",
        processes_known=False,  # and its minor number unanswered: None
    )
    assert fake.times_called("nvmlInit") == 1
    assert fake.shutdowns == 1
    decision = decide([[first, second]], ["0", "1", "2"], own_pids={321}, policy=POLICY)
    assert decision.busy == {"1": "gpu_compute_mode", "2": "gpu_missing"}


def test_nvml_source_close_is_idempotent_and_final() -> None:
    fake = IdleNvml(uuids=(U0, U1))
    source = NvmlSource(fake)
    source.close()
    source.close()
    assert fake.shutdowns == 1
    with pytest.raises(IdleSourceError, match="closed"):
        source.read()


def test_nvml_source_without_a_driver_fails_cleanly() -> None:
    fake = IdleNvml(uuids=(U0, U1), init_error=nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    with pytest.raises(NvmlUnavailable, match="NVML unavailable: Driver Not Loaded"):
        NvmlSource(fake)


def test_nvml_source_on_this_machine() -> None:
    # The real pynvml: on a machine without the NVIDIA driver (this one) construction fails with a
    # clear message and nothing else; importing netmon.gpu.nvml worked already.
    try:
        source = NvmlSource()
    except NvmlUnavailable as exc:
        assert str(exc).startswith("NVML unavailable: ")
        assert "driver" in str(exc)
        assert isinstance(exc, IdleSourceError)  # so check() treats it as nvml_error
        return
    with source:  # a GPU machine
        assert all(isinstance(r, GpuReading) for r in source.read())
