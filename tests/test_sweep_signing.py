"""Sweep reports no node can forge: the sweep host signs each node's report with its Ed25519 key;
a daemon with `sweep.verify_key_file` holds only the public key and takes nothing else
(netmon.sweep.delivery.signing)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from netmon.errors import UsageError
from netmon.serve.sweep_inbox import node_names
from netmon.sweep.delivery import signing
from netmon.sweep.delivery.deliver import deliver
from netmon.sweep.delivery.inbox import BadSeal, Malformed, accept
from netmon.sweep.delivery.node_report import SEAL_GROUP, NodeReport, seal_key
from tests.daemon_harness import DaemonProcess, fast_config, secret_file, series
from tests.test_sweep_inbox import NAMES, NOW, SECRET, SECRET_TEXT, post, report, seal


def _key_files(directory: Path, name: str = "sweep") -> tuple[Path, Path]:
    """A key pair as `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` write it."""
    directory.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    private = directory / f"{name}.key"
    private.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    private.chmod(0o600)
    public = directory / f"{name}.pub"
    public.write_bytes(
        key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


def _signed(signer: signing.Signer, body: NodeReport, key: str | None = None) -> str:
    document = body.model_dump(mode="json")
    return signer.seal(seal_key(key or body.node), document)


def test_a_report_the_sweep_host_signed_is_taken_and_nothing_else(tmp_path: Path) -> None:
    private, public = _key_files(tmp_path / "host")
    signer = signing.load_signer(SEAL_GROUP, private)
    verifier = signing.load_verifier(SEAL_GROUP, public)
    sent = report()
    assert accept(_signed(signer, sent), verifier, NAMES, NOW + 1, None) == sent
    # Forged on a node: with a key of its own, or with the shared secret every node holds.
    other, _ = _key_files(tmp_path / "node")
    forged = _signed(signing.load_signer(SEAL_GROUP, other), report())
    with pytest.raises(BadSeal, match="bad signature"):
        accept(forged, verifier, NAMES, NOW, None)
    with pytest.raises(BadSeal, match="not signed by the sweep host"):
        accept(seal(report()), verifier, NAMES, NOW, None)
    # Tampered with, or a signature for another node's report put on this one.
    signature, _, payload = _signed(signer, sent).partition(".")
    tampered = f"{signature}.{payload.replace('20000000000.0', '90000000000.0', 1)}"
    with pytest.raises(BadSeal, match="bad signature"):
        accept(tampered, verifier, NAMES, NOW, None)
    elsewhere = _signed(signer, sent, key="n2")
    with pytest.raises(BadSeal, match="bad signature"):
        accept(elsewhere, verifier, NAMES, NOW, None)
    # A daemon with only the shared secret says what it lacks.
    with pytest.raises(BadSeal, match=r"no sweep\.verify_key_file"):
        accept(_signed(signer, sent), SECRET, NAMES, NOW, None)
    with pytest.raises(Malformed):
        accept("ab" * 40 + ".{}", verifier, NAMES, NOW, None)


def test_a_key_that_is_not_an_ed25519_key_is_named_with_the_fix(tmp_path: Path) -> None:
    private, public = _key_files(tmp_path)
    with pytest.raises(UsageError, match=r"^sweep.signing_key_file: .* not an unencrypted PEM"):
        signing.load_signer(SEAL_GROUP, public)
    with pytest.raises(UsageError, match=r"^sweep.verify_key_file: .* not a PEM public key"):
        signing.load_verifier(SEAL_GROUP, private)
    with pytest.raises(UsageError, match=r"^sweep.verify_key_file: .*No such file"):
        signing.load_verifier(SEAL_GROUP, tmp_path / "missing.pub")


@pytest.fixture
def daemons() -> Iterator[list[DaemonProcess]]:
    started: list[DaemonProcess] = []
    yield started
    for daemon in started:
        daemon.stop()


def test_a_daemon_with_the_public_key_refuses_what_a_node_could_forge(
    tmp_path: Path, daemons: list[DaemonProcess]
) -> None:
    """The daemon holds the sweep host's public key and, as every node did, the shared secret:
    a report sealed with that secret (all a node's root could make) is refused, the host's
    signed one is exported."""
    private, public = _key_files(tmp_path / "host")
    secret = secret_file(tmp_path / "secrets", SECRET_TEXT, "sweep.secret")
    sweep = {"verify_key_file": str(public), "secret_file": secret}
    daemon = DaemonProcess(tmp_path, fast_config(tmp_path, probes=[], sweep=sweep))
    daemons.append(daemon)
    me = node_names()[0]
    forged = report(node=me, at=time.time(), suspect=True)
    code, answer = post(daemon.port, seal(forged).encode())
    assert code == 403 and "not signed by the sweep host" in answer
    signer = signing.load_signer(SEAL_GROUP, private)
    sent = report(node=me, at=time.time(), suspect=True)
    assert deliver([sent], {me: "127.0.0.1"}, signer, port=daemon.port) == {me: "ok"}
    counted = series(daemon.scrape(), "netmon_sweep_reports_total")
    assert {dict(labels)["outcome"]: value for labels, value in counted.items()} == {
        "accepted": 1.0,
        "malformed": 0.0,
        "refused": 1.0,
    }
    assert series(daemon.scrape(), "netmon_sweep_suspect") == {frozenset({("peer", "")}): 1.0}
