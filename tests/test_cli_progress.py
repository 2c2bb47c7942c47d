"""`netmon probe` on a terminal shows a long size moving: its phase, samples done of how many and
the time left in it, on one line rewritten in place; off a terminal nothing but the result lines."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
from types import SimpleNamespace

from netmon.cli.progress import Progress, left_s, status_line
from tests.terminal import read_all


def test_the_time_left_is_the_pace_so_far() -> None:
    assert left_s(10.0, 5, 20) == 30.0
    assert left_s(0.0, 0, 20) is None  # no pace before the first sample
    assert left_s(10.0, 20, 20) is None
    assert status_line("measure", 128 << 20, 7, 20, 26.0) == (
        "measure 128M: 7/20 samples, about 26 s left in this size"
    )
    assert status_line("warmup", 8, 2, 5, None) == "warmup 8: 2/5 ops"


def result(size: int) -> SimpleNamespace:
    return SimpleNamespace(
        op="all_reduce", size_bytes=size, chunks=1, busbw_bytes_per_second=2e9, timing_path="host"
    )


def test_a_status_line_is_rewritten_and_a_result_replaces_it() -> None:
    now = [100.0]
    out = io.StringIO()
    progress = Progress(2, out, results=True, live=True, clock=lambda: now[0])
    progress("result", {"result": result(8)})
    progress("phase", {"rank": 0, "phase": "measure", "size": 1 << 20})
    progress("phase", {"rank": 1, "phase": "warmup", "size": 1 << 20})  # rank 0 speaks for all
    now[0] = 104.0
    progress("progress", {"rank": 0, "phase": "measure", "size": 1 << 20, "done": 4, "of": 20})
    progress("result", {"result": result(1 << 20)})
    progress.close()
    text = out.getvalue()
    assert "\r\x1b[Knetmon: [2/2] measure 1M: 4/20 samples, about 16 s left in this size" in text
    assert text.endswith("\r\x1b[Knetmon: [2/2] all_reduce 1M x1: busbw 2.000 GB/s\n")


def test_off_a_terminal_only_results_are_written() -> None:
    out = io.StringIO()
    progress = Progress(2, out, results=True, live=False)
    progress("progress", {"rank": 0, "phase": "measure", "size": 8, "done": 4, "of": 20})
    progress("result", {"result": result(8)})
    progress.close()
    assert out.getvalue() == "netmon: [1/2] all_reduce 8 x1: busbw 2.000 GB/s\n"


def probe(stderr_on_a_terminal: bool) -> str:
    """`netmon probe` of 8 B and 32M on gloo (about 4 s of samples), its stderr as written."""
    args = [sys.executable, "-m", "netmon", "probe", "--backend", "gloo", "--sizes", "8,32M"]
    if not stderr_on_a_terminal:
        done = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stderr
    leader, follower = pty.openpty()
    ran = subprocess.run(args, stdout=subprocess.PIPE, stderr=follower, timeout=300)
    os.close(follower)
    written = read_all(leader)
    assert ran.returncode == 0, written
    return written.decode()


def test_on_a_terminal_a_large_size_shows_samples_and_time_left() -> None:
    text = probe(stderr_on_a_terminal=True)
    moving = re.findall(r"measure 32M: (\d+)/20 samples, about (\d+) s left in this size", text)
    assert moving, text
    assert [int(done) for done, _ in moving] == sorted(int(done) for done, _ in moving)
    assert text.rstrip().endswith("GB/s"), text  # the result replaced the status line
    assert "\x1b[K" in text


def test_off_a_terminal_no_status_line_is_written() -> None:
    text = probe(stderr_on_a_terminal=False)
    assert "samples" not in text and "\x1b" not in text and "\r" not in text
    assert "netmon: [2/2] all_reduce 32M x1: busbw" in text
