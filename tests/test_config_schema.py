"""netmon.yaml's JSON schema (netmon.config.json_schema) takes what the daemon takes and refuses
the keys it refuses: its text patterns are the parsers' own, every configuration the docs show
passes both, and a misspelt key anywhere fails both. The Helm chart validates `config` with it
(tests/test_helm_values.py renders one)."""

from __future__ import annotations

import copy
import itertools
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from netmon.bandwidth import (
    DURATION_PATTERN,
    RATE_PATTERN,
    SIZE_PATTERN,
    parse_duration,
    parse_rate,
    parse_size,
)
from netmon.config import json_schema, parse_config
from netmon.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json_schema()
VALIDATOR = jsonschema.Draft7Validator(SCHEMA)

NUMBERS = ["0", "8", "64", "1.5", "007", "1.", ".5", "1e9", "2E3", "-1", "", " "]
SUFFIXES = ["", "K", "k", "M", "G", "T", "P", "B", "iB", "KiB", "KB", "kb", "B/s", "GB/s",
            "ms", "MS", "s", "m", "h", "d", "sec", "x"]  # fmt: skip
SPACES = ["", " "]


def texts() -> Iterator[str]:
    for number, space, suffix, tail in itertools.product(NUMBERS, SPACES, SUFFIXES, SPACES):
        yield f"{space}{number}{space}{suffix}{tail}"


def accepts(parse: Callable[[str], object], text: str) -> bool:
    try:
        parse(text)
    except (ValueError, OverflowError):
        return False
    return True


@pytest.mark.parametrize(
    ("pattern", "parse"),
    [(SIZE_PATTERN, parse_size), (RATE_PATTERN, parse_rate), (DURATION_PATTERN, parse_duration)],
    ids=["size", "rate", "duration"],
)
def test_a_text_matches_the_schema_pattern_when_its_parser_reads_its_form(
    pattern: str, parse: Callable[[str], object]
) -> None:
    """The parser may still refuse a value of the right form (a bare rate under 1 MB/s, a
    negative result): the pattern is about form only, so a match never refuses a valid text."""
    checker = jsonschema.Draft7Validator({"type": "string", "pattern": pattern})
    wrong = [text for text in texts() if accepts(parse, text) and not checker.is_valid(text)]
    assert wrong == []
    matched = [text for text in texts() if checker.is_valid(text)]
    assert len(matched) > 40  # the sample has forms of each kind, not only refusals


def doc_configs() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every netmon.yaml the repository shows: the example file, the chart's default `config`,
    and the docs' YAML blocks that the daemon takes."""
    yield (
        "deploy/netmon.example.yaml",
        yaml.safe_load((ROOT / "deploy/netmon.example.yaml").read_text()),
    )
    values = yaml.safe_load((ROOT / "deploy/helm/netmon/values.yaml").read_text())
    yield "values.yaml config", values["config"]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for number, block in enumerate(re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)):
            try:
                document = yaml.safe_load(block)
                parse_config(document)
            except (yaml.YAMLError, ConfigError, TypeError, AttributeError):
                continue  # not a netmon.yaml (a values file, a rule, a manifest)
            yield f"{page.name} block {number}", document


DOCS = list(doc_configs())

# Each way a parsed field may be written, in one configuration the daemon takes.
TEXT_FORMS: dict[str, Any] = {
    "ranks": 2,
    "devices": "0,1",
    "rank_wrapper": "numactl --cpunodebind={numa}",
    "link_telemetry": {"interval": "30s"},
    "idle": {"max_memory_used": "1G"},
    "baseline": {"latency_bound_below": "1M"},
    "probes": [
        {"name": "a", "sizes": "8,1K", "interval": "1m", "jitter": "5s", "timeout": "2m",
         "min_busbw": "1.5G", "devices": [0, "GPU-1"], "paths": "default"},
        {"name": "b", "sizes": {"min": 8, "max": "64K", "factor": 4}, "interval": 30},
        {"name": "c", "sizes": [8, "1K", "64KiB"], "devices": 0, "min_busbw": "150GB/s"},
        {"name": "d", "sizes": 1024},
    ],
}  # fmt: skip


def test_the_docs_show_several_configurations_to_check() -> None:
    assert len(DOCS) >= 4, [name for name, _ in DOCS]


@pytest.mark.parametrize(("name", "document"), [*DOCS, ("text forms", TEXT_FORMS)])
def test_a_configuration_the_daemon_takes_passes_the_schema(
    name: str, document: dict[str, Any]
) -> None:
    parse_config(document, name)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in VALIDATOR.iter_errors(document)]
    assert errors == []


def mappings(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every mapping in a document, itself included."""
    if isinstance(node, dict):
        yield path
        for key, value in node.items():
            yield from mappings(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from mappings(value, (*path, index))


def with_typo(document: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    out = copy.deepcopy(document)
    node = out
    for key in path:
        node = node[key]
    node["intervl"] = 60
    return out


FULL = {**TEXT_FORMS, "inspector": {"dir": "/var/lib/netmon-inspector", "window": "2m"}}


def every_error(document: Any) -> Iterator[jsonschema.ValidationError]:
    """The schema's errors with those under each failed anyOf (where a typo's error sits)."""
    stack = list(VALIDATOR.iter_errors(document))
    while stack:
        error = stack.pop()
        yield error
        stack.extend(error.context or ())


@pytest.mark.parametrize("path", list(mappings(FULL)), ids=str)
def test_a_misspelt_key_at_any_depth_fails_the_daemon_and_the_schema(
    path: tuple[Any, ...],
) -> None:
    document = with_typo(FULL, path)
    with pytest.raises(ConfigError, match="intervl"):
        parse_config(document)
    messages = [e.message for e in every_error(document)]
    assert any("'intervl' was unexpected" in m for m in messages), messages


@pytest.mark.parametrize(
    ("document", "where"),
    [
        ({"probes": [{"name": "a", "sizes": [8], "interval": "soon"}]}, "interval"),
        ({"probes": [{"name": "a", "sizes": [8], "interval": -5}]}, "interval"),
        ({"probes": [{"name": "a", "sizes": ["8X"]}]}, "sizes"),
        ({"probes": [{"name": "a", "sizes": [8], "op": "allreduce"}]}, "op"),
        ({"idle": {"max_memory_used": "lots"}}, "max_memory_used"),
        ({"backend": "mpi"}, "backend"),
        ({"inspector": {"dir": "/var/lib/x", "interval": 0.5}}, "interval"),
    ],
)
def test_a_wrong_value_fails_the_daemon_and_the_schema(
    document: dict[str, Any], where: str
) -> None:
    with pytest.raises(ConfigError, match=where):
        parse_config(document)
    found = [list(e.absolute_path) for e in every_error(document)]
    assert any(where in path for path in found), found


def test_check_config_prints_the_schema() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "netmon", "check-config", "--schema"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(done.stdout) == SCHEMA
    assert "$defs" not in done.stdout and "$ref" not in done.stdout  # self-contained


def test_the_charts_config_node_is_this_schema() -> None:
    values_schema = json.loads((ROOT / "deploy/helm/netmon/values.schema.json").read_text())
    node = values_schema["properties"]["config"]
    assert node["additionalProperties"] is False
    assert set(node["properties"]) == set(SCHEMA["properties"])
    assert node["examples"], "the chart's walk renders the config node's examples"
