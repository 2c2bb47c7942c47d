"""The suite's three tiers, told from what a test starts, never marked by hand (tests/README.md).

- pure: no process; runs in the pytest process, at most with threads and loopback sockets.
- process: starts processes (ranks, a daemon, the CLI as a subprocess, a fork).
- system: starts a real system beside them: Slurm, network namespaces, Prometheus, Helm.

A test's tier is the highest of what its fixtures and its module's imports say: a module that
imports a system harness (or a process-starting module) puts every test in it at that tier. The
conftest marks each test with its tier, so `pytest -m pure` selects one; and a test the rules call
pure that starts a process anyway fails naming what it started, so a rule that is wrong shows.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping
from typing import Any

TIERS = ("pure", "process", "system")

# Fixtures that start something, by the tier of what they start.
FIXTURES = {
    "namespaces": "system",
    "cluster": "system",
    "slurm": "system",
    "prometheus": "system",
    "daemons": "process",
    "zygotes": "process",
}

# Modules (or packages) whose use makes a module's tests that tier: the harnesses that start real
# systems, and what starts processes (the stdlib's process modules, the probe's launcher, rank
# zygote and builder, the daemon harness).
MODULES = {
    "tests.netns": "system",
    "tests.slurm_cluster": "system",
    "tests.prometheus_harness": "system",
    "tests.tools": "system",  # promtool, helm, kubectl, amtool
    "subprocess": "process",
    "multiprocessing": "process",
    "concurrent.futures.process": "process",
    "tests.daemon_harness": "process",
    "tests.gpu_node": "process",
    "tests.group_harness": "process",
    "tests.terminal": "process",
    "netmon.probe.launcher": "process",
    "netmon.probe.zygote": "process",
    "netmon.probe.build": "process",
    "netmon.probe.forking": "process",
    "netmon.probe.starting": "process",
    "netmon.sweep.ranks": "process",
    "netmon.sweep.slurm": "process",  # sinfo, srun, scontrol
}


# Tests that measure: they assert on wall time, CPU time or share, a host's load or a measured
# bandwidth (a pair's busbw against its class), so another test beside them on the same cores
# could fail them. `make test` (scripts/test-suite) runs them alone, after the rest (the other
# system tests too: they wait on Prometheus, promtool, Helm, docker-compose) ran two at a time.
# A module's name takes every test in it; "module::test" one test (each of its parameters).
# Listed by hand, as what a test asserts is not in the names it uses: a test that asserts on
# time belongs here.
ALONE = {
    "tests.test_auth_flood",  # legitimate scrapes answered within seconds under 700 guessers
    "tests.test_bench_daemon_smoke",  # the daemon's duty cycle and memory
    "tests.test_bench_inspector_smoke",
    "tests.test_bench_noise_smoke",  # false series with the load on and off
    "tests.test_bench_replay_smoke",  # CPU seconds of a replay
    "tests.test_bench_smoke",
    "tests.test_bench_zygote_smoke",  # a fork against a spawn
    "tests.test_clock",  # probes' intervals across clock steps
    "tests.test_faults",  # scrapes stay fast while a rank is stopped
    "tests.test_http_hostile",  # timeouts within a second of their setting
    "tests.test_signal",  # the host's own CPU share, made busy on purpose
    "tests.test_sim",  # 28 pairs' busbw against their class median
    "tests.test_soak_short",  # growth over 45 s of one-second probes
    # System tests that judge bandwidth over tc-shaped links, or time Slurm and a group:
    "tests.test_group",  # three daemons hand a group over within its deadlines
    "tests.test_group_netns",  # a 25 % cut flagged within a count of rounds
    "tests.test_group_store",  # a member round beside a thousand idle sockets
    "tests.test_pairs_netns",  # the shaped rank the only suspect
    "tests.test_slurm_cluster",  # the cluster up within seconds
    "tests.test_sweep_busy_queue",  # a cut cable named among pairs measured by backfill
    "tests.test_sweep_kube",  # suspects named from measured pairs, answers within seconds
    "tests.test_sweep_slurm",  # cut cables named, and no third
    # Within a limit of seconds:
    "tests.test_cli_probe::test_plot_without_matplotlib_fails_before_measuring_with_a_hint_that_works",
    "tests.test_daemon::test_sigterm_while_the_rank_zygote_starts_does_not_wait_for_its_import",
    "tests.test_inspector::test_a_1_gib_file_is_never_read_whole",  # CPU seconds
    "tests.test_kubelet::test_a_stalled_kubelet_is_given_up_at_the_timeout",
    "tests.test_kubelet::test_a_stalled_pod_list_is_given_up_at_the_timeout",
    "tests.test_probe_engine::test_a_stopped_rank_fails_the_probe_within_its_deadline_and_leaves_nothing",
    "tests.test_probe_engine::test_a_killed_rank_fails_the_probe_naming_it_and_leaves_nothing",
    "tests.test_probe_engine::test_abort_request_stops_the_probe_quickly",
    "tests.test_sweep_inbox::test_post_sweep_hands_the_body_to_the_callback_and_answers_its_line",
    "tests.test_sweep_plan::test_a_round_of_a_thousand_nodes_is_planned_and_judged_in_well_under_seconds",
    "tests.test_webconfig::test_a_silent_client_does_not_stall_other_handshakes",
    "tests.test_zygote::test_stopping_a_zygote_while_it_starts_does_not_wait_for_its_import",
    "tests.test_zygote::test_a_stopped_zygote_is_killed_and_the_probe_runs_spawned",
}  # fmt: skip


def alone(module: str | None, test: str | None) -> bool:
    """Whether the test `test` (its name without parameters) of `module` measures."""
    return module in ALONE or f"{module}::{test}" in ALONE


def highest(tiers: Iterable[str]) -> str:
    return max(tiers, key=TIERS.index, default="pure")


def of_module_name(name: str) -> str | None:
    """The tier a module of this name brings, or None: a package's rule covers its modules."""
    for prefix, tier in MODULES.items():
        if name == prefix or name.startswith(prefix + "."):
            return tier
    return None


def _origin(value: Any) -> str | None:
    """The module a name in a test module's namespace comes from, where it says."""
    if isinstance(value, types.ModuleType):
        return value.__name__
    origin = getattr(value, "__module__", None)
    return origin if isinstance(origin, str) else None


def _names(code: types.CodeType) -> set[str]:
    """Every global or attribute name a function's code (and the functions inside it) uses."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def of_function(function: Any, seen: set[int] | None = None) -> str:
    """The tier a test (or fixture, or helper) brings by what it calls: the highest of the
    modules its names come from, following the test suite's own helpers into their code."""
    seen = set() if seen is None else seen
    function = getattr(function, "__wrapped__", function)
    code = getattr(function, "__code__", None)
    if code is None or id(code) in seen:
        return "pure"
    seen.add(id(code))
    namespace = getattr(function, "__globals__", {})
    found = []
    for name in _names(code):
        if name not in namespace:
            continue
        found.append(_of_value(namespace[name], seen))
    return highest(found)


def _of_value(value: Any, seen: set[int]) -> str:
    origin = _origin(value)
    if origin is None:
        return "pure"
    tier = of_module_name(origin)
    if tier is not None:
        return tier
    if origin == "tests" or origin.startswith("tests."):
        if isinstance(value, types.FunctionType):
            return of_function(value, seen)
        if isinstance(value, type):  # a helper class: what its methods call
            methods = [m for m in vars(value).values() if isinstance(m, types.FunctionType)]
            return highest(of_function(m, seen) for m in methods)
    return "pure"


def of_test(function: Any, fixtures: Mapping[str, Iterable[Any]]) -> str:
    """A test's tier: the highest of what its code calls and of what its fixtures (name to the
    fixture functions that provide it) start or call."""
    found = [of_function(function)]
    for name, providers in fixtures.items():
        found.append(FIXTURES.get(name, "pure"))
        found.extend(of_function(provider) for provider in providers)
    return highest(found)
