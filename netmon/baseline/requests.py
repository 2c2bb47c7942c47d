"""An operator's request to forget baselines (`netmon rebaseline`): a small file the command
leaves in the state directory, and the daemon takes at its next result or its next start.

A file, not an endpoint: /metrics stays read-only, the request needs the same rights as the
state itself, and it survives a daemon that is down or restarting when it is made.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from netmon.errors import describe_validation_error

DIRECTORY = "rebaseline"


class Request(BaseModel):
    """Forget the baselines and references of these probes' series (all probes when empty)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    probes: tuple[str, ...] = ()
    reason: str = Field(default="", max_length=500)
    requested_at: float = Field(ge=0, allow_inf_nan=False)
    by: str = Field(default="", max_length=100)

    def describe(self) -> str:
        which = ", ".join(self.probes) if self.probes else "every probe"
        why = self.reason or "no reason given"
        return f"{which}, requested by {self.by or 'unknown'} ({why})"


def write(state_dir: Path, probes: tuple[str, ...], reason: str) -> Path:
    """Leave a request for the daemon; OSError if the state directory cannot take it,
    PermissionError if this user is not the daemon's (the daemon could not take the request)."""
    owner = state_dir.stat()
    if os.geteuid() not in (0, owner.st_uid):
        raise PermissionError(
            f"{state_dir} belongs to uid {owner.st_uid}: run as the daemon's user"
        )
    directory = state_dir / DIRECTORY
    directory.mkdir(parents=True, exist_ok=True)
    _give(directory, owner)
    request = Request(probes=probes, reason=reason, requested_at=time.time(), by=_user())
    data = request.model_dump_json().encode() + b"\n"
    fd, tmp = tempfile.mkstemp(prefix=".request.", suffix=".tmp", dir=directory)
    try:
        with open(fd, "wb") as file:
            file.write(data)
        # Named by time then pid: taken in the order they were made.
        final = directory / f"{time.time_ns():020d}-{os.getpid()}.json"
        _give(Path(tmp), owner)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return final


def take(state_dir: Path) -> Iterator[Request | str]:
    """The pending requests, oldest first, each removed as it is taken; a file that is not a
    request yields a one-line warning and is set aside as "<name>.rejected"."""
    directory = state_dir / DIRECTORY
    try:
        names = sorted(p for p in directory.iterdir() if p.suffix == ".json")
    except OSError:  # no request was ever made (or the directory is unreadable: nothing to do)
        return
    for path in names:
        try:
            request = Request.model_validate(json.loads(path.read_bytes()[:10_000]))
        except FileNotFoundError:  # taken meanwhile
            continue
        except (OSError, ValueError, ValidationError) as exc:
            why = describe_validation_error(exc) if isinstance(exc, ValidationError) else exc
            with contextlib.suppress(OSError):
                os.replace(path, path.with_name(path.name + ".rejected"))
            yield f"rebaseline request {path} is not one ({why}); set aside"
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        yield request


def _give(path: Path, owner: os.stat_result) -> None:
    """Root leaves what it makes to the state directory's owner: the daemon must read and
    delete the request (sudo netmon rebaseline, a daemon running as its own user)."""
    if os.geteuid() == 0 and owner.st_uid != 0:
        os.chown(path, owner.st_uid, owner.st_gid)


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return str(os.getuid())
