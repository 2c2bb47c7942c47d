"""Upper bounds on every size in netmon.yaml: a typo such as `sizes: [1T]` (for 1G) is refused in
one line naming the field and the bound, by the loader and by the schema the Helm chart checks
`config` with, instead of a probe that OOM-kills its ranks or the node."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from netmon.bandwidth import MAX_MEMORY_SIZE, MAX_PROBE_SIZE, bounded_size
from netmon.config import json_schema, load_config, parse_config
from netmon.errors import ConfigError

PROBE = {"name": "small", "op": "all_reduce", "interval": 60}


def _probes(sizes: Any) -> dict[str, Any]:
    return {"backend": "gloo", "probes": [{**PROBE, "sizes": sizes}]}


# (document, the field the message names, the bound it names)
TOO_LARGE = [
    (_probes(["1T"]), "probes[0].sizes", "16G"),
    (_probes([8, 17 << 30]), "probes[0].sizes", "16G"),
    (_probes("8,32G"), "probes[0].sizes", "16G"),
    # A sweep is bounded before it is made: {max: 1T} is no list of 28 sizes.
    (_probes({"min": 8, "max": "1T"}), "probes[0].sizes", "16G"),
    ({"idle": {"max_memory_used": "2T"}}, "idle.max_memory_used", "1T"),
    ({"idle": {"max_memory_used": 2 << 40}}, "idle.max_memory_used", str(MAX_MEMORY_SIZE)),
    ({"baseline": {"latency_bound_below": "64G"}}, "baseline.latency_bound_below", "16G"),
    ({"sweep": {"size": "1T"}}, "sweep.size", "16G"),
    ({"sweep": {"nccl_size": 32 << 30}}, "sweep.nccl_size", str(MAX_PROBE_SIZE)),
]


@pytest.mark.parametrize(("document", "field", "bound"), TOO_LARGE)
def test_a_size_above_its_bound_is_one_line_naming_the_field_and_the_bound(
    document: dict[str, Any], field: str, bound: str, tmp_path: Path
) -> None:
    path = tmp_path / "netmon.yaml"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    message = str(caught.value)
    assert "\n" not in message
    assert field in message and bound in message, message


@pytest.mark.parametrize(
    "document",
    [
        _probes(["16G"]),
        _probes({"min": 8, "max": "16G"}),
        {"idle": {"max_memory_used": "1T"}},
        {"baseline": {"latency_bound_below": "16G"}},
        {"sweep": {"size": "16G", "nccl_size": 16 << 30}},
    ],
)
def test_a_size_at_its_bound_is_accepted(document: dict[str, Any]) -> None:
    parse_config(document)


def test_the_bound_says_what_it_bounds() -> None:
    assert bounded_size("16G", MAX_PROBE_SIZE, "a probe moves") == 16 << 30
    with pytest.raises(ValueError, match=r"'16385M' is more than 16G, the most a probe moves"):
        bounded_size("16385M", MAX_PROBE_SIZE, "a probe moves")


@pytest.mark.parametrize(
    "document",
    [
        _probes([8, 17 << 30]),
        {"idle": {"max_memory_used": 2 << 40}},
        {"baseline": {"latency_bound_below": 32 << 30}},
        {"sweep": {"nccl_size": 32 << 30}},
    ],
)
def test_the_schema_refuses_a_number_above_its_bound(document: dict[str, Any]) -> None:
    """The schema (the Helm chart's `config`, editors) bounds every size given as a number; one
    given as text ("1T") it checks the spelling of only, and the daemon refuses it."""
    validator = jsonschema.Draft202012Validator(json_schema())
    assert list(validator.iter_errors(document)), document
    assert not list(validator.iter_errors(_probes([8, 16 << 30])))
