"""A reader that goes away (`netmon replay F --json | head -1`) ends the command quietly, with
exit 0 (issue 49): no BrokenPipeError traceback, and not netmon's "unhealthy" (1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from netmon.cli import EXIT_READER_GONE, replay_command
from netmon.cli import main as main_module

SERIES = {"probe": "large", "op": "all_reduce", "size": 268435456, "ranks": 8, "path": "default"}


def _run_into_a_closed_pipe(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    """`argv` with its standard output a pipe whose reader closed before it started: its first
    write fails (EPIPE), however fast the machine."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "netmon", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)


def _stream(path: Path, results: int) -> Path:
    start = 1767225600.0
    lines = [
        json.dumps({**SERIES, "t": start + 60 * i, "busbw": 1e11 * (1 + 0.01 * (i % 7))})
        for i in range(results)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("command", ["replay", "schema"])
def test_a_reader_gone_ends_the_command_quietly_with_exit_0(command: str, tmp_path: Path) -> None:
    # 2,000 results: some 700 KB of --json lines, far over a pipe's buffer.
    argv = (
        ["replay", "--json", str(_stream(tmp_path / "s.jsonl", 2000))]
        if command == "replay"
        else ["check-config", "--schema"]
    )
    done = _run_into_a_closed_pipe(argv)
    assert done.stderr == b"" and done.returncode == 0, (done.returncode, done.stderr[-600:])


def test_a_gates_reader_gone_before_its_verdict_is_never_a_pass() -> None:
    # netmon probe --min-busbw as a health gate, piped to head: its verdict was never given,
    # so it exits as a process that SIGPIPE killed, never 0 (nor 1, "unhealthy").
    argv = ["probe", "--backend", "gloo", "--sizes", "8", "-n", "1", "-q", "--min-busbw", "1K"]
    done = _run_into_a_closed_pipe(argv)
    assert done.returncode == EXIT_READER_GONE == 141, (done.returncode, done.stderr[-600:])
    assert b"Traceback" not in done.stderr


def test_a_broken_pipe_of_another_kind_is_not_taken_for_a_reader_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Standard output read to the end, a command whose own socket broke: the error stands.
    read, write = os.pipe()
    with os.fdopen(read, "rb") as reader, os.fdopen(write, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert not main_module._stdout_closed()

        def broken(_args: object) -> int:
            raise BrokenPipeError("a peer's socket")

        monkeypatch.setattr(replay_command, "_cmd_replay", broken)
        with pytest.raises(BrokenPipeError):
            main_module.main(["replay", "-"])
        reader.close()  # and once nothing reads it, it is a reader gone
        assert main_module._stdout_closed()
