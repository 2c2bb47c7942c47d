"""What a command wrote to a pseudo-terminal, read until its other end is closed and drained."""

from __future__ import annotations

import os


def read_all(leader: int) -> bytes:
    """Everything on `leader` once the follower is closed; closes `leader`."""
    written = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other end is closed and drained
            break
        if not chunk:
            break
        written += chunk
    os.close(leader)
    return written
