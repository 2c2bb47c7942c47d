"""The chart's DaemonSet on a real site's cluster: the GPU node selector a site can replace (a
cluster without GPU feature discovery), and NOTES that say what the pods are given and where
to install them. Rendered offline by Helm's Go SDK through tests/test_helm_values.py."""

from __future__ import annotations

from tests.test_helm_inspector import ON
from tests.test_helm_values import check_objects, pod_spec, render


def test_the_gpu_node_selector_can_be_replaced_not_only_merged() -> None:
    default = pod_spec(render({})[0])["nodeSelector"]
    assert default == {"nvidia.com/gpu.present": "true"}
    merged = pod_spec(render({"nodeSelector": {"role": "gpu"}})[0])["nodeSelector"]
    assert merged == {"nvidia.com/gpu.present": "true", "role": "gpu"}
    # A cluster without GPU feature discovery: its own label only (null: Helm merges a map
    # given in values into the default, so {} would keep the default's key).
    values = {"nodeSelector": {"role": "gpu"}, "gpuNodeSelector": None}
    objects, _ = render(values)
    check_objects(objects)
    assert pod_spec(objects)["nodeSelector"] == {"role": "gpu"}
    replaced = {"gpuNodeSelector": {"nvidia.com/gpu.present": None, "node-role/gpu": "yes"}}
    assert pod_spec(render(replaced)[0])["nodeSelector"] == {"node-role/gpu": "yes"}


def test_the_notes_say_root_and_hostpid_and_recommend_a_namespace_of_its_own() -> None:
    _, notes = render({})
    text = " ".join(notes.split())
    assert "hostPID" in text and "run as root, every capability dropped" in text
    assert (
        "a namespace of its own" in text and "pod-security.kubernetes.io/enforce=privileged" in text
    )
    _, as_user = render({"kubeletGuard": {"runAsRoot": False}})
    assert "run as root" not in " ".join(as_user.split())
    _, reading = render(ON)
    assert "DAC_READ_SEARCH and DAC_OVERRIDE added" in " ".join(reading.split())
