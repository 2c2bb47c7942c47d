"""docs/SECURITY.md's threat model names, for each row, the test that shows it: every test it
names exists, so a renamed or removed test cannot leave a row resting on nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECURITY = ROOT / "docs" / "SECURITY.md"


def threat_rows() -> list[list[str]]:
    text = SECURITY.read_text()
    section = text.split("## Threat model", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows[1:]]


def named_tests(cell: str) -> list[tuple[str, str]]:
    """(file, function) for each `tests/F.py::name` or `::name` (the file before it) in a cell."""
    named: list[tuple[str, str]] = []
    file = ""
    for given, name in re.findall(r"(tests/\w+\.py)?::(\w+)", cell):
        file = given or file
        named.append((file, name))
    return named


def functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_every_row_of_the_threat_model_names_a_test_that_exists() -> None:
    rows = threat_rows()
    assert len(rows) >= 30, "the threat model's table was not found"
    missing = []
    for row in rows:
        assert len(row) == 4, row
        tests = named_tests(row[3])
        assert tests, f"a row names no test: {row[0]} / {row[1]}"
        for file, name in tests:
            path = ROOT / file
            if not path.is_file() or name not in functions(path):
                missing.append(f"{file}::{name}")
    assert not missing, missing
