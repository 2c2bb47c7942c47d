"""Directories a command makes, and takes back when it failed before writing anything there: a
failed start or sweep leaves the file system as it found it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def missing(path: Path) -> list[Path]:
    """`path` and those of its parents that do not exist yet, deepest first: what mkdir(parents)
    would make."""
    found = []
    while not path.exists() and path != path.parent:
        found.append(path)
        path = path.parent
    return found


def remove_empty(directories: Sequence[Path], leftovers: Sequence[str] = ()) -> None:
    """Remove `directories` (deepest first) while each is empty but for `leftovers` (files this
    command made and nobody needs: a lock); stop at the first that holds anything else."""
    for directory in directories:
        try:
            for name in leftovers:
                (directory / name).unlink(missing_ok=True)
            directory.rmdir()
        except OSError:
            return
