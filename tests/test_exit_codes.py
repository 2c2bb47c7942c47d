"""One exit-code table for every command (netmon --help), and each command's failures run to
check it: a usage error is 2, no usable GPU and what could not run here are 3, on every command."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from netmon.cli import EXIT_CODES


def netmon(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "netmon", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_the_top_level_help_has_the_table() -> None:
    done = netmon("--help")
    table = done.stdout.split("exit codes, every command:\n", 1)[1]
    listed = [int(code) for code in re.findall(r"^ +(\d+)  ", table, re.MULTILINE)]
    assert listed == [code for code, _ in EXIT_CODES] == [0, 1, 2, 3, 4, 141]


# Usage: a flag or setting wrong. No GPU: a command that needs one, here where there is none.
CASES = [
    ("probe usage", ["probe", "--backend", "gloo", "--sizes", "1X"], 2),
    ("probe no GPU", ["probe", "--backend", "nccl", "--sizes", "8"], 3),
    (
        "probe could not finish",
        ["probe", "--backend", "gloo", "--sizes", "64M", "-n", "200", "--timeout", "3s"],
        3,
    ),
    ("topo usage", ["topo", "--from-file", "/nonexistent"], 2),
    ("topo no GPU", ["topo"], 3),
    ("selftest usage", ["selftest", "--backend", "gloo", "--ranks", "1"], 2),
    ("selftest no GPU", ["selftest"], 3),
    ("check-config usage", ["check-config", "{tmp}/bad.yaml"], 2),
    ("serve usage", ["serve", "--config", "{tmp}/bad.yaml"], 2),
    ("serve no GPU", ["serve", "--config", "{tmp}/nccl.yaml"], 3),
    ("rebaseline usage", ["rebaseline", "--config", "{tmp}/gloo.yaml"], 2),
    ("sweep usage", ["sweep", "--config", "{tmp}/gloo.yaml"], 2),
]


@pytest.mark.parametrize(("case", "args", "code"), CASES, ids=[c[0] for c in CASES])
def test_each_command_fails_with_the_code_the_table_gives(
    tmp_path: Path, case: str, args: list[str], code: int
) -> None:
    (tmp_path / "bad.yaml").write_text("probes: [{name: a, sizes: [8], intervl: 5}]\n")
    state = str(tmp_path / "state")
    (tmp_path / "nccl.yaml").write_text(
        yaml.safe_dump({"backend": "nccl", "listen": "127.0.0.1:0", "state_dir": state})
    )
    (tmp_path / "gloo.yaml").write_text(yaml.safe_dump({"state_dir": state}))
    done = netmon(*(a.format(tmp=tmp_path) for a in args), cwd=tmp_path)
    assert done.returncode == code, (case, done.stderr[-2000:])
    told = [line for line in done.stderr.splitlines() if line.startswith("netmon")]
    assert told and "Traceback" not in done.stderr, (case, done.stderr[-2000:])
