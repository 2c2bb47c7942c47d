"""The operator's pause: the pause file stops every probe on the node; each file in the pause
directory stops the probes on the GPUs it lists (a Slurm prolog writes one per job with the job's
GPUs), or on the whole node when it lists none.

A file in the pause directory holds GPU ids, NVML indexes ("3") or UUIDs ("GPU-..."), separated
by whitespace or commas; `#` starts a comment. Files whose names start with "." are ignored, so a
writer can create one under a temporary name and rename it into place.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

_SEPARATORS = re.compile(r"[\s,]+")


@dataclass(frozen=True)
class Pause:
    """What the operator paused: the node, and GPUs by id (as written, lowercased)."""

    node: str | None = None  # why the whole node is paused, or None
    gpus: Mapping[str, str] | None = None  # GPU id -> the file that pauses it

    def covers(self, names: Iterable[str]) -> str | None:
        """Why a probe on a GPU known by any of `names` must not run; None when it may."""
        if self.node is not None:
            return self.node
        for name in names:
            holder = (self.gpus or {}).get(name.lower())
            if holder is not None:
                return f"GPU {name} paused by {holder}"
        return None


NOT_PAUSED = Pause()


def parse_ids(text: str) -> tuple[str, ...]:
    """The GPU ids in one pause file, lowercased; empty means the whole node."""
    ids = []
    for line in text.splitlines():
        body = line.split("#", 1)[0]
        ids += [token.lower() for token in _SEPARATORS.split(body) if token]
    return tuple(ids)


def read_pause(pause_file: Path | None, pause_dir: Path | None) -> Pause:
    """The pause now. An unreadable file in the directory pauses the node: it may name any GPU."""
    if pause_file is not None and pause_file.exists():
        return Pause(node=f"pause file {pause_file} exists")
    if pause_dir is None:
        return NOT_PAUSED
    try:
        entries = sorted(os.scandir(pause_dir), key=lambda entry: entry.name)
    except (FileNotFoundError, NotADirectoryError):
        return NOT_PAUSED
    except OSError as exc:
        return Pause(node=f"pause directory {pause_dir} cannot be read ({exc.strerror})")
    gpus: dict[str, str] = {}
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_file():
            continue
        try:
            ids = parse_ids(Path(entry.path).read_text(encoding="utf-8", errors="replace"))
        except FileNotFoundError:  # removed since the listing: an epilog just ran
            continue
        except OSError as exc:
            return Pause(node=f"pause file {entry.path} cannot be read ({exc.strerror})")
        if not ids:
            return Pause(node=f"pause file {entry.path} lists no GPU (the whole node)")
        gpus.update(dict.fromkeys(ids, entry.path))
    return Pause(gpus=gpus) if gpus else NOT_PAUSED


def after_pause(previous_end: float, started: float, interval: float, jitter: float) -> bool:
    """Whether a probe run that started at `started` came after a pause: more than two of the
    probe's intervals (and its jitter) since its previous run ended. Its ranks and devices are
    cold again, as after a start, and its series settle again (docs/SIGNAL.md)."""
    return started - previous_end > 2 * interval + jitter
