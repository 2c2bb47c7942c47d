"""Every command line of README.md that runs without a GPU, run as written after the README's
setup (`.venv/bin` on PATH, as `source .venv/bin/activate` puts it), with the exit code the
README gives it: `exit N` in its comment, else 0. `make` lines are the setup itself (CI runs
`make test`); a line for a GPU node says what it exits without one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
_BLOCK = re.compile(r"^```(?:sh|bash)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_EXIT = re.compile(r"\bexit (\d)\b")


def command_lines() -> list[tuple[str, int]]:
    found = []
    for block in _BLOCK.findall(README.read_text()):
        for line in block.splitlines():
            command, _, comment = line.partition("#")
            command = command.strip()
            if not command or command.startswith(("make ", "source ")):
                continue
            code = _EXIT.search(comment)
            found.append((command, int(code.group(1)) if code else 0))
    return found


def test_the_readme_shows_netmon_commands_and_how_to_reach_them() -> None:
    lines = command_lines()
    assert len(lines) >= 6 and all(line.startswith("netmon ") for line, _ in lines), lines
    assert "source .venv/bin/activate" in README.read_text()


@pytest.mark.parametrize(("line", "code"), command_lines(), ids=lambda v: str(v)[:60])
def test_each_command_line_runs_as_written(tmp_path: Path, line: str, code: int) -> None:
    # A scratch directory that sees the checkout's files as a clone's root does (relative paths
    # such as tests/fixtures/...), so what a line writes (--report selftest.json) lands here.
    for name in ("tests", "deploy", "grafana", "docs"):
        (tmp_path / name).symlink_to(ROOT / name)
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        ["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == code, (line, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
