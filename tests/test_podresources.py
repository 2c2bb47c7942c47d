"""The hand decoder of the kubelet's ListPodResourcesResponse, against google.protobuf's encoder;
the kubelet's pod list and the pure rule of which pods still hold their GPUs.

Every message here is built and serialised by google.protobuf from descriptors of the kubelet's
api.proto (tests/fake_kubelet.py), so the expected values do not come from the decoder's own
reading of the wire format.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import DecodeError as ProtobufDecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from netmon.gpu.dra import DraDevice, dra_minor, nvidia_gpu
from netmon.gpu.podresources import (
    ContainerDevices,
    ContainerResources,
    DecodeError,
    PodPhase,
    PodPhases,
    PodResources,
    decode_list_response,
    decode_pod_list,
    device_uuid,
    gpu_allocations,
)
from tests.fake_kubelet import FUTURE, PB, pod_list, response, serialize

U0 = "GPU-3f2a9c1e-7b4d-4e0a-9a61-2c5d8e0f1b77"
U1 = "GPU-b81d0e44-19a3-4c2f-8d7e-5e6a0c93d2f1"
U2 = "GPU-0c7e5a12-44f1-4b8e-a2d3-9f61b0e8c4a5"
U3 = "GPU-d29f83b0-6a7c-4e15-b9d2-13c84f7a0e66"
MIG = "MIG-5e8b2c41-93d7-5a0f-b6e1-7c24d9f0a381"

# A node as the kubelet would list it: whole GPUs, time-slicing replicas, MIG (both UUID forms),
# and resources that are no GPU (a device of another vendor, a NIC of NVIDIA's network operator
# by PCI address, exclusive CPUs and hugepages, which travel in fields the decoder skips).
NODE = [
    ("ml", "train-0", [("trainer", [("nvidia.com/gpu", [U0, U1])]), ("sidecar", [])]),
    ("ml", "share-a", [("c", [("nvidia.com/gpu", [f"{U2}::0"])])]),
    ("ml", "share-b", [("c", [("nvidia.com/gpu.shared", [f"{U2}::3"])])]),
    ("ml", "mig", [("c", [("nvidia.com/mig-1g.5gb", [MIG])])]),
    ("ml", "old-mig", [("c", [("nvidia.com/gpu", [f"MIG-{U3}/1/0"])])]),
    ("web", "fpga", [("c", [("example.com/fpga", ["fpga-3"])])]),
    ("net", "sriov", [("c", [("nvidia.com/mlnx_sriov_rdma", ["0000:3b:00.2"])])]),
]


def _filled(classes: dict[str, Any] = PB) -> Any:
    """NODE, with the fields the decoder does not read filled in as a real kubelet would."""
    message = response(NODE, classes)
    trainer = message.pod_resources[0].containers[0]
    trainer.cpu_ids.extend([2, 3, 66])
    memory = trainer.memory.add(memory_type="hugepages-2Mi", size=1 << 30)
    memory.topology.nodes.add(ID=1)
    trainer.devices[0].topology.nodes.add(ID=0)
    claim = trainer.dynamic_resources.add(claim_name="gpu-claim", claim_namespace="ml")
    claimed = claim.claim_resources.add(driver_name="gpu.example.com", pool_name="node-a")
    claimed.device_name = "gpu-0"
    claimed.cdi_devices.add(name="example.com/gpu=gpu-0")
    return message


def _expected(message: Any) -> tuple[PodResources, ...]:
    """What google.protobuf parsed, as netmon.gpu.podresources' values."""
    return tuple(
        PodResources(
            pod.name,
            pod.namespace,
            tuple(
                ContainerResources(
                    container.name,
                    tuple(
                        ContainerDevices(d.resource_name, tuple(d.device_ids))
                        for d in container.devices
                    ),
                    tuple(
                        DraDevice(
                            f"{claim.claim_namespace}/{claim.claim_name}",
                            resource.driver_name,
                            resource.device_name,
                            tuple(cdi.name for cdi in resource.cdi_devices),
                        )
                        for claim in container.dynamic_resources
                        for resource in claim.claim_resources
                    ),
                )
                for container in pod.containers
            ),
        )
        for pod in message.pod_resources
    )


def _tag(number: int, wire: int) -> bytes:
    value, out = number << 3 | wire, bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


def _later(message: Any) -> None:
    """Fields of every wire type a future kubelet might add, set on one message."""
    message.later_varint = -5
    message.later_fixed64 = 1 << 63
    message.later_text.extend(["a", "b"])
    message.later.inner = 7  # a group: start and end tags
    message.later_fixed32 = 1.5
    message.later_packed.extend([1, -1, 1 << 40])
    message.later_message.nodes.add(ID=3)


def test_an_empty_answer_is_no_pods() -> None:
    assert serialize(PB["ListPodResourcesResponse"]()) == b""
    assert decode_list_response(b"") == ()


def test_pods_containers_and_devices_decode_as_protobuf_encoded_them() -> None:
    decoded = decode_list_response(serialize(_filled()))
    assert decoded[0] == PodResources(
        "train-0",
        "ml",
        (
            ContainerResources(
                "trainer",
                (ContainerDevices("nvidia.com/gpu", (U0, U1)),),
                (
                    DraDevice(
                        "ml/gpu-claim", "gpu.example.com", "gpu-0", ("example.com/gpu=gpu-0",)
                    ),
                ),
            ),
            ContainerResources("sidecar", ()),
        ),
    )
    assert decoded == _expected(_filled())
    assert [p.name for p in decoded] == [name for _, name, _ in NODE]


def test_fields_a_newer_kubelet_adds_are_skipped_whatever_their_wire_type() -> None:
    future = _filled(FUTURE)
    _later(future)
    for pod in future.pod_resources:
        _later(pod)
        for container in pod.containers:
            _later(container)
            for devices in container.devices:
                _later(devices)
    data = serialize(future)
    # The encoder did put every wire type in: varint, fixed64, bytes, group start/end, fixed32.
    tags = [(1001, 0), (1002, 1), (1003, 2), (1004, 3), (1004, 4), (1005, 5)]
    assert all(_tag(number, wire) in data for number, wire in tags)
    assert decode_list_response(data) == _expected(_filled())


def test_a_known_field_number_with_another_wire_type_is_skipped_as_protobuf_skips_it() -> None:
    # PodResources.name (1) sent as a varint, then as the string it is.
    pod = b"\x08\x05" + b"\x0a\x03job"
    data = b"\x0a" + bytes([len(pod)]) + pod
    parsed = PB["ListPodResourcesResponse"].FromString(data)
    assert decode_list_response(data) == _expected(parsed)
    assert decode_list_response(data)[0].name == "job"


def test_gpu_allocations_strip_replicas_and_leave_non_gpu_resources_out() -> None:
    found = gpu_allocations(decode_list_response(serialize(_filled())))
    assert set(found.gpus) == {U0.lower(), U1.lower(), U2.lower(), U3.lower()}
    trainer = found.gpus[U1.lower()]
    assert (trainer.namespace, trainer.pod, trainer.container) == ("ml", "train-0", "trainer")
    assert str(trainer) == "pod ml/train-0 container trainer (nvidia.com/gpu)"
    # Two time-slicing replicas of one GPU: the GPU is held, by the first listed.
    assert found.gpus[U2.lower()].device_id == f"{U2}::0"
    # The old MIG UUID names its GPU; the current one does not.
    assert found.gpus[U3.lower()].pod == "old-mig"
    assert [a.device_id for a in found.mig] == [MIG]
    # A NIC by PCI address under nvidia.com/ is no GPU; neither is another vendor's device.
    assert found.unmapped == ()


def test_a_gpu_resource_whose_ids_are_no_uuids_is_kept_as_unmapped() -> None:
    # Another device plugin advertising nvidia.com/gpu by device file name.
    answer = response([("ml", "job", [("c", [("nvidia.com/gpu", ["nvidia0", "nvidia1"])])])])
    found = gpu_allocations(decode_list_response(serialize(answer)))
    assert found.gpus == {}
    assert [a.device_id for a in found.unmapped] == ["nvidia0", "nvidia1"]


def test_netmons_own_pod_is_left_out_but_a_replica_sharing_its_gpu_is_not() -> None:
    answer = response(
        [
            ("netmon", "netmon-x7k2p", [("netmon", [("nvidia.com/gpu", [U0, f"{U2}::1"])])]),
            ("ml", "share", [("c", [("nvidia.com/gpu", [f"{U2}::2"])])]),
            ("other-ns", "netmon-x7k2p", [("c", [("nvidia.com/gpu", [U1])])]),
        ]
    )
    found = gpu_allocations(decode_list_response(serialize(answer)), ("netmon", "netmon-x7k2p"))
    assert set(found.gpus) == {U2.lower(), U1.lower()}  # same pod name, other namespace: a job
    assert found.gpus[U2.lower()].pod == "share"


@pytest.mark.parametrize(
    ("device_id", "uuid"),
    [
        (U0, U0),
        (f"{U0}::0", U0),
        (f"{U0}::17", U0),
        (f"{MIG}::2", MIG),
        ("nvidia0", "nvidia0"),
    ],
)
def test_device_uuid_strips_the_replica_suffix(device_id: str, uuid: str) -> None:
    assert device_uuid(device_id) == uuid


def _groups(depth: int) -> bytes:
    return b"\x0b" * depth + b"\x0c" * depth  # field 1, start group / end group


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\x0a\x05ab", "claims 5 bytes, 2 are left"),
        (b"\x0a", "runs past the end"),
        (b"\x0e", "wire type 6"),
        (b"\x0f", "wire type 7"),
        (b"\x08" + b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
        (b"\x00", "field number 0"),
        (b"\x0c", "never opened"),
        (b"\x0b", "not closed"),
        (b"\x0b\x14", "closed as 2"),
        (b"\x09\x00\x00", "fixed-width field 1 runs past the end"),
        (b"\x0a\x04\x0a\x02\xff\xfe", "PodResources.name: not UTF-8"),
        (_groups(150), "nested deeper than 100"),
    ],
)
def test_bad_bytes_raise_a_decode_error_naming_the_problem(data: bytes, words: str) -> None:
    with pytest.raises(DecodeError, match=words):
        decode_list_response(data)
    # protobuf agrees these are not a ListPodResourcesResponse.
    with pytest.raises(ProtobufDecodeError):
        PB["ListPodResourcesResponse"].FromString(data)


def test_groups_nested_as_deep_as_protobuf_allows_are_skipped() -> None:
    assert decode_list_response(_groups(99)) == ()


def test_every_truncation_of_a_real_answer_decodes_or_raises_decode_error() -> None:
    data = serialize(_filled())
    for end in range(len(data)):
        try:
            decode_list_response(data[:end])
        except DecodeError:
            continue


def _agrees_with_protobuf(data: bytes) -> None:
    """Ours raises only DecodeError; wherever protobuf reads the bytes, ours reads the same."""
    try:
        ours: tuple[PodResources, ...] | None = decode_list_response(data)
    except DecodeError:
        ours = None
    try:
        theirs = PB["ListPodResourcesResponse"].FromString(data)
    except ProtobufDecodeError:
        return
    assert ours == _expected(theirs)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=80))
def test_random_bytes_decode_like_protobuf_or_raise_decode_error(data: bytes) -> None:
    _agrees_with_protobuf(data)


_REAL = serialize(_filled())


@settings(max_examples=300, deadline=None)
@given(
    position=st.integers(0, len(_REAL) - 1),
    byte=st.integers(0, 255),
    cut=st.integers(0, len(_REAL)),
)
def test_damaged_real_answers_decode_like_protobuf_or_raise_decode_error(
    position: int, byte: int, cut: int
) -> None:
    damaged = bytearray(_REAL)
    damaged[position] = byte
    _agrees_with_protobuf(bytes(damaged[:cut] + damaged[cut + 1 :]))


# --- the kubelet's pod list, and which pods hold GPUs given their phases


def test_a_pod_list_gives_each_pods_namespace_name_and_phase() -> None:
    listed = pod_list([("ml", "train-0", "Running"), ("ml", "eval", None), ("ml", "x", "Failed")])
    assert decode_pod_list(listed) == (
        PodPhase("ml", "train-0", "Running"),
        PodPhase("ml", "eval", ""),
        PodPhase("ml", "x", "Failed"),
    )


def test_an_empty_pod_list_is_no_pods_even_as_go_writes_it() -> None:
    assert decode_pod_list(b'{"kind":"PodList","apiVersion":"v1","metadata":{},"items":null}') == ()
    assert decode_pod_list(b'{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[]}') == ()


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"<html>", "not JSON"),
        (b"\xff\xfe\x00", "not JSON"),
        (b"[]", "the answer is list, not an object"),
        (b'{"kind": "Status", "message": "forbidden"}', "a 'Status', not a PodList"),
        (b'{"items": {}}', "items is dict, not a list"),
        (b'{"items": [7]}', r"items\[0\] is int"),
        (b'{"items": [{"status": {}}]}', r"items\[0\]\.metadata is NoneType"),
        (b'{"items": [{"metadata": {"name": "a"}}]}', r"metadata\.namespace is NoneType"),
        (
            b'{"items": [{"metadata": {"name": "a", "namespace": "b"}, "status": {"phase": 1}}]}',
            r"status\.phase is int, not a string",
        ),
    ],
)
def test_what_is_no_pod_list_raises_a_decode_error_naming_it(data: bytes, words: str) -> None:
    with pytest.raises(DecodeError, match=words):
        decode_pod_list(data)


LISTED = PodPhases.of(
    [
        PodPhase("ml", "serve", "Running"),
        PodPhase("ml", "starting", "Pending"),
        PodPhase("ml", "lost", "Unknown"),
        PodPhase("ml", "fresh", ""),
        PodPhase("ml", "done", "Succeeded"),
        PodPhase("ml", "crashed", "Failed"),
        # A name taken again (a StatefulSet's pod recreated) next to its finished predecessor.
        PodPhase("ml", "train-0", "Failed"),
        PodPhase("ml", "train-0", "Pending"),
        PodPhase("ml", "retried", "Failed"),
        PodPhase("ml", "retried", "Succeeded"),
    ]
)


@pytest.mark.parametrize(
    ("name", "verdict"),
    [
        ("serve", (False, "phase Running")),
        ("starting", (False, "phase Pending")),
        ("lost", (False, "phase Unknown")),
        ("fresh", (False, "phase not set yet")),
        ("done", (True, "Succeeded")),
        ("crashed", (True, "Failed")),
        ("train-0", (False, "phase Pending")),
        ("retried", (True, "Failed/Succeeded")),
        ("absent", (False, "phase unknown, so taken as running: not in the kubelet's pod list")),
    ],
)
def test_only_a_pod_listed_as_succeeded_or_failed_has_finished(
    name: str, verdict: tuple[bool, str]
) -> None:
    assert LISTED.judge("ml", name) == verdict


def test_phases_that_could_not_be_read_finish_no_pod() -> None:
    unread = PodPhases.unread("https://10.0.0.5:10250/pods: no answer within 2 s")
    assert unread.judge("ml", "done") == (
        False,
        "phase unknown, so taken as running: https://10.0.0.5:10250/pods: no answer within 2 s",
    )


def _holding(name: str, *ids: str, resource: str = "nvidia.com/gpu") -> PodResources:
    return PodResources(
        name, "ml", (ContainerResources("c", (ContainerDevices(resource, tuple(ids)),)),)
    )


def test_a_finished_pods_gpus_are_free_and_a_live_pods_say_their_phase() -> None:
    pods = [
        _holding("done", U0),
        _holding("serve", U1),
        _holding("crashed", MIG, resource="nvidia.com/mig-1g.5gb"),
        _holding("done", "nvidia0"),
    ]
    found = gpu_allocations(pods, None, LISTED)
    assert set(found.gpus) == {U1.lower()}
    assert str(found.gpus[U1.lower()]) == "pod ml/serve container c (nvidia.com/gpu), phase Running"
    assert found.mig == () and found.unmapped == ()
    assert found.finished == ("ml/done (Succeeded)", "ml/crashed (Failed)", "ml/done (Succeeded)")
    assert found  # a pod holds a GPU
    assert not gpu_allocations(pods[:1], None, LISTED)


def test_a_time_sliced_gpu_passes_from_a_finished_pod_to_the_next_live_one() -> None:
    pods = [_holding("done", f"{U2}::0"), _holding("starting", f"{U2}::1")]
    found = gpu_allocations(pods, None, LISTED)
    assert found.gpus[U2.lower()].pod == "starting"
    assert found.gpus[U2.lower()].device_id == f"{U2}::1"


def test_without_phases_every_listed_pod_holds_what_it_was_given() -> None:
    found = gpu_allocations([_holding("done", U0)])
    assert str(found.gpus[U0.lower()]) == "pod ml/done container c (nvidia.com/gpu)"
    assert found.finished == ()


def test_netmons_own_pod_is_left_out_whatever_its_phase() -> None:
    phases = PodPhases.of([PodPhase("ml", "netmon-x7k2p", "Succeeded")])
    found = gpu_allocations([_holding("netmon-x7k2p", U0)], ("ml", "netmon-x7k2p"), phases)
    assert not found and found.finished == ()


def _claimed(devices: list[tuple[str, str, list[str]]]) -> Any:
    """One pod whose container holds DRA devices: [(driver, device name, CDI names)]."""
    message = response([("ml", "dra", [("main", [])])])
    container = message.pod_resources[0].containers[0]
    claim = container.dynamic_resources.add(claim_name="gpus", claim_namespace="ml")
    for driver, device, cdi in devices:
        resource = claim.claim_resources.add(driver_name=driver, device_name=device)
        for name in cdi:
            resource.cdi_devices.add(name=name)
    return message


def test_nvidias_dra_devices_are_held_by_minor_number_and_others_are_not_gpus() -> None:
    uid = "0b1c2d3e-aaaa-4bbb-8ccc-123456789abc"
    message = _claimed(
        [
            ("gpu.nvidia.com", "gpu-3", [f"k8s.gpu.nvidia.com/claim={uid}-gpu-3"]),
            ("gpu.nvidia.com", "gpu-4-mig-1g10gb-19-0", []),
            ("", "", [f"k8s.gpu.nvidia.com/claim={uid}-gpu-6"]),  # a kubelet before 1.31
            ("gpu.nvidia.com", "gpu-vfio-1", []),  # a VFIO passthrough: which GPU is not said
            ("compute-domain.nvidia.com", "channel-0", []),  # an IMEX channel: no GPU
            ("gpu.example.com", "gpu-0", ["example.com/gpu=gpu-0"]),  # another vendor's
        ]
    )
    held = gpu_allocations(decode_list_response(serialize(message)))
    assert sorted(held.minors) == [3, 4, 6]
    assert str(held.minors[3]) == "pod ml/dra container main (DRA gpu.nvidia.com gpu-3)"
    assert [a.device_id for a in held.unmapped] == ["gpu-vfio-1"]
    assert held.gpus == {} and held.mig == ()


@pytest.mark.parametrize(
    ("device", "minor"),
    [
        (DraDevice("ml/c", "gpu.nvidia.com", "gpu-0"), 0),
        (DraDevice("ml/c", "gpu.nvidia.com", "gpu-12-mig-3g40gb-9-4"), 12),
        (DraDevice("ml/c", "", "", ("k8s.gpu.nvidia.com/claim=u-1-gpu-7",)), 7),
        (DraDevice("ml/c", "gpu.nvidia.com", "gpu-vfio-2"), None),
        (DraDevice("ml/c", "gpu.nvidia.com", "mygpu-x"), None),
    ],
)
def test_the_minor_is_read_from_nvidias_names(device: DraDevice, minor: int | None) -> None:
    assert nvidia_gpu(device)
    assert dra_minor(device) == minor


def test_a_gpu_without_a_minor_number_is_held_when_dra_holds_any() -> None:
    from netmon.gpu.idle import GpuReading, with_allocations

    held = gpu_allocations(
        decode_list_response(serialize(_claimed([("gpu.nvidia.com", "gpu-1", [])])))
    )
    readings = [
        GpuReading(index=0, uuid="GPU-a", utilization=0, memory_used=0, compute_pids=(), minor=0),
        GpuReading(index=1, uuid="GPU-b", utilization=0, memory_used=0, compute_pids=(), minor=1),
        GpuReading(index=2, uuid="GPU-c", utilization=0, memory_used=0, compute_pids=()),
    ]
    marked = {r.index: r.allocated_to for r in with_allocations(readings, held)}
    assert marked[0] is None
    assert marked[1] == "pod ml/dra container main (DRA gpu.nvidia.com gpu-1)"
    assert marked[2] is not None and "NVML gives this GPU no minor number" in marked[2]
