"""Sweep reports signed per node by default in the Helm chart: the sweep's pod alone mounts the
Ed25519 private key, every daemon the public key alone, so root on one node (which can read what
its node's pods mount) cannot forge another node's verdict. The shared secret, which every node
holds, only when the site asks for it. Rendered offline by Helm's Go SDK (tests/test_helm.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from netmon.config import parse_config
from netmon.group.auth import AuthError
from netmon.sweep.delivery import signing
from tests.test_helm import SWEEP, netmon_yaml, one, render

GROUP = "sweep"


def _values(**sweep: Any) -> dict[str, Any]:
    values = copy.deepcopy(SWEEP)
    values["sweep"] |= sweep
    return values


def _pods(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    cron = one(objects, "CronJob", "netmon-sweep")["spec"]["jobTemplate"]["spec"]["template"]
    return cron["spec"], one(objects, "DaemonSet")["spec"]["template"]["spec"]


def _secrets(pod: dict[str, Any]) -> set[str]:
    return {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}


def pod_files(
    pod: dict[str, Any], secrets: dict[str, dict[str, bytes]], root: Path
) -> Callable[[Path], Path]:
    """The pod's Secret volumes written under `root` as the kubelet would mount them (each
    Secret's keys as files in its mount's directory); returns where a path in the pod is."""
    volumes = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounts: dict[str, Path] = {}
    for mount in (m for c in pod["containers"] for m in c["volumeMounts"]):
        if mount["name"] in volumes:
            directory = root / mount["mountPath"].lstrip("/")
            directory.mkdir(parents=True)
            for name, data in secrets.get(volumes[mount["name"]], {}).items():
                (directory / name).write_bytes(data)
            mounts[mount["mountPath"]] = directory

    def where(path: Path) -> Path:
        directory = mounts[str(path.parent)]  # KeyError: no Secret mounted there
        return directory / path.name

    return where


def test_by_default_the_sweep_signs_and_the_daemons_hold_only_the_public_key(
    tmp_path: Path,
) -> None:
    objects = render(SWEEP)
    sweep_pod, daemon_pod = _pods(objects)
    # Two Secrets, and the private key's is in no daemon's pod: a node's kubelet may read
    # every Secret its node's pods mount.
    assert _secrets(sweep_pod) == {"netmon-sweep-signing"}
    assert "netmon-sweep-signing" not in _secrets(daemon_pod)
    assert "netmon-sweep-verify" in _secrets(daemon_pod)
    assert "netmon-sweep" not in _secrets(daemon_pod) | _secrets(sweep_pod)
    # The configs name the files where the pods find them, and they make a working pair: what
    # the sweep signs the daemon opens, and a shared-secret seal it refuses.
    sweep = parse_config(
        yaml.safe_load(one(objects, "ConfigMap", "netmon-sweep")["data"]["netmon.yaml"])
    ).sweep
    daemon = parse_config(netmon_yaml(objects)).sweep
    assert sweep is not None and daemon is not None
    assert sweep.secret_file is None and daemon.secret_file is None
    assert sweep.signing_key_file is not None and daemon.verify_key_file is not None
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    data = {
        "netmon-sweep-signing": {"ed25519.key": private},
        "netmon-sweep-verify": {"ed25519.pub": public},
    }
    signed_at = pod_files(sweep_pod, data, tmp_path / "sweep")
    verified_at = pod_files(daemon_pod, data, tmp_path / "daemon")
    signer = signing.load_signer(GROUP, signed_at(sweep.signing_key_file))
    verifier = signing.load_verifier(GROUP, verified_at(daemon.verify_key_file))
    report = {"node": "gpu-a1", "verdict": "ok"}
    assert verifier.open("node/gpu-a1", signer.seal("node/gpu-a1", report))["verdict"] == "ok"
    forged = signing.shared(GROUP, b"0123456789abcdef0123").seal("node/gpu-a1", report)
    with pytest.raises(AuthError, match="not signed by the sweep host"):
        verifier.open("node/gpu-a1", forged)


def test_the_shared_secret_only_when_asked_for() -> None:
    objects = render(_values(sharedSecret=True))
    sweep_pod, daemon_pod = _pods(objects)
    assert _secrets(sweep_pod) == {"netmon-sweep"} and "netmon-sweep" in _secrets(daemon_pod)
    assert netmon_yaml(objects)["sweep"] == {"secret_file": "/var/run/secrets/netmon-sweep/secret"}


@pytest.mark.parametrize(
    ("signing_values", "message"),
    [
        ({"keySecretName": ""}, r"sweep\.signing: set keySecretName and verifySecretName"),
        ({"verifySecretName": ""}, r"sweep\.signing: set keySecretName and verifySecretName"),
        (
            {"keySecretName": "one", "verifySecretName": "one"},
            r"sweep\.signing: keySecretName and verifySecretName are both one: put the private "
            r"key in a Secret of its own",
        ),
    ],
    ids=["no-key", "no-verify-key", "one-secret"],
)
def test_sweeps_without_two_signing_secrets_fail_in_one_line(
    signing_values: dict[str, str], message: str
) -> None:
    signing_default = {"keySecretName": "netmon-sweep-signing"}
    signing_default |= {"verifySecretName": "netmon-sweep-verify"}
    values = _values(signing=signing_default | signing_values)
    with pytest.raises(helm.HelmRenderError, match=message) as caught:
        render(values)
    assert "\n" not in str(caught.value).strip()
    # The site's explicit choice of the shared secret renders without them.
    render(_values(signing=signing_default | signing_values, sharedSecret=True))


def _schedulable(affinity: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """Kubernetes' reading of a required node affinity: any term whose expressions all hold
    (NotIn holds for a node without the label)."""
    if not affinity:
        return True
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in terms["nodeSelectorTerms"]:
        held = []
        for expression in term["matchExpressions"]:
            assert expression["operator"] == "NotIn"
            held.append(labels.get(expression["key"]) not in expression["values"])
        if all(held):
            return True
    return False


def test_the_sweep_pod_runs_off_the_nodes_it_sweeps() -> None:
    """Root on a swept node could read the signing key and the sweep's token from a pod on its
    node: by default the sweep's pod goes only where sweep.nodeSelector does not select."""
    gpu = {"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": "gpu-a1"}
    cpu = {"kubernetes.io/hostname": "cpu-1"}
    affinity = _pods(render(SWEEP))[0].get("affinity")
    assert not _schedulable(affinity, gpu) and _schedulable(affinity, cpu)
    # Two labels: a node needs to differ in one of them only.
    pair = {"nvidia.com/gpu.present": "true", "rack": "a"}
    affinity = _pods(render(_values(nodeSelector=pair)))[0].get("affinity")
    assert not _schedulable(affinity, pair)
    assert _schedulable(affinity, {**pair, "rack": "b"}) and _schedulable(affinity, cpu)
    assert "affinity" not in _pods(render(_values(avoidSweptNodes=False)))[0]
