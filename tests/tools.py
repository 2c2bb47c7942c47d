"""Command-line tools the deployment tests run (promtool, kubectl, ...): found in the venv or on
PATH, or the test fails naming what to install. Importing it needs none of them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "netmon-rules.yaml"


def tool(name: str, install: str) -> str:
    """A command from the venv (dev extra) or the system, or a failed test naming its package."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: {install}")
    return found


def run(*command: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=120, env=env, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{output}"
    return output


def promtool() -> str:
    return tool(
        "promtool",
        "apt-get install prometheus (Debian's package ships promtool; scripts/test-deps does)",
    )
