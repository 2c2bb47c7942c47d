"""Property tests over the command line: random argument lists drawn from the real flags of
`netmon probe`, `netmon check-config` and `netmon topo`, with random (mostly bad) values.

Every input here fails validation before a probe could start, and the test guarantees it: starting
a process raises `Launched`. A usage error is exit status 2 and exactly one line on stderr that
names a flag, a field or the file, and never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netmon import bandwidth
from netmon.cli.main import build_parser, main
from netmon.config import NetmonConfig
from netmon.gpu.nvml import gpu_count

SETTINGS = settings(
    max_examples=int(os.environ.get("NETMON_TEST_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=not os.environ.get("NETMON_TEST_EXAMPLES"),
)


class Launched(BaseException):
    """A process was about to start: the input was valid after all (BaseException: no handler in
    netmon catches it)."""


@contextlib.contextmanager
def no_launch() -> Iterator[None]:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise Launched(f"would start {args[0] if args else kwargs.get('args')!r}")

    with mock.patch.object(subprocess, "Popen", side_effect=refuse):
        yield


@contextlib.contextmanager
def clean_environment() -> Iterator[None]:
    # NETMON_* variables override configuration files; the user's must not leak in.
    ours = {key: value for key, value in os.environ.items() if not key.startswith("NETMON_")}
    with mock.patch.dict(os.environ, ours, clear=True):
        yield


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with (
        clean_environment(),
        no_launch(),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code: object = main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code
    assert isinstance(code, int), (argv, code)
    return code, out.getvalue(), err.getvalue()


def assert_usage_error(argv: list[str], code: int, err: str, names: set[str]) -> None:
    lines = err.split("\n")[:-1]  # POSIX lines: a control character such as \r does not end one
    assert code == 2, (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    assert len(lines) == 1 and err.endswith("\n"), (argv, err)
    assert lines[0].startswith("netmon: "), (argv, err)
    assert any(name in lines[0] for name in names if name), (argv, lines[0], names)


# --- the real flags


def subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = commands.choices[name]
    return found


def options(name: str) -> list[argparse.Action]:
    return [
        action
        for action in subparser(name)._actions
        if action.option_strings and not isinstance(action, argparse._HelpAction)
    ]


PROBE = options("probe")

junk = st.one_of(
    st.sampled_from(
        ["", " ", "-", "--", "=", ",", "x", "1e400", "nan", "-1", "0", "∞", "\t", "a\nb"]
    ),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12),
)


def value_for(action: argparse.Action, folder: Path) -> st.SearchStrategy[str]:
    if action.type is Path:  # only ever inside the test's folder
        return st.sampled_from(["x.prom", "missing/x", "x.png", "topo.txt"]).map(
            lambda name: str(folder / name)
        )
    choices = [str(c) for c in action.choices or ()]
    numbers = st.integers(-(10**20), 10**20).map(str)
    floats = st.floats(allow_nan=True, allow_infinity=True).map(repr)
    return (
        st.one_of(st.sampled_from(choices), junk) if choices else st.one_of(numbers, floats, junk)
    )


def flag_args(action: argparse.Action, folder: Path) -> st.SearchStrategy[list[str]]:
    flag = st.sampled_from(action.option_strings)
    if action.nargs == 0:
        return flag.map(lambda f: [f])
    return st.tuples(flag, value_for(action, folder)).map(list)


def is_size_list(text: str) -> bool:
    try:
        return any(bandwidth.parse_size(p) >= 0 for p in text.split(",") if p.strip())
    except (ValueError, OverflowError):
        return False


def not_parsing(parse: Any) -> Any:
    def check(text: str) -> bool:
        try:
            parse(text)
        except (ValueError, OverflowError):
            return True
        return False

    return check


# Each is invalid whatever else is on the line, and is checked before any probe starts.
POISONS: list[st.SearchStrategy[list[str]]] = [
    st.integers(-(10**6), 0).map(lambda n: ["--iters", str(n)]),
    st.integers(-(10**6), 0).map(lambda n: ["--batch", str(n)]),
    st.integers(-(10**6), -1).map(lambda n: ["--warmup", str(n)]),
    st.integers(-(10**6), 0).map(lambda n: ["--ranks", str(n)]),
    st.integers(-(10**6), 0).map(lambda n: ["--chunks", str(n)]),
    junk.filter(lambda t: "=" not in t or t.startswith("=")).map(lambda t: ["--env", t]),
    junk.filter(not_parsing(bandwidth.parse_duration)).map(lambda t: ["--timeout", t]),
    junk.filter(lambda t: t not in ("float32", "bfloat16", "float16")).map(
        lambda t: ["--dtype", t]
    ),
    junk.filter(lambda t: bool(re.search(r"[^a-z_,\s]", t))).map(lambda t: ["--op", t]),
    junk.filter(lambda t: t.strip(", ") != "" and not is_size_list(t)).map(
        lambda t: ["--sizes", t]
    ),
    junk.filter(not_parsing(bandwidth.parse_rate)).map(lambda t: ["--min-busbw", t]),
    junk.filter(lambda t: bool(re.search(r"[^a-z,\s]", t))).map(lambda t: ["--paths", t]),
    st.from_regex(r"--zz[a-z]{1,8}", fullmatch=True).map(lambda t: [t]),
    st.sampled_from(["--iters", "--ranks", "--batch", "--passes"]).map(lambda f: [f, "many"]),
]
POISON_DESTS = {
    "--iters": "iters",
    "--batch": "batch",
    "--warmup": "warmup",
    "--ranks": "ranks",
    "--chunks": "chunks",
    "--timeout": "timeout",
    "--dtype": "dtype",
    "--op": "op",
    "--sizes": "sizes",
    "--min-busbw": "min_busbw",
    "--paths": "paths",
    "--passes": "passes",
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cli")


def names_in(argv: list[str], actions: list[argparse.Action]) -> set[str]:
    """What an error may name: the flags given (and their aliases and fields)."""
    names = {arg.split("=", 1)[0] for arg in argv if arg.startswith("-")}
    for action in actions:
        if names & set(action.option_strings):
            names |= {*action.option_strings, action.dest}
    return names


@st.composite
def probe_argv(draw: st.DrawFn, folder: Path) -> list[str]:
    poison = draw(st.one_of(POISONS))
    # An option given twice keeps its last value: the poison's flag is not drawn again.
    spoiled = POISON_DESTS.get(poison[0])
    others = [a for a in PROBE if a.dest not in (spoiled, "backend")]
    chosen = draw(st.lists(st.sampled_from(others), max_size=6, unique_by=lambda a: a.dest))
    parts = [draw(flag_args(action, folder)) for action in chosen] + [poison]
    parts = draw(st.permutations(parts))
    # --backend is always given: without it, probe prints which backend it chose on stderr first.
    backend = draw(st.sampled_from(["gloo", "nccl"]))
    return ["probe", "--backend", backend, *(arg for part in parts for arg in part)]


@SETTINGS
@given(data=st.data())
def test_bad_probe_arguments_are_one_line_and_exit_2(data: st.DataObject, folder: Path) -> None:
    argv = data.draw(probe_argv(folder))
    code, out, err = run(argv)
    assert_usage_error(argv, code, err, names_in(argv, PROBE))
    assert out == ""


# Found by the property test above; each was a traceback or a second line.
def test_probe_wrapper_with_an_unbalanced_quote_is_a_usage_error() -> None:
    argv = ["probe", "--backend", "gloo", "--iters", "0", "--wrapper", 'numactl "']
    code, _, err = run(argv)
    assert_usage_error(argv, code, err, {"--wrapper"})


def test_probe_op_with_a_newline_is_one_line() -> None:
    argv = ["probe", "--backend", "gloo", "--op", "all_reduce\nbogus"]
    code, _, err = run(argv)
    assert_usage_error(argv, code, err, {"--op"})


# --- check-config with random YAML files

FIELDS = list(NetmonConfig.model_fields)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    junk,
    st.sampled_from(["64K", "1s", "127.0.0.1:0", "gloo", "nccl", "all_reduce", "-5m", "1e999G"]),
)
yaml_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(FIELDS), junk), inner, max_size=3),
    ),
    max_leaves=8,
)
documents = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS), yaml_values, min_size=1, max_size=4),
    st.dictionaries(st.one_of(junk, st.sampled_from(FIELDS)), yaml_values, max_size=3),
    yaml_values,
)
raw_texts = st.one_of(
    st.text(max_size=60),
    st.sampled_from(["{", "a: [", "probes: !!int x", "listen: *x", "- [a\n- b", "\x00", "a: b: c"]),
)


@SETTINGS
@given(document=documents)
def test_check_config_of_random_yaml_is_one_line_or_valid(document: Any, folder: Path) -> None:
    path = folder / "random.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    check_config(path)


@SETTINGS
@given(text=raw_texts)
def test_check_config_of_random_text_is_one_line_or_valid(text: str, folder: Path) -> None:
    path = folder / "random.txt"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    check_config(path)


def check_config(path: Path) -> None:
    argv = ["check-config", str(path)]
    code, out, err = run(argv)
    if code == 0:  # a random document can be valid, with every field defaulted
        assert err.startswith("# OK") and yaml.safe_load(out) is not None
        return
    assert_config_errors(argv, code, err, str(path))


def assert_config_errors(argv: list[str], code: int, err: str, path: str) -> None:
    """check-config's refusal: every error a line, each naming the file; the first says how
    many more follow (the daemon's own refusal is that first line alone)."""
    lines = err.split("\n")[:-1]
    assert code == 2 and "Traceback" not in err and err.endswith("\n"), (argv, code, err)
    more = re.search(r" \[and (\d+) more\]$", lines[0]) if lines else None
    assert len(lines) == 1 + (int(more.group(1)) if more else 0), (argv, err)
    assert all(line.startswith("netmon: ") and path in line for line in lines), (argv, err)


def test_check_config_of_a_missing_file(folder: Path) -> None:
    argv = ["check-config", str(folder / "absent.yaml")]
    code, _, err = run(argv)
    assert_usage_error(argv, code, err, {str(folder / "absent.yaml")})


# --- topo

topo_tokens = st.sampled_from(
    ["GPU0", "GPU1", "GPU2", "X", "NV4", "NV18", "PIX", "PXB", "SYS", "NODE", "PHB", "CPU Affinity",
     "NUMA Affinity", "0-15", "N/A", "Legend:", "NIC0", "\t", " ", "\n", "\n", "mlx5_0"]
)  # fmt: skip


@SETTINGS
@given(
    content=st.one_of(st.lists(topo_tokens, max_size=40).map("".join), st.text(max_size=80)),
    extra=st.lists(st.sampled_from(["--json", "--zzz", "--from-file"]), max_size=2),
)
def test_topo_from_a_random_file_is_one_line_or_parsed(
    content: str, extra: list[str], folder: Path
) -> None:
    path = folder / "topo.txt"
    path.write_bytes(content.encode("utf-8", "surrogatepass"))
    argv = ["topo", "--from-file", str(path), *extra]
    code, out, err = run(argv)
    if code == 0:
        assert out and err == ""
        return
    assert_usage_error(argv, code, err, {"--from-file", "--zzz", str(path)})


def test_topo_errors_name_the_flag(folder: Path) -> None:
    argv = ["topo", "--from-file", str(folder / "absent.txt")]
    code, _, err = run(argv)
    assert_usage_error(argv, code, err, {"--from-file"})
    if gpu_count() == 0:  # NVML has nothing to say here: the error points at --from-file
        code, _, err = run(["topo"])
        # Could not run here (3, as probe and selftest without a GPU), in one line naming the flag.
        assert code == 3 and len(err.strip().splitlines()) == 1 and "--from-file" in err, err
        assert "Traceback" not in err
