"""Authenticated node-group messages: an HMAC-SHA256 over every value members exchange.

The member stores (netmon.group.store) admit only connections that prove they hold the group's
secret, but every member holds it. So every value is also sealed with the group's shared secret,
and the MAC covers the group's name and the key the value is stored under, so a sealed value
cannot be replayed under another key (another round's epoch, another member's readiness).
Messages that decide something now (a member's hello, the leader's current round) also carry the
time they were sealed and go stale, so a recorded one cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netmon.errors import UsageError

if TYPE_CHECKING:
    from netmon.group.members import GroupConfig

log = logging.getLogger(__name__)

VERSION = "netmon-v1"
MIN_SECRET_BYTES = 16
# A fresh message is at most this old, or this far ahead: clocks of group nodes must agree to
# within it (NTP keeps them within milliseconds). It is also how long a recorded hello could be
# replayed by someone who can reach a member port, so it is not larger than it needs to be.
MAX_AGE_S = 30.0


class AuthError(Exception):
    """A group message that is not from a holder of the group's secret, or not for this key."""


@dataclass(frozen=True)
class Sealer:
    """Seals and opens the values of one group with its secret."""

    group: str
    secret: bytes = field(repr=False)

    def _mac(self, key: str, payload: str) -> str:
        message = "\0".join((VERSION, self.group, key, payload)).encode()
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest()

    def seal(self, key: str, body: dict[str, Any]) -> str:
        payload = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return f"{self._mac(key, payload)}.{payload}"

    def open(self, key: str, value: str) -> dict[str, Any]:
        mac, dot, payload = value.partition(".")
        if not dot or len(mac) != 64:
            raise AuthError(f"{key}: not a sealed group message")
        if not hmac.compare_digest(mac, self._mac(key, payload)):
            raise AuthError(f"{key}: wrong MAC (another group secret, or tampered with)")
        try:
            body = json.loads(payload)
        except ValueError:
            raise AuthError(f"{key}: sealed, but not JSON") from None
        if not isinstance(body, dict):
            raise AuthError(f"{key}: sealed, but not a JSON object")
        return body


def check_fresh(key: str, body: dict[str, Any], now: float, max_age: float = MAX_AGE_S) -> None:
    """A time-critical message must have been sealed within max_age of now (either way)."""
    sealed_at = body.get("t")
    if not isinstance(sealed_at, (int, float)) or isinstance(sealed_at, bool):
        raise AuthError(f"{key}: no time it was sealed")
    skew = now - float(sealed_at)
    if abs(skew) > max_age:
        way = "old" if skew > 0 else "in the future"
        raise AuthError(
            f"{key}: sealed {abs(skew):.0f} s {way}, more than {max_age:.0f} s "
            "(a replay, or the nodes' clocks disagree: check NTP)"
        )


def read_secret(path: Path) -> bytes:
    """The group's shared secret from a file; ValueError says what is wrong and how to fix it."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path} ({exc.strerror})") from None
    secret = raw.strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"{path} holds {len(secret)} bytes; use at least {MIN_SECRET_BYTES}, "
            "e.g. `openssl rand -hex 32 > " + str(path) + "`"
        )
    return secret


def group_secret(group: GroupConfig) -> bytes:
    """The secret of a configured group; UsageError names the setting and the fix."""
    assert group.secret_file is not None  # GroupConfig requires it
    return setting_secret("group.secret_file", group.secret_file)


def setting_secret(setting: str, path: Path) -> bytes:
    """The secret in the file a setting names (group.secret_file, sweep.secret_file);
    UsageError names the setting and the fix."""
    try:
        secret = read_secret(path)
    except ValueError as exc:
        raise UsageError(f"{setting}: {exc}") from None
    if _readable_by_others(path):
        log.warning("%s %s is readable by every user: chmod 600 it", setting, path)
    return secret


def _readable_by_others(path: Path) -> bool:
    try:
        return bool(path.stat().st_mode & stat.S_IROTH)
    except OSError:
        return False
