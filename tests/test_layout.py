"""The layout keeps its promises (docs/ARCHITECTURE.md): small modules, few at the top, no code
written twice, a README table that matches the tree, and nothing that leans on files outside the
repository."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "netmon"
# The dashboard's generator and the benchmarks: not in the package, held to its length all the
# same; the dashboard, a package of its own, to its rule on code written twice as well.
GRAFANA = ROOT / "grafana"
BENCH = ROOT / "bench"
MAX_LINES = 500
MAX_TOP_LEVEL = 10
CLONE_LINES = 6


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def dashboard_modules() -> list[Path]:
    return sorted(GRAFANA.rglob("*.py"))


def too_long(paths: list[Path]) -> dict[str, int]:
    """The files over MAX_LINES, with their line counts."""
    return {
        str(p.relative_to(ROOT)): n
        for p in paths
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }


def test_no_module_is_over_500_lines() -> None:
    assert too_long(modules()) == {}


def test_no_dashboard_or_benchmark_file_is_over_500_lines() -> None:
    files = [*dashboard_modules(), *sorted(BENCH.rglob("*.py"))]
    assert len(files) > 2, "the dashboard's and the benchmarks' files are gone"
    assert too_long(files) == {}


def test_at_most_ten_modules_directly_in_the_package() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """Lines that carry code: no blanks, comments, imports, docstring-only or lone punctuation.

    An import's names in parentheses, one a line, are the import's too: two modules that use
    the same builders do not write code twice."""
    kept = []
    in_import = False
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = " ".join(raw.split())
        if in_import:
            in_import = not line.startswith(")")
            continue
        if line.startswith(("import ", "from ")) and line.endswith("("):
            in_import = True
            continue
        if not line or line.startswith(("#", "import ", "from ", '"""')):
            continue
        if re.fullmatch(r"[\])}(\[{,:]+", line):
            continue
        kept.append((number, line))
    return kept


def clones(paths: list[Path], size: int = CLONE_LINES) -> list[tuple[str, str]]:
    """Every run of `size` identical code lines that stands in two places."""
    seen: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for path in paths:
        lines = _code_lines(path)
        for i in range(len(lines) - size + 1):
            window = tuple(text for _, text in lines[i : i + size])
            seen[window].append(f"{path.relative_to(ROOT)}:{lines[i][0]}")
    found = []
    for places in seen.values():
        if len(places) > 1:
            found.append((places[0], places[1]))
    return found


def test_the_clone_finder_finds_a_clone(tmp_path: Path) -> None:
    body = "\n".join(f"x{i} = compute({i}) + {i}" for i in range(CLONE_LINES))
    (tmp_path / "a.py").write_text(f"def a():\n{body}\n")
    (tmp_path / "b.py").write_text(f"import os\n\ndef b():\n    # why\n{body}\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert clones([tmp_path / "a.py", tmp_path / "b.py"]) == [("a.py:2", "b.py:5")]
    finally:
        ROOT = saved


def test_the_clone_finder_skips_the_names_an_import_lists(tmp_path: Path) -> None:
    names = "".join(f"    name{i},\n" for i in range(CLONE_LINES))
    for module in ("a", "b"):
        (tmp_path / f"{module}.py").write_text(f"from builders import (\n{names})\n\nx = 1\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert clones([tmp_path / "a.py", tmp_path / "b.py"]) == []
        assert [text for _, text in _code_lines(tmp_path / "a.py")] == ["x = 1"]
    finally:
        ROOT = saved


def test_no_six_lines_of_code_stand_twice_in_the_package() -> None:
    assert clones(modules()) == []


def test_no_six_lines_of_code_stand_twice_in_the_dashboard() -> None:
    assert len(dashboard_modules()) > 2, "the dashboard's modules are gone"
    assert clones(dashboard_modules()) == []


def test_the_readme_layout_table_names_every_part_of_the_tree() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layout") :]
    named = set(re.findall(r"`(netmon/[a-z_/]*(?:\.py)?)`", table))
    parts = {f"netmon/{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    parts |= {f"netmon/{p.name}" for p in PACKAGE.glob("*.py") if not p.name.startswith("__")}
    assert parts - named == set(), "missing from the README's layout table"
    assert named - parts == set(), "in the README's layout table but not in the tree"


def test_nothing_refers_to_notes_outside_the_repository() -> None:
    outside = re.compile(r"FIELD-NOTES|\.\./shared|/work/")
    places = [*modules(), *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    places += sorted((ROOT / "tests").glob("*.py"))
    hits = [
        str(p.relative_to(ROOT))
        for p in places
        if p.name != "test_layout.py" and outside.search(p.read_text())
    ]
    assert hits == []
