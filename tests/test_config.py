"""The configuration contract: the documented file, NETMON_ overrides, the embedded default, and
one-line errors naming the field, through `netmon check-config`/`serve` and through load_config."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netmon.baseline import BaselinePolicy
from netmon.config import (
    LoggingConfig,
    NetmonConfig,
    ProbeConfig,
    dump,
    load_config,
    parse_config,
    resolve,
)
from netmon.errors import ConfigError, CouldNotRun
from netmon.gpu.idle_policy import IdlePolicy

# Verbatim from the docs: this file must keep being accepted exactly as written.
CONTRACT = """\
listen: 127.0.0.1:19464
state_dir: /var/lib/netmon
backend: gloo          # nccl | gloo; default: nccl where GPUs are present
ranks: 2               # gloo only: the number of CPU ranks
pause_file: /run/netmon/pause
probes:
  - name: small
    op: all_reduce
    sizes: [8, 1K, 64K]
    interval: 60s
  - name: large
    op: all_reduce
    sizes: [256M]
    interval: 15m
    min_busbw: 1G
"""

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def write(tmp_path: Path, text: str, name: str = "netmon.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def netmon(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as users run it; only the NETMON_ variables given here reach it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NETMON_")}
    return subprocess.run(
        [sys.executable, "-m", "netmon", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**clean, **(env or {})},
        check=False,
    )


def assert_usage_error(proc: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    for text in expected:
        assert text in lines[0]
    return lines[0]


# --- the documented file


def test_the_documented_file_is_accepted_as_written(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, CONTRACT), environ={})

    assert config.listen == "127.0.0.1:19464"
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 19464)
    assert config.state_dir == Path("/var/lib/netmon")
    assert config.backend == "gloo"
    assert config.ranks == 2
    assert config.pause_file == Path("/run/netmon/pause")
    assert config.probes is not None
    small, large = config.probes
    assert (small.name, small.op, small.interval, small.min_busbw) == (
        "small",
        "all_reduce",
        60.0,
        None,
    )
    assert small.sizes == (8, KIB, 64 * KIB)  # binary: 1K = 1024
    assert (large.name, large.op, large.interval) == ("large", "all_reduce", 900.0)
    assert large.sizes == (256 * MIB,)
    assert large.min_busbw == 1e9  # rates are decimal, as nccl-tests' GB/s
    # What the file leaves out keeps its documented default.
    assert small.effective_jitter == 6.0
    assert small.timeout == 300.0 and small.paths == ("default",)
    assert config.idle == IdlePolicy() and config.baseline == BaselinePolicy()
    assert config.logging == LoggingConfig()
    # Nothing here depends on the machine: resolve() keeps every value the file gave.
    assert resolve(config, gpus=8) == config


def test_check_config_prints_the_effective_configuration(tmp_path: Path) -> None:
    path = write(tmp_path, CONTRACT)
    proc = netmon("check-config", str(path))

    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "is valid" in proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert printed["backend"] == "gloo" and printed["ranks"] == 2
    assert [p["name"] for p in printed["probes"]] == ["small", "large"]
    assert printed["probes"][0]["sizes"] == [8, 1024, 65536]
    assert printed["probes"][1]["interval"] == 900.0
    assert printed["probes"][1]["min_busbw"] == 1e9
    assert printed["idle"]["samples"] == 3
    # The printed configuration is itself a valid one, and means the same.
    assert parse_config(printed) == load_config(path, environ={})


def test_the_default_port_is_19464_and_the_old_9464_still_loads(tmp_path: Path) -> None:
    # 9464 was the default before; it is also the OpenTelemetry Prometheus exporter's
    # (docs/DEPLOY.md, "The port"). Files that name it keep working.
    default = load_config(None, environ={})
    assert default.listen == NetmonConfig().listen == "127.0.0.1:19464"
    assert (default.listen_host, default.listen_port) == ("127.0.0.1", 19464)

    old = load_config(write(tmp_path, "listen: 0.0.0.0:9464\n"), environ={})
    assert old.listen == "0.0.0.0:9464"
    assert (old.listen_host, old.listen_port) == ("0.0.0.0", 9464)


# --- NETMON_ overrides


def test_environment_overrides_beat_the_file(tmp_path: Path) -> None:
    environ = {
        "NETMON_LISTEN": "0.0.0.0:9500",
        "NETMON_PROBES__0__INTERVAL": "30s",
        "NETMON_IDLE__SAMPLES": "5",
        "NETMON_LOGGING__FORMAT": "json",
        # Not settings: the CLI's own variable, a test tag, and anything not prefixed.
        "NETMON_CONFIG": "/elsewhere.yaml",
        "NETMON_TEST_TAG": "abc",
        "LISTEN": "1.2.3.4:1",
    }
    config = load_config(write(tmp_path, CONTRACT), environ=environ)

    assert config.listen == "0.0.0.0:9500"
    assert config.probes is not None
    assert config.probes[0].interval == 30.0
    assert config.probes[1].interval == 900.0  # untouched
    assert config.idle.samples == 5
    assert config.idle.sample_interval == IdlePolicy().sample_interval
    assert config.logging.format == "json"
    assert config.logging.level == "info"


def test_environment_overrides_apply_without_a_file() -> None:
    config = load_config(None, environ={"NETMON_BACKEND": "gloo", "NETMON_RANKS": "4"})
    assert (config.backend, config.ranks) == ("gloo", 4)


def test_an_environment_override_is_validated_and_named() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, environ={"NETMON_IDLE__SAMPLES": "0"})
    message = str(caught.value)
    assert "environment" in message and "idle.samples" in message and "\n" not in message


def test_an_override_of_a_missing_list_item_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="NETMON_PROBES__7__INTERVAL: no list item 7"):
        load_config(write(tmp_path, CONTRACT), environ={"NETMON_PROBES__7__INTERVAL": "1s"})


def test_an_index_into_the_embedded_default_probes_says_how_to_set_them() -> None:
    with pytest.raises(ConfigError, match="NETMON_PROBES__0__INTERVAL: probes is not set") as e:
        load_config(None, environ={"NETMON_PROBES__0__INTERVAL": "5s"})
    assert "give the whole list as YAML in NETMON_PROBES" in str(e.value)
    whole = load_config(None, environ={"NETMON_PROBES": "[{name: a, sizes: [8], interval: 5s}]"})
    assert [(p.name, p.interval) for p in whole.probes or ()] == [("a", 5.0)]


# --- the embedded default


def test_embedded_default_on_a_cpu_node() -> None:
    config = resolve(load_config(None, environ={}), gpus=0)

    assert config.backend == "gloo"
    assert config.ranks == 2
    assert config.probes is not None
    assert [p.name for p in config.probes] == ["small", "large"]
    assert all(p.op == "all_reduce" for p in config.probes)
    assert [p.interval for p in config.probes] == [60.0, 900.0]
    assert config.state_dir is not None


def test_embedded_default_on_an_eight_gpu_node() -> None:
    config = resolve(load_config(None, environ={}), gpus=8)

    assert config.backend == "nccl"
    assert config.devices == tuple(str(i) for i in range(8))
    assert config.probes is not None
    small, large = config.probes
    assert (small.name, small.interval) == ("small", 60.0)
    assert (min(small.sizes), max(small.sizes)) == (8, 64 * MIB)
    assert (large.name, large.interval) == ("large", 900.0)
    assert (min(large.sizes), max(large.sizes)) == (256 * MIB, GIB)
    assert list(small.sizes) == sorted(small.sizes) and list(large.sizes) == sorted(large.sizes)
    # Issue 33: a bandwidth-bound size, judged, every minute; the rest of small is latency,
    # judged on GPUs too (issue 45: baseline.latency_ratio 0.6).
    policy = config.baseline.for_ranks(config.backend)
    bandwidth = [size for size in small.sizes if not policy.latency_bound(size)]
    assert bandwidth == [64 * MIB]
    assert max(s for s in small.sizes if s not in bandwidth) == 64 * KIB
    assert all(policy.judges(size) for size in small.sizes)


def test_the_cpu_default_judges_its_large_probe_only() -> None:
    # On CPU ranks the every-minute probe stays latency only (docs/BENCHMARKS.md, "Duty cycle").
    config = resolve(load_config(None, environ={}), gpus=0)
    assert config.probes is not None
    small, large = config.probes
    policy = config.baseline.for_ranks(config.backend)
    assert not any(policy.judges(size) for size in small.sizes)
    assert all(policy.judges(size) for size in large.sizes)


def test_nccl_without_gpus_is_refused_unless_devices_are_given() -> None:
    # Could not run here (exit 3), not a bad file: the same file is right on a GPU node.
    with pytest.raises(CouldNotRun, match="backend: nccl needs GPUs"):
        resolve(load_config(None, environ={"NETMON_BACKEND": "nccl"}), gpus=0)
    given = load_config(None, environ={"NETMON_BACKEND": "nccl", "NETMON_DEVICES": "0,1"})
    assert resolve(given, gpus=0).devices == ("0", "1")


def test_check_config_without_a_file_prints_the_embedded_default() -> None:
    # NETMON_BACKEND=gloo: the check then needs no NVML, whatever this machine has.
    proc = netmon("check-config", env={"NETMON_BACKEND": "gloo"})

    assert proc.returncode == 0, proc.stderr
    assert "embedded default is valid" in proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert (printed["backend"], printed["ranks"]) == ("gloo", 2)
    assert [p["name"] for p in printed["probes"]] == ["small", "large"]


# --- errors: one line, exit status 2, the field named


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "probes: [{name: a, sizes: [8], interval: soon}]",
            ["probes[0].interval", "'soon'", "15m"],
        ),
        (
            "probes: [{name: a, sizes: [8]}, {name: b, sizes: [8], min_busbw: fast}]",
            ["probes[1].min_busbw", "'fast'", "1.5G"],
        ),
        ("listen: nope", ["listen:", "HOST:PORT"]),
        ("listen: 127.0.0.1:99999", ["listen:", "HOST:PORT"]),
        (
            "probes: [{name: a, sizes: [8], intervall: 5}]",
            ["probes[0].intervall: unknown setting", "accepted:", "interval", "min_busbw"],
        ),
        ("lisen: 127.0.0.1:1", ["lisen: unknown setting", "accepted: listen, state_dir"]),
        ("idle: {samples: 0}", ["idle.samples", "greater than or equal to 1"]),
        (
            "probes: [{name: a, sizes: [8], min_busbw: 150}]",
            ["probes[0].min_busbw", "did you mean 150G?"],
        ),
        ("inspector: {dir: relative/x}", ["inspector.dir: must be a directory below one of"]),
        ("inspector: {dir: /, interval: 5}", ["inspector.dir: must be a directory below", "'/'"]),
        ("inspector: {dir: /var/lib/x, window: 10s}", ["inspector: window (10 s) must be >="]),
        ("inspector: {dir: /tmp/x, intervl: 5}", ["inspector.intervl: unknown", "interval"]),
        ("inspector: {dir: /tmp/x, max_shapes: 0}", ["inspector.max_shapes"]),
        ("inspector: {dir: /tmp/x, max_read_bytes: 100G}", ["inspector.max_read_bytes"]),
        ("baseline: {trigger: 9}", ["baseline", "trigger (9) must be <= of (5)"]),
        ("baseline: {trigger: 2, of: 5}", ["baseline", "more than half"]),
        (
            "probes: [{name: a, sizes: [8]}, {name: a, sizes: [16]}]",
            ["probe names must be unique", "repeated: a"],
        ),
        ("listen: [a", ["line 1", "not valid YAML"]),
        ("a: 1\n  b: 2", ["line 2", "not valid YAML"]),
        ("- listen: 127.0.0.1:1", ["top level must be a mapping"]),
        ("just words", ["top level must be a mapping"]),
        ("probes: [{name: Big, sizes: [8]}]", ["probes[0].name", "lowercase"]),
        ('probes: [{name: "a\\n", sizes: [8]}]', ["probes[0].name"]),
        ("probes: [{name: a, sizes: []}]", ["probes[0].sizes", "one or more sizes"]),
        ("probes: [{name: a, sizes: [1.5]}]", ["probes[0].sizes", "whole number"]),
        ("probes: [{name: a, sizes: {min: 8}}]", ["probes[0].sizes", "a sweep is"]),
        ("probes: [{name: a, sizes: {min: 8, max: 1K, factor: 1}}]", ["factor"]),
        ("probes: [{name: a, sizes: {min: 8, max: 1K, factor: [2]}}]", ["probes[0].sizes"]),
        ("probes: [{name: a, sizes: {min: 8, max: 1K, factor: .inf}}]", ["probes[0].sizes"]),
        ("probes: [{name: a, sizes: [8], interval: 0}]", ["probes[0].interval"]),
        ("probes: [{name: a, sizes: [8], interval: -1}]", ["probes[0].interval"]),
        ("probes: [{name: a, sizes: [8], op: all_reduc}]", ["probes[0].op"]),
        (
            "probes: [{name: a, sizes: [8], op: all_gather, paths: [default, tree]}]",
            ["probes[0].paths: tree cannot run all_gather", "use default, pcie, ring or nvls"],
        ),
        (
            "probes: [{name: a, sizes: [8], op: broadcast, paths: 'pcie,nvls'}]",
            ["probes[0].paths: nvls cannot run broadcast", "all_reduce, all_gather and reduce"],
        ),
        (
            "probes: [{name: a, sizes: [8], op: sendrecv, paths: [ring]}]",
            ["probes[0].paths: ring does not apply to sendrecv", "use default or pcie"],
        ),
        ("probes: [{name: a, sizes: [8], devices: [[0]]}]", ["probes[0].devices"]),
        ("devices: []", ["devices", "one or more GPU"]),
        ("backend: mpi", ["backend", "'nccl' or 'gloo'"]),
        ("ranks: 100", ["ranks", "less than or equal to 64"]),
        ("logging: {format: xml}", ["logging.format"]),
        ("idle: {max_memory_used: lots}", ["idle.max_memory_used", "'lots'"]),
        ("probes: 5", ["probes"]),
        ("when: 2001-13-01", ["not valid YAML"]),
        ("[" * 600 + "]" * 600, ["not valid YAML", "nested too deeply"]),
        (f'probes: [{{name: a, sizes: ["{"9" * 400}K"]}}]', ["probes[0].sizes", "too large"]),
        (f"probes: [{{name: a, sizes: [8], min_busbw: {'9' * 400}}}]", ["probes[0].min_busbw"]),
    ],
)
def test_a_bad_file_is_one_line_naming_the_field(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    for part in expected:
        assert part in message


def test_path_variants_the_op_can_run_are_accepted(tmp_path: Path) -> None:
    text = (
        "probes:\n"
        "  - {name: ar, sizes: [8], paths: [default, pcie, ring, tree, nvls]}\n"
        "  - {name: ag, sizes: [8], op: all_gather, paths: [default, nvls]}\n"
        "  - {name: sr, sizes: [8], op: sendrecv, paths: [default, pcie]}\n"
    )
    config = load_config(write(tmp_path, text), environ={})
    assert [p.paths for p in config.probes or ()] == [
        ("default", "pcie", "ring", "tree", "nvls"),
        ("default", "nvls"),
        ("default", "pcie"),
    ]


def test_an_override_that_makes_a_path_unrunnable_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "probes: [{name: a, sizes: [8], paths: [default, tree]}]")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={"NETMON_PROBES__0__OP": "reduce_scatter"})
    assert "probes[0].paths: tree cannot run reduce_scatter" in str(caught.value)


def test_check_config_reports_a_bad_interval_in_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, CONTRACT.replace("interval: 60s", "interval: 60 seconds"))
    line = assert_usage_error(netmon("check-config", str(path)), "probes[0].interval")
    assert line.startswith(f"netmon: {path}: ")


def test_check_config_names_the_yaml_line(tmp_path: Path) -> None:
    path = write(tmp_path, CONTRACT.replace("sizes: [256M]", "sizes: [256M"))
    assert_usage_error(netmon("check-config", str(path)), "line 14", "not valid YAML")


def test_check_config_on_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    assert_usage_error(netmon("check-config", str(path)), str(path), "cannot read")


@pytest.mark.parametrize("kind", ["missing", "directory", "not_utf8"])
def test_an_unreadable_file_is_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "netmon.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "not_utf8":
        path.write_bytes(b"listen: \xff\xfe\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message


def test_serve_with_a_bad_configuration_exits_2_before_starting(tmp_path: Path) -> None:
    path = write(tmp_path, CONTRACT.replace("min_busbw: 1G", "min_busbw: fast"))
    assert_usage_error(netmon("serve", "--config", str(path)), "probes[1].min_busbw", "'fast'")


# --- property: any document is a configuration or one ConfigError line, never a crash

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([2**63, -(2**63), 10**400])
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(
        [
            "8",
            "1K",
            "64K",
            "256M",
            "1G",
            "9" * 40 + "K",
            "15m",
            "60s",
            "500ms",
            "1.5G",
            "0",
            "-1",
            "1e400",
            "nan",
            "127.0.0.1:19464",
            "[::1]:0",
            "gloo",
            "nccl",
            "all_reduce",
            "json",
            "small",
            "0,1",
        ]
    )
)
_FIELDS = sorted(
    set(NetmonConfig.model_fields)
    | set(ProbeConfig.model_fields)
    | set(IdlePolicy.model_fields)
    | set(BaselinePolicy.model_fields)
    | set(LoggingConfig.model_fields)
    | {"min", "max", "factor"}
)
_KEYS = st.sampled_from(_FIELDS) | st.text(max_size=8)
_VALUES = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_KEYS, children, max_size=4),
    max_leaves=12,
)


def _section(model: type[Any]) -> st.SearchStrategy[Any]:
    """Mostly-right mappings for a model: its own keys, sometimes a stranger, random values."""
    keys = st.sampled_from(sorted(model.model_fields)) | st.text(max_size=8)
    return st.dictionaries(keys, _VALUES, max_size=5) | _VALUES


_PROBE = st.fixed_dictionaries(
    {"name": st.sampled_from(["small", "large", "x"]) | _SCALARS, "sizes": _VALUES},
    optional={name: _VALUES for name in ProbeConfig.model_fields if name not in ("name", "sizes")},
)
_DOCUMENTS = st.fixed_dictionaries(
    {},
    optional={
        **{name: _VALUES for name in NetmonConfig.model_fields},
        "probes": st.lists(_PROBE | _VALUES, max_size=3) | _VALUES,
        "idle": _section(IdlePolicy),
        "baseline": _section(BaselinePolicy),
        "logging": _section(LoggingConfig),
    },
) | st.dictionaries(_KEYS, _VALUES, max_size=4)


def _one_line_or_config(call: Any) -> None:
    try:
        result = call()
    except ConfigError as exc:
        message = str(exc)
        assert message and "\n" not in message, message
    else:
        assert isinstance(result, NetmonConfig)


@settings(max_examples=100, deadline=None)
@given(document=_DOCUMENTS)
def test_any_document_parses_or_fails_in_one_line(document: dict[str, Any]) -> None:
    _one_line_or_config(lambda: parse_config(document))


_ENV_NAMES = st.sampled_from(
    [
        "NETMON_LISTEN",
        "NETMON_RANKS",
        "NETMON_DEVICES",
        "NETMON_PROBES",
        "NETMON_PROBES__0__INTERVAL",
        "NETMON_PROBES__0__SIZES",
        "NETMON_PROBES__1__SIZES__FACTOR",
        "NETMON_PROBES__X",
        "NETMON_IDLE__SAMPLES",
        "NETMON_IDLE",
        "NETMON_LISTEN__PORT",
        "NETMON_BASELINE__TRIGGER",
        "NETMON_LOGGING__FORMAT",
        "NETMON_",
        "NETMON_CONFIG",
    ]
)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.one_of(
        st.text(max_size=60),
        _DOCUMENTS.map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
        st.just(CONTRACT),
    ),
    environ=st.dictionaries(_ENV_NAMES, st.text(max_size=12) | _SCALARS.map(str), max_size=3),
)
def test_any_file_and_environment_load_or_fail_in_one_line(
    tmp_path: Path, text: str, environ: dict[str, str]
) -> None:
    # One file, rewritten per example: tmp_path is shared by all of them, which is fine here.
    path = write(tmp_path, text)
    _one_line_or_config(lambda: load_config(path, environ=environ))


def test_dump_of_any_valid_configuration_parses_back(tmp_path: Path) -> None:
    config = resolve(load_config(write(tmp_path, CONTRACT), environ={}), gpus=0)
    assert parse_config(yaml.safe_load(dump(config))) == config


def test_gpus_idle_is_for_local_collectives_and_telemetry_takes_durations() -> None:
    base = {"name": "p", "sizes": [8]}
    config = parse_config({"probes": [{**base, "gpus": "idle", "min_gpus": 4}]})
    assert config.probes is not None and config.probes[0].min_gpus == 4
    with pytest.raises(ConfigError, match=r"probes\[0\]\.gpus: idle is for local collectives"):
        parse_config({"probes": [{**base, "kind": "pairs", "gpus": "idle"}]})
    with pytest.raises(ConfigError, match=r"probes\[0\]\.min_gpus"):
        parse_config({"probes": [{**base, "min_gpus": 0}]})
    telemetry = parse_config({"link_telemetry": {"interval": "2m", "nvlink_detail": "link"}})
    assert telemetry.link_telemetry.interval == 120.0
    with pytest.raises(ConfigError, match=r"link_telemetry\.nvlink_detail"):
        parse_config({"link_telemetry": {"nvlink_detail": "lane"}})


def test_a_netmon_variable_like_a_misspelt_setting_is_warned_about_not_ignored_silently(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="netmon.config")
    config = load_config(
        None, {"NETMON_LISTN": "127.0.0.1:1", "NETMON_CONFIG": "x.yaml", "NETMON_SWEEP_RANK": "3"}
    )
    assert config.listen == "127.0.0.1:19464"  # ignored, as before
    warned = [r.getMessage() for r in caplog.records]
    # NETMON_CONFIG and the sweep ranks' variables are other programs' own: no word about them.
    assert warned == ["NETMON_LISTN is not a setting and is ignored; did you mean NETMON_LISTEN?"]


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path: Path) -> None:
    # PyYAML alone keeps the last: this file used to listen on every address.
    path = write(tmp_path, "listen: 127.0.0.1:19464\nbackend: gloo\nlisten: 0.0.0.0:19464\n")
    expected = "duplicate key 'listen' at lines 1 and 3"
    line = assert_usage_error(netmon("check-config", str(path)), expected)
    assert line.startswith(f"netmon: {path}: ")
    assert_usage_error(netmon("serve", "--config", str(path)), expected)


def test_an_environment_mapping_with_a_key_twice_names_the_variable() -> None:
    environ = {"NETMON_IDLE": "{max_utilization: 5, max_utilization: 90}"}
    with pytest.raises(ConfigError) as caught:
        load_config(None, environ=environ)
    assert str(caught.value) == (
        "NETMON_IDLE: not valid YAML: duplicate key 'max_utilization' at lines 1 and 1; "
        "keep one of them"
    )


def test_check_config_lists_every_error_a_line_each_and_serve_names_the_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from netmon.cli.main import main

    path = tmp_path / "netmon.yaml"
    path.write_text(
        "listen: nowhere\nprobes:\n  - name: small\n    sizes: [8]\n    interval: soon\n"
        "    bogus: 1\n"
    )
    assert main(["check-config", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all(line.startswith(f"netmon: {path}: ") for line in lines), lines
    assert "listen:" in lines[0] and lines[0].endswith("[and 2 more]")
    assert "probes[0].interval:" in lines[1] and "probes[0].bogus: unknown setting" in lines[2]
    with pytest.raises(ConfigError) as refused:
        load_config(path, environ={})
    assert str(refused.value) == lines[0].removeprefix("netmon: ")  # the daemon: one line
    assert refused.value.others == tuple(line.removeprefix("netmon: ") for line in lines[1:])
