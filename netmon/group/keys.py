"""A group's key material as one value, and a stamp of its files' contents for SIGHUP.

A reload used to compare configurations, so a secret or key file replaced in place (same path,
new contents) was reported reloaded and the old key kept. The stamp hashes what the files hold,
so a rotation is seen exactly when something in them changed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from netmon.group.auth import Sealer, group_secret
from netmon.group.members import GroupConfig
from netmon.group.signing import MemberSigner, MemberVerifier, load_member_keys


@dataclass(frozen=True)
class GroupKeys:
    secret: bytes = field(repr=False)
    sealer: Sealer
    signer: MemberSigner | None
    verifier: MemberVerifier | None
    stamp: str


def key_files(group: GroupConfig) -> list[tuple[str, Path]]:
    """Every file of the group's key material, with the setting that names it."""
    files = [("group.secret_file", group.secret_file)] if group.secret_file else []
    if group.signing_key_file is not None:
        files.append(("group.signing_key_file", group.signing_key_file))
    for member, paths in sorted(group.verify_keys.items()):
        files += [(f"group.verify_keys.{member}", path) for path in paths]
    return files


def stamp_of(files: list[tuple[str, Path]]) -> str:
    """A digest of the files' names and contents; an unreadable file stamps as such, so that
    it changes the stamp and the load that follows names it."""
    digest = hashlib.sha256()
    for setting, path in files:
        try:
            contents = path.read_bytes()
        except OSError as exc:
            contents = f"unreadable: {exc.errno}".encode()
        digest.update(f"{setting}\0{path}\0{len(contents)}\0".encode() + contents)
    return digest.hexdigest()


def load_keys(group: GroupConfig) -> GroupKeys:
    """The group's keys from their files; UsageError names the setting and the fix."""
    files = key_files(group)
    stamp = stamp_of(files)
    secret = group_secret(group)
    signer, verifier = load_member_keys(group.name, group.signing_key_file, group.verify_keys)
    return GroupKeys(secret, Sealer(group.name, secret), signer, verifier, stamp)
