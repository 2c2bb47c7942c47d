"""`netmon --help` and every command's `--help` as a user reads them: the installed console script
and `python -m netmon`, at a 120-column terminal; no code docstring shown, no doubled program
name; `netmon` alone and unknown arguments answer with a usage line and a hint."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from netmon.cli import main as cli_main

SCRIPT = Path(sys.executable).parent / "netmon"  # the console script beside the venv's python
COLUMNS = 120


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every command the parser registers, with its parser (not a copy of the list)."""
    parser = cli_main.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: dict[str, argparse.ArgumentParser] = dict(action.choices)
    return found


def docstrings() -> list[str]:
    """The first line of every command module's docstring: for the code's reader, not a user."""
    names = ["main", "probe_command", "selftest_command", "topo_command", "sweep_command"]
    names += ["rebaseline_command"]
    lines = []
    for name in names:
        doc = importlib.import_module(f"netmon.cli.{name}").__doc__ or ""
        lines.append(doc.strip().splitlines()[0])
    return lines


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(COLUMNS)}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def assert_fits(text: str) -> None:
    long = [line for line in text.splitlines() if len(line) > COLUMNS]
    assert long == [], long


@pytest.mark.parametrize("argv", [[str(SCRIPT)], [sys.executable, "-m", "netmon"]])
def test_the_top_level_help_lists_every_command_and_where_to_read_more(argv: list[str]) -> None:
    assert SCRIPT.is_file(), f"{SCRIPT}: the console script is not installed (pip install -e .)"
    done = run(*argv, "--help")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith("usage: netmon [-h] [--version] COMMAND ...\n")
    assert "netmon netmon" not in text
    assert_fits(text)
    listed = text.split("\ncommands:\n", 1)[1].split("\n\n")[0].splitlines()
    names = [line.split()[0] for line in listed]
    assert sorted(names) == sorted(commands()), listed
    # One line each: the name, then its summary on the same line.
    assert all(len(line.split()) > 2 for line in listed), listed
    for doc in docstrings():
        assert doc not in text, doc
    assert "examples:\n  netmon probe" in text
    assert "docs/" in text and "netmon COMMAND --help" in text


@pytest.mark.parametrize("name", sorted(commands()))
def test_each_commands_help_fits_and_names_the_command_once(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", str(COLUMNS))  # argparse wraps to it
    with pytest.raises(SystemExit) as exited:
        cli_main.main([name, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: netmon {name} [-h]")
    assert "netmon netmon" not in text
    assert_fits(text)
    for doc in docstrings():
        assert doc not in text, doc


def test_netmon_alone_prints_the_usage_and_a_hint_and_exits_2() -> None:
    done = run(sys.executable, "-m", "netmon")
    assert done.returncode == 2
    assert done.stdout == ""
    usage, hint = done.stderr.splitlines()
    assert usage.startswith("usage: netmon ")
    assert hint == "netmon: give a command (netmon --help lists them)"


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["bogus"], "(see netmon --help)"),
        (["probe", "--bogus"], "(see netmon probe --help)"),
        (["selftest", "--ranks", "two"], "(see netmon selftest --help)"),
        (["topo", "extra"], "(see netmon topo --help)"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_help_to_read(
    argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("netmon: ") and err.count("\n") == 1, err
    assert err.rstrip().endswith(hint), err


@pytest.mark.parametrize(
    ("argv", "instead"),
    [
        (["probe", "-c", "1"], "-c (--check) here"),
        (["probe", "--ranks", "1", "-c", "1"], "-c (--check) here"),  # the first 1 is a value
        (["probe", "-z", "1"], "-z (--per-op)"),
        (["probe", "-g", "8"], "--ranks N"),
        (["probe", "-d", "float"], "--dtype"),
        (["probe", "-o", "sum"], "reduces with sum"),
        (["probe", "-t", "2"], "--ranks N"),
        (["probe", "-a", "1"], "--rank-stat"),
        (["probe", "-G", "1"], "--cuda-graph"),
        (["probe", "-T", "60"], "--timeout"),
    ],
)
def test_an_nccl_tests_flag_gets_a_one_line_hint_naming_netmons(
    argv: list[str], instead: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main.main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1, err
    assert "nccl-tests' " + argv[-2] in err and instead in err, err
    assert err.rstrip().endswith("(see netmon probe --help)"), err


def test_an_unknown_value_after_a_flag_netmon_knows_gets_no_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli_main.main(["probe", "--ranks", "2", "7"])
    assert "nccl-tests" not in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["serve", "--liste", "0.0.0.0:1"], ["probe", "--siz", "8"]])
def test_an_abbreviated_flag_is_refused_not_taken_for_the_full_one(argv: list[str]) -> None:
    # The chart refuses --listen and --config in extraArgs by their full names; an abbreviation
    # must not reach them either.
    with pytest.raises(SystemExit) as exit_info:
        cli_main.build_parser().parse_args(argv)
    assert exit_info.value.code == 2
