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
write them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from netmon.errors import UsageError
from netmon.group.auth import AuthError, Sealer

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

    def open(self, key: str, value: str) -> dict[str, Any]:
        from cryptography.exceptions import InvalidSignature

        signature, dot, payload = value.partition(".")
        if not dot or len(signature) != SIGNATURE_HEX:
            raise AuthError(
                f"{key}: not signed by the sweep host (a shared-secret seal, or none): this "
                "daemon takes only signed reports (sweep.verify_key_file)"
            )
        try:
            self.public.verify(bytes.fromhex(signature), _message(self.group, key, payload))
        except (InvalidSignature, ValueError):
            raise AuthError(
                f"{key}: bad signature (another key than the sweep host's, or tampered with)"
            ) from None
        body = json.loads(payload)
        if not isinstance(body, dict):
            raise AuthError(f"{key}: signed, but not a JSON object")
        return body


def load_signer(group: str, path: Path, setting: str = "sweep.signing_key_file") -> Signer:
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
    return Signer(group, key)


def load_verifier(group: str, path: Path, setting: str = "sweep.verify_key_file") -> Verifier:
    """The sweep host's Ed25519 public key in a PEM file; UsageError names the setting."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        key = load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise UsageError(f"{setting}: {path}: {exc.strerror or exc}") from None
    except (ValueError, TypeError):
        raise UsageError(f"{setting}: {path} is not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise UsageError(
            f"{setting}: {path} is not an Ed25519 public key (openssl pkey -in KEY -pubout)"
        )
    return Verifier(group, key)


def shared(group: str, secret: bytes) -> Sealer:
    """The shared-secret seal (HMAC): every holder of the secret can seal."""
    return Sealer(group, secret)
