"""The tier rules (tests/tiers.py): a test's tier follows what it calls, through the suite's own
helpers, and what its fixtures start."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import netns, tiers


def _plain() -> int:
    return sum(range(3))


def _runs_a_command() -> None:
    subprocess.run(["true"], check=True)


def _calls_a_helper_that_runs_one() -> None:
    _runs_a_command()


def _makes_namespaces() -> None:
    netns.require_root()


def test_a_test_is_at_the_tier_of_what_it_calls_through_the_suites_helpers() -> None:
    assert tiers.of_function(_plain) == "pure"
    assert tiers.of_function(_runs_a_command) == "process"
    assert tiers.of_function(_calls_a_helper_that_runs_one) == "process"
    assert tiers.of_function(_makes_namespaces) == "system"


def test_a_fixture_raises_a_test_to_what_it_starts() -> None:
    assert tiers.of_test(_plain, {"tmp_path": []}) == "pure"
    assert tiers.of_test(_plain, {"daemons": []}) == "process"
    assert tiers.of_test(_plain, {"made": [_makes_namespaces]}) == "system"


def test_a_test_that_calls_nothing_is_pure_in_a_module_that_does(
    request: pytest.FixtureRequest,
) -> None:
    assert request.node.get_closest_marker("pure") is not None


def test_every_test_run_alone_is_a_test_of_the_suite() -> None:
    # A module renamed or removed would silently run beside other tests again.
    suite = Path(__file__).resolve().parent
    missing = []
    for entry in sorted(tiers.ALONE):
        module, _, test = entry.partition("::")
        path = suite / f"{module.split('.')[-1]}.py"
        if not path.is_file() or (test and f"def {test}(" not in path.read_text()):
            missing.append(entry)
    assert not missing, f"tests/tiers.py ALONE names tests that are not there: {missing}"


def test_a_test_of_a_module_run_alone_is_marked_so(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("alone") is None  # this module is not one of them
    assert "tests.test_sim" in tiers.ALONE  # the pairs' busbw that failed on a busy machine
