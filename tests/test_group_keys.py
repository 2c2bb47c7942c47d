"""Per-member keys: a pair's result is taken only when its own member signed it, and the group's
key files are read again on SIGHUP by what they hold (a rotation in place).

The signatures are checked pure, with keys made here; the refusal on a real store agent; the
rotation on a coordinator that is never started, and through SIGHUP on a real daemon.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from netmon.config import NetmonConfig
from netmon.errors import UsageError
from netmon.group import store
from netmon.group.auth import AuthError, Sealer
from netmon.group.keys import load_keys
from netmon.group.link import GroupLink, RejectedMessage, SealedLink
from netmon.group.members import GroupConfig
from netmon.group.signing import MemberSigner, MemberVerifier, SignatureError, load_member_keys
from tests.daemon_harness import DaemonProcess, fast_config, secret_file, wait_until
from tests.group_harness import SECRET, store_agent
from tests.prometheus_harness import free_port
from tests.test_group_plan import A, B, FabricReads, coordinator

KEY = "netmon/7/result/1"


def private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_pem(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


KEYS = {m: Ed25519PrivateKey.generate() for m in ("a", "b", "c")}
VERIFIER = MemberVerifier("rack-a", {m: (k.public_key(),) for m, k in KEYS.items()})


def signed(member: str, body: dict[str, Any], key: str = KEY) -> str:
    return MemberSigner("rack-a", KEYS[member]).seal(key, body)


# ---- signatures, pure ----


def test_a_result_opens_only_under_the_key_of_the_member_it_is_from() -> None:
    assert VERIFIER.open("b", KEY, signed("b", {"busbw": 1e9})) == {"busbw": 1e9}
    cases = {
        "wrong_member": signed("c", {"busbw": 1e15}),  # c forging b's result with its own key
        "unsigned": Sealer("rack-a", SECRET).seal(KEY, {"busbw": 1e15}),  # shared-secret seal
        "bad_signature": signed("b", {"busbw": 1e9}).replace("1000000000", "1000000000000000"),
    }
    for reason, value in cases.items():
        with pytest.raises(SignatureError) as refused:
            VERIFIER.open("b", KEY, value)
        assert refused.value.reason == reason
    with pytest.raises(SignatureError, match="bad signature"):  # moved to another key
        VERIFIER.open("b", "netmon/8/result/1", signed("b", {"busbw": 1e9}))


def test_per_member_keys_need_a_signing_key_and_every_members_public_key() -> None:
    base = {"name": "g", "members": [A, B], "secret_file": "/s"}
    with pytest.raises(ValueError, match="none for " + B):
        GroupConfig.model_validate({**base, "signing_key_file": "/k", "verify_keys": {A: "/a"}})
    with pytest.raises(ValueError, match="signing_key_file"):
        GroupConfig.model_validate({**base, "verify_keys": {A: "/a", B: "/b"}})
    with pytest.raises(ValueError, match="not members"):
        GroupConfig.model_validate({**base, "verify_keys": {"x:1": "/x"}})
    both = GroupConfig.model_validate(
        {**base, "signing_key_file": "/k", "verify_keys": {A: "/a", B: ["/b1", "/b2"]}}
    )
    assert both.verify_keys == {A: (Path("/a"),), B: (Path("/b1"), Path("/b2"))}


# ---- a forged result on a real store agent ----


@pytest.fixture
def agent() -> Iterator[GroupLink]:
    with store_agent() as link:
        yield link


def test_the_leader_refuses_a_result_another_member_signed_and_counts_why(
    agent: GroupLink,
) -> None:
    assert agent.me is not None
    refused: list[tuple[Any, ...]] = []
    sealer = Sealer("rack-a", SECRET)
    leader = SealedLink(agent, sealer, lambda *why: refused.append(why), verifier=VERIFIER)
    # Root on c holds the group secret (it reaches the store) and its own key, not b's.
    forger = SealedLink(agent, sealer, print, signer=MemberSigner("rack-a", KEYS["c"]))
    forger.put_result(agent.me, KEY, {"busbw": 1e15})
    with pytest.raises(RejectedMessage):
        leader.take_result(agent.me, KEY, 2.0, sender="b")
    assert [(who, reason) for who, _, reason in refused] == [("b", "wrong_member")]
    genuine = SealedLink(agent, sealer, print, signer=MemberSigner("rack-a", KEYS["b"]))
    genuine.put_result(agent.me, KEY, {"busbw": 2e9})
    assert leader.take_result(agent.me, KEY, 2.0, sender="b") == {"busbw": 2e9}
    assert len(refused) == 1


# ---- rotation in place ----


def test_a_verify_key_rotated_in_place_takes_effect_and_the_old_one_only_while_listed(
    tmp_path: Path,
) -> None:
    old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    (tmp_path / "a.key").write_bytes(private_pem(KEYS["a"]))
    (tmp_path / "a.pub").write_bytes(public_pem(KEYS["a"]))
    b_pub = tmp_path / "b.pub"
    b_pub.write_bytes(public_pem(old))
    config = NetmonConfig.model_validate(
        {
            "backend": "gloo",
            "ranks": 1,
            "state_dir": str(tmp_path / "state"),
            "probes": [{"name": "peers", "scope": "node_pairs", "sizes": ["1M"]}],
            "group": {
                "name": "g",
                "members": [A, B],
                "self": A,
                "secret_file": secret_file(tmp_path),
                "signing_key_file": str(tmp_path / "a.key"),
                "verify_keys": {A: str(tmp_path / "a.pub"), B: str(b_pub)},
            },
        }
    )
    assert config.group is not None
    member = coordinator(config, FabricReads(()), tmp_path / "absent", load_keys(config.group))

    def verifies(key: Ed25519PrivateKey) -> bool:
        verifier = member.link.verifier
        assert verifier is not None
        value = MemberSigner("g", key).seal(KEY, {"busbw": 1.0})
        try:
            verifier.open(B, KEY, value)
        except SignatureError:
            return False
        return True

    assert verifies(old) and not verifies(new)
    assert member.rekey() is False  # nothing changed: nothing read again
    b_pub.write_bytes(public_pem(old) + public_pem(new))  # the overlap: both listed
    assert member.rekey() is True
    assert verifies(old) and verifies(new)
    b_pub.write_bytes(public_pem(new))  # the old one retired
    assert member.rekey() is True
    assert verifies(new) and not verifies(old)
    b_pub.write_bytes(b"not a key")  # a broken file is refused; the running keys stay
    with pytest.raises(UsageError, match=r"group\.verify_keys"):
        member.rekey()
    assert verifies(new)


def test_sighup_takes_a_group_secret_replaced_in_place(tmp_path: Path) -> None:
    me = f"127.0.0.1:{free_port()}"
    path = Path(secret_file(tmp_path, "the first secret, 32 bytes long.."))
    config = fast_config(
        tmp_path,
        ranks=1,
        probes=[{"name": "local", "sizes": [8], "interval": "1h", "iters": 1}],
        group={"name": "test", "members": [me], "self": me, "secret_file": str(path)},
    )
    daemon = DaemonProcess(tmp_path, config, name="rotating")
    try:
        port = int(me.rpartition(":")[2])
        first, second = b"the first secret, 32 bytes long..", b"the second secret, 32 bytes long."

        def admits(secret: bytes) -> bool:
            try:
                store.run("127.0.0.1", port, secret, "count", "", 10.0)
            except (store.StoreError, OSError):
                return False
            return True

        wait_until(lambda: admits(first), 60, "the member's store to admit the first secret")
        assert not admits(second)
        path.write_bytes(second + b"\n")  # same path, new contents
        daemon.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: admits(second), 30, "the store to admit the rotated secret")
        assert not admits(first)
        assert "group keys reloaded" in daemon.log()
    finally:
        daemon.stop()


def test_check_config_names_a_member_key_that_is_not_ed25519(tmp_path: Path) -> None:
    me = f"127.0.0.1:{free_port()}"
    (tmp_path / "a.pub").write_bytes(public_pem(KEYS["a"]))
    (tmp_path / "a.key").write_text("not a key\n")
    config = fast_config(
        tmp_path,
        group={
            "name": "test",
            "members": [me],
            "self": me,
            "secret_file": secret_file(tmp_path),
            "signing_key_file": str(tmp_path / "a.key"),
            "verify_keys": {me: str(tmp_path / "a.pub")},
        },
    )
    path = tmp_path / "netmon.yaml"
    path.write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "-m", "netmon", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "group.signing_key_file:" in done.stderr and "PEM private key" in done.stderr


def test_load_member_keys_takes_every_key_of_a_concatenated_file(tmp_path: Path) -> None:
    both = tmp_path / "b.pub"
    both.write_bytes(public_pem(KEYS["b"]) + public_pem(KEYS["c"]))
    _, verifier = load_member_keys("rack-a", None, {"b": [both]})
    assert verifier is not None and len(verifier.keys["b"]) == 2


# ---- a forged pair result in a real group of three daemons ----


def test_a_group_leader_refuses_a_pair_result_forged_by_another_member(tmp_path: Path) -> None:
    """Root on member c holds the group secret and c's key; it writes the result of the pair
    b-c into the leader's store before b does, signed with its own key. The leader refuses it
    and counts it against b; once c stops, b's own result is taken."""
    from tests.test_group import NODE_PAIRS
    from tests.test_group import member_config as group_member

    a, b, c = sorted(f"127.0.0.1:{free_port()}" for _ in range(3))
    keys = {m: Ed25519PrivateKey.generate() for m in (a, b, c)}
    for member, key in keys.items():
        name = member.rpartition(":")[2]
        (tmp_path / f"{name}.key").write_bytes(private_pem(key))
        (tmp_path / f"{name}.pub").write_bytes(public_pem(key))
    daemons: list[DaemonProcess] = []
    stop = threading.Event()
    try:
        for member in (a, b, c):
            config = group_member(tmp_path, [a, b, c], member)
            config["probes"] = [{**NODE_PAIRS, "interval": "2s"}]
            config["group"]["signing_key_file"] = str(tmp_path / f"{member.rpartition(':')[2]}.key")
            config["group"]["verify_keys"] = {
                m: str(tmp_path / f"{m.rpartition(':')[2]}.pub") for m in (a, b, c)
            }
            daemons.append(DaemonProcess(tmp_path, config, name=f"k{len(daemons)}"))
        leader = daemons[0]
        forger = threading.Thread(target=forge, args=(a, keys[c], stop), daemon=True)
        forger.start()
        wait_until(
            lambda: (
                (
                    leader.value(
                        "netmon_group_results_refused_total",
                        group="test",
                        member=b,
                        reason="wrong_member",
                    )
                    or 0
                )
                >= 1
            ),
            120,
            "the leader to refuse the result c signed for the pair b-c",
        )
        assert "signed by another member" in leader.log()
        stop.set()
        forger.join(10)
        seen = len(leader.log())

        def all_three_judged() -> bool:
            lines = leader.log()[seen:].splitlines()
            return any("node pairs judged" in line and " pairs=3 " in line for line in lines)

        wait_until(all_three_judged, 120, "a sweep with all three pairs, b's own result taken")
        for reason in ("unsigned", "bad_signature"):
            refused = leader.value(
                "netmon_group_results_refused_total", group="test", member=b, reason=reason
            )
            assert refused == 0.0
    finally:
        stop.set()
        for daemon in daemons:
            daemon.kill_all()


def forge(leader: str, key: Ed25519PrivateKey, stop: threading.Event) -> None:
    """Every new round in the leader's store gets results signed with `key`, at once."""
    from tests.daemon_harness import GROUP_SECRET

    secret = GROUP_SECRET.encode()
    port = int(leader.rpartition(":")[2])
    sealer, signer = Sealer("test", secret), MemberSigner("test", key)
    forged: set[int] = set()
    while not stop.wait(0.02):
        try:
            value = store.run("127.0.0.1", port, secret, "get", "netmon/current", 1.0)
            epoch = int(sealer.open("netmon/current", str(value))["epoch"])
            if epoch in forged:
                continue
            forged.add(epoch)
            for index in range(2):
                name = f"netmon/{epoch}/result/{index}"
                forgery = signer.seal(name, {"busbw": 1e15})
                store.run("127.0.0.1", port, secret, "set", name, 5.0, value=forgery)
        except (store.StoreError, OSError, ValueError, KeyError):
            continue


def test_a_sweep_verify_key_file_may_hold_the_old_and_the_new_key(tmp_path: Path) -> None:
    from netmon.sweep.delivery.signing import Signer, load_verifier

    old, new, stranger = (Ed25519PrivateKey.generate() for _ in range(3))
    both = tmp_path / "sweep.pub"
    both.write_bytes(public_pem(old) + public_pem(new))
    verifier = load_verifier("sweep", both)
    for key in (old, new):
        assert verifier.open("node-a", Signer("sweep", key).seal("node-a", {"n": 1})) == {"n": 1}
    with pytest.raises(AuthError, match="bad signature"):
        verifier.open("node-a", Signer("sweep", stranger).seal("node-a", {"n": 1}))
