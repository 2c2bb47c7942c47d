"""No shell ever sees text from the configuration or the network (issue 7).

Two checks: the source never asks for a shell, and a real probe whose wrapper and environment are
full of shell syntax runs them as plain arguments and values.
"""

from __future__ import annotations

import ast
from pathlib import Path

from netmon.probe.launcher import run_probe
from netmon.probe.spec import ProbeSpec

PACKAGE = Path(__file__).resolve().parent.parent / "netmon"
_SPAWNERS = {"run", "Popen", "call", "check_call", "check_output"}


def _shell_uses(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        owner = getattr(func, "value", None)
        owner_name = getattr(owner, "id", "")
        if owner_name == "os" and name in ("system", "popen"):
            found.append((node.lineno, f"os.{name}"))
        for keyword in node.keywords:
            if keyword.arg == "shell" and not (
                isinstance(keyword.value, ast.Constant) and keyword.value.value is False
            ):
                found.append((node.lineno, "shell="))
        if owner_name == "subprocess" and name in _SPAWNERS and node.args:
            first = node.args[0]
            if isinstance(first, (ast.JoinedStr, ast.BinOp)) or (
                isinstance(first, ast.Constant) and isinstance(first.value, str)
            ):
                found.append((node.lineno, f"subprocess.{name} with a command string"))
    return found


def test_the_package_never_asks_for_a_shell() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): uses
        for path in sorted(PACKAGE.rglob("*.py"))
        if (uses := _shell_uses(ast.parse(path.read_text(), str(path))))
    }
    assert offenders == {}


def test_the_scan_would_see_a_shell() -> None:
    source = (
        "import os, subprocess\n"
        "subprocess.run('ls ' + x, shell=True)\n"
        "os.system(f'rm {x}')\n"
        "subprocess.Popen(f'ls {x}')\n"
    )
    assert [line for line, _ in _shell_uses(ast.parse(source))] == [2, 2, 3, 4]


def test_shell_syntax_in_a_wrapper_and_the_environment_stays_text(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    spec = ProbeSpec(
        sizes=(8,),
        iters=1,
        warmup=0,
        # Under a shell each of these would create the marker; as argv and values they do not.
        wrappers=tuple(
            (rank, ("env", f"NETMON_X=$(touch {marker})", f"NETMON_Y=`touch {marker}`;"))
            for rank in (0, 1)
        ),
        env=(("NETMON_Z", f"; touch {marker} #"),),
        timeout=120,
    )
    outcome = run_probe(spec)
    assert outcome.ok, outcome.failure
    assert not marker.exists()
