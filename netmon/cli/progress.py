"""What `netmon probe` tells a person waiting: a line per size done, and on a terminal a status
line within the size (its phase, ops or samples done of how many, the time left in it).

The status line is one line rewritten in place (carriage return, erase to the end); a size's
result line replaces it. Off a terminal (a log, a pipe) only the result lines are written, as
before: no control characters in files. The time left is the size's own: the samples so far at
the pace so far (a sample of a size takes the same time as the next, give or take noise).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from netmon import bandwidth

# How often a rank reports its progress within a size (ProbeSpec.progress_s) on a terminal.
REPORT_EVERY_S = 0.5
_ERASE = "\r\x1b[K"


@dataclass
class _Phase:
    name: str = ""
    size: int = 0
    started: float = 0.0


def left_s(elapsed_s: float, done: int, of: int) -> float | None:
    """The time left at this pace, or None before the first step."""
    if done <= 0 or of <= done:
        return None
    return elapsed_s / done * (of - done)


def status_line(phase: str, size: int, done: int, of: int, left: float | None) -> str:
    what = "samples" if phase == "measure" else "ops"
    text = f"{phase} {bandwidth.format_size(size)}: {done}/{of} {what}"
    return text + (f", about {left:.0f} s left in this size" if left is not None else "")


class Progress:
    """The probe's event hook (launcher on_event) for the command line."""

    def __init__(
        self,
        total: int,
        stream: IO[str],
        *,
        results: bool,
        live: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.stream, self.results, self.live, self.clock = (
            total,
            stream,
            results,
            live,
            clock,
        )
        self.done = 0
        self.phase = _Phase()
        self.showing = False

    def __call__(self, kind: str, event: dict[str, Any]) -> None:
        if kind == "phase" and event.get("rank") == 0:
            self.phase = _Phase(str(event["phase"]), int(event.get("size") or 0), self.clock())
        elif kind == "progress" and self.live:
            self._show(event)
        elif kind == "result":
            self._result(event["result"])

    def close(self) -> None:
        self._erase()

    def _show(self, event: dict[str, Any]) -> None:
        done, of = int(event["done"]), int(event["of"])
        phase, size = str(event["phase"]), int(event["size"])
        if (self.phase.name, self.phase.size) != (phase, size):  # its phase event not seen
            self.phase = _Phase(phase, size, self.clock())
        left = left_s(self.clock() - self.phase.started, done, of)
        prefix = f"netmon: [{self.done + 1}/{self.total}] " if self.total > 1 else "netmon: "
        self.stream.write(_ERASE + prefix + status_line(phase, size, done, of, left))
        self.stream.flush()
        self.showing = True

    def _result(self, result: Any) -> None:
        self.done += 1
        self._erase()
        if not self.results:
            return
        graph = " (timed from a CUDA graph)" if result.timing_path == "graph" else ""
        self.stream.write(
            f"netmon: [{self.done}/{self.total}] {result.op} "
            f"{bandwidth.format_size(result.size_bytes)} x{result.chunks}: busbw "
            f"{result.busbw_bytes_per_second / 1e9:.3f} GB/s{graph}\n"
        )
        self.stream.flush()

    def _erase(self) -> None:
        if self.showing:
            self.stream.write(_ERASE)
            self.stream.flush()
            self.showing = False
