"""Reports no node can forge: the sweep host signs each node's report with its Ed25519 key, and
each daemon holds only the public key (docs/SECURITY.md, "Sweep reports").

With the shared secret (`sweep.secret_file`, HMAC-SHA256, netmon.group.auth) every node holds
the key that seals reports, so root on any node can mark any other node suspect, or clear a real
suspect. With `sweep.signing_key_file` on the sweep host and `sweep.verify_key_file` on the
daemons, a report verifies only under the sweep host's public key; a daemon with
`verify_key_file` takes nothing else, a shared-secret seal included.

Both forms are `<hex>.<JSON>`: a 64-hex HMAC, or a 128-hex Ed25519 signature over the scheme,
the seal group, the node's key and the JSON, so that a signature cannot be replayed for another
node. Keys are PEM files, as `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout`
write them; loading them is shared with the group's member keys (netmon.group.signing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from netmon.group.auth import AuthError, Sealer
from netmon.group.signing import load_private, load_publics, verifies

SCHEME = "netmon-v1-ed25519"
SIGNATURE_HEX = 128


class Seals(Protocol):
    def seal(self, key: str, body: dict[str, Any]) -> str: ...


class Opens(Protocol):
    def open(self, key: str, value: str) -> dict[str, Any]: ...


def _message(group: str, key: str, payload: str) -> bytes:
    return "\0".join((SCHEME, group, key, payload)).encode()


def _payload(body: dict[str, Any]) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Signer:
    """The sweep host's: signs each node's report with its private key."""

    group: str
    private: Any = field(repr=False)  # cryptography's Ed25519PrivateKey

    def seal(self, key: str, body: dict[str, Any]) -> str:
        payload = _payload(body)
        return f"{self.private.sign(_message(self.group, key, payload)).hex()}.{payload}"


@dataclass(frozen=True)
class Verifier:
    """A daemon's: opens only what the sweep host's key signed."""

    group: str
    public: Any = field(repr=False)  # cryptography's Ed25519PublicKey
    # More keys of the sweep host while its key is rotated (one verify_key_file holding both).
    also: tuple[Any, ...] = field(default=(), repr=False)

    def open(self, key: str, value: str) -> dict[str, Any]:
        signature, dot, payload = value.partition(".")
        if not dot or len(signature) != SIGNATURE_HEX:
            raise AuthError(
                f"{key}: not signed by the sweep host (a shared-secret seal, or none): this "
                "daemon takes only signed reports (sweep.verify_key_file)"
            )
        if not verifies((self.public, *self.also), SCHEME, self.group, key, value):
            raise AuthError(
                f"{key}: bad signature (another key than the sweep host's, or tampered with)"
            )
        body = json.loads(payload)
        if not isinstance(body, dict):
            raise AuthError(f"{key}: signed, but not a JSON object")
        return body


def load_signer(group: str, path: Path, setting: str = "sweep.signing_key_file") -> Signer:
    """The Ed25519 private key in a PEM file; UsageError names the setting and the fix."""
    return Signer(group, load_private(path, setting))


def load_verifier(group: str, path: Path, setting: str = "sweep.verify_key_file") -> Verifier:
    """The sweep host's Ed25519 public keys in a PEM file (one, or the old and the new one while
    it is rotated); UsageError names the setting."""
    first, *more = load_publics(path, setting)
    return Verifier(group, first, tuple(more))


def shared(group: str, secret: bytes) -> Sealer:
    """The shared-secret seal (HMAC): every holder of the secret can seal."""
    return Sealer(group, secret)
