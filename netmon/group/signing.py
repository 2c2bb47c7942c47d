"""Ed25519 keys that only their owner can sign with: per-member group results, sweep reports.

A shared secret lets every holder seal in every holder's name. An Ed25519 signature verifies only
under its owner's public key, so a node that holds public keys (everyone else's) can check who
wrote a message but cannot write one for them. Keys are PEM files, as
`openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` write them; loading is shared by
the group (group.signing_key_file, group.verify_keys) and the sweep (netmon.sweep.delivery.signing).

A signed value is `<128 hex>.<JSON>`: the signature over the scheme, the seal group, the key the
value is stored under and the JSON, so that it cannot be moved to another key, group or scheme.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netmon.errors import UsageError
from netmon.group.auth import AuthError

# A group member's results; distinct from the sweep's scheme, so that one signature is never
# taken for the other's.
MEMBER_SCHEME = "netmon-v1-ed25519-member"
SIGNATURE_HEX = 128
# Why a result was refused: the reason label of netmon_group_results_refused_total.
REFUSALS = ("unsigned", "wrong_member", "bad_signature")


def message(scheme: str, group: str, key: str, payload: str) -> bytes:
    return "\0".join((scheme, group, key, payload)).encode()


def payload_of(body: dict[str, Any]) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def sign(private: Any, scheme: str, group: str, key: str, body: dict[str, Any]) -> str:
    payload = payload_of(body)
    return f"{private.sign(message(scheme, group, key, payload)).hex()}.{payload}"


def verifies(publics: Sequence[Any], scheme: str, group: str, key: str, value: str) -> bool:
    """Whether `value` is `<signature>.<payload>` signed by one of `publics`."""
    from cryptography.exceptions import InvalidSignature

    signature, dot, payload = value.partition(".")
    if not dot or len(signature) != SIGNATURE_HEX:
        return False
    try:
        raw = bytes.fromhex(signature)
    except ValueError:
        return False
    for public in publics:
        try:
            public.verify(raw, message(scheme, group, key, payload))
            return True
        except InvalidSignature:
            continue
    return False


def body_of(key: str, value: str) -> dict[str, Any]:
    body = json.loads(value.partition(".")[2])
    if not isinstance(body, dict):
        raise AuthError(f"{key}: signed, but not a JSON object")
    return body


@dataclass(frozen=True)
class MemberSigner:
    """This member's: signs the results it reports with its own private key."""

    group: str
    private: Any = field(repr=False)  # cryptography's Ed25519PrivateKey

    def seal(self, key: str, body: dict[str, Any]) -> str:
        return sign(self.private, MEMBER_SCHEME, self.group, key, body)


@dataclass(frozen=True)
class MemberVerifier:
    """The leader's: every member's public keys (more than one while a key is rotated)."""

    group: str
    keys: Mapping[str, tuple[Any, ...]] = field(repr=False)

    def open(self, member: str, key: str, value: str) -> dict[str, Any]:
        """The body of `value` if `member` signed it; AuthError (its `reason` a label) if not."""
        signature = value.partition(".")[0]
        if len(signature) != SIGNATURE_HEX:
            raise SignatureError(
                "unsigned",
                f"{key}: not signed by {member} (a shared-secret seal, or none): results must be "
                "signed with the member's key (group.signing_key_file)",
            )
        if verifies(self.keys.get(member, ()), MEMBER_SCHEME, self.group, key, value):
            return body_of(key, value)
        others = [m for m in self.keys if m != member]
        if any(verifies(self.keys[m], MEMBER_SCHEME, self.group, key, value) for m in others):
            raise SignatureError(
                "wrong_member", f"{key}: signed by another member than {member}, whose result it is"
            )
        raise SignatureError(
            "bad_signature", f"{key}: bad signature (not {member}'s key, or tampered with)"
        )


class SignatureError(AuthError):
    """A value not signed by the member it is from; `reason` says how (a bounded label)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def load_private(path: Path, setting: str) -> Any:
    """The Ed25519 private key in a PEM file; UsageError names the setting and the fix."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(path.read_bytes(), password=None)
    except OSError as exc:
        raise UsageError(f"{setting}: {path}: {exc.strerror or exc}") from None
    except (ValueError, TypeError):
        raise UsageError(f"{setting}: {path} is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UsageError(
            f"{setting}: {path} is not an Ed25519 key (openssl genpkey -algorithm ed25519)"
        )
    return key


def load_public(path: Path, setting: str) -> Any:
    """An Ed25519 public key in a PEM file; UsageError names the setting and the fix."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{setting}: {path}: {exc.strerror or exc}") from None
    return _public(raw, path, setting)


def _public(raw: bytes, path: Path, setting: str) -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        key = load_pem_public_key(raw)
    except (ValueError, TypeError):
        raise UsageError(f"{setting}: {path} is not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise UsageError(
            f"{setting}: {path} is not an Ed25519 public key (openssl pkey -in KEY -pubout)"
        )
    return key


PEM_BEGIN = b"-----BEGIN PUBLIC KEY-----"


def load_publics(path: Path, setting: str) -> tuple[Any, ...]:
    """Every Ed25519 public key in a PEM file: one, or several while a key is rotated (the old
    and the new one concatenated), so the overlap needs no change of configuration."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{setting}: {path}: {exc.strerror or exc}") from None
    blocks = [PEM_BEGIN + part for part in raw.split(PEM_BEGIN)[1:]]
    if not blocks:
        raise UsageError(
            f"{setting}: {path} is not a PEM public key (openssl pkey -in KEY -pubout makes one)"
        )
    return tuple(_public(block, path, setting) for block in blocks)


def load_member_keys(
    group: str, signing_key_file: Path | None, verify_keys: Mapping[str, Sequence[Path]]
) -> tuple[MemberSigner | None, MemberVerifier | None]:
    """This member's signer and the members' verifier, as configured (None: shared secret)."""
    signer = None
    if signing_key_file is not None:
        signer = MemberSigner(group, load_private(signing_key_file, "group.signing_key_file"))
    verifier = None
    if verify_keys:
        keys = {
            member: tuple(
                key for p in paths for key in load_publics(p, f"group.verify_keys.{member}")
            )
            for member, paths in verify_keys.items()
        }
        verifier = MemberVerifier(group, keys)
    return signer, verifier
