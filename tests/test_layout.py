"""The layout keeps its promises (docs/ARCHITECTURE.md): small modules, few at the top, no code
written twice, no import circle, a README table that matches the tree, and nothing that leans on
files outside the repository."""

from __future__ import annotations

import ast
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


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.Import | ast.ImportFrom, package: str, known: set[str]) -> set[str]:
    """The modules of `known` an import statement loads: for `from m import a, b` each name
    that is a submodule of m, and m itself for every name that is not."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names} & known
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
    names = {f"{base}.{alias.name}" for alias in node.names}
    return (names & known) | ({base} & known if names - known else set())


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each module of netmon/ and the modules of netmon/ it imports, at its top or inside a
    function, relative or absolute (a package's own __init__ is not counted as imported by its
    submodules: Python runs it first either way)."""
    paths = {_module_name(p, root): p for p in sorted((root / "netmon").rglob("*.py"))}
    known = set(paths)
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                targets |= _imported(node, package, known)
        graph[name] = targets - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle as the modules around it (first repeated at the end), or []."""
    state: dict[str, str] = {}
    trail: list[str] = []

    def visit(name: str) -> list[str]:
        state[name] = "open"
        trail.append(name)
        for target in sorted(graph.get(name, ())):
            if state.get(target) == "open":
                return [*trail[trail.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[name] = "done"
        trail.pop()
        return []

    for name in sorted(graph):
        if name not in state and (cycle := visit(name)):
            return cycle
    return []


def test_the_cycle_finder_finds_a_circle_through_a_function_import(tmp_path: Path) -> None:
    (tmp_path / "netmon" / "sub").mkdir(parents=True)
    for init in ("netmon/__init__.py", "netmon/sub/__init__.py"):
        (tmp_path / init).write_text("")
    (tmp_path / "netmon/sub/a.py").write_text("from netmon.sub import b\n")
    (tmp_path / "netmon/sub/b.py").write_text("def f():\n    from .a import g\n")
    (tmp_path / "netmon/c.py").write_text("import os\nfrom netmon.sub.a import x\n")
    (tmp_path / "netmon/d.py").write_text("from netmon.sub import b, x\nfrom . import c\n")
    graph = import_graph(tmp_path)
    assert graph["netmon.c"] == {"netmon.sub.a"}
    assert graph["netmon.d"] == {"netmon.sub", "netmon.sub.b", "netmon.c"}
    assert find_cycle(graph) == ["netmon.sub.a", "netmon.sub.b", "netmon.sub.a"]


def test_no_module_imports_itself_round_a_circle() -> None:
    cycle = find_cycle(import_graph(ROOT))
    assert cycle == [], "import circle: " + " -> ".join(cycle)


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
