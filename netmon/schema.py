"""The JSON schema of netmon.yaml: what a parsed field takes as text, and one self-contained tree.

netmon.yaml says "60s", "1G" and "8,1K" where the model holds seconds, bytes and lists: a field
whose before-validator parses text names that text here (`Field(json_schema_extra=...)`), so
the schema pydantic writes takes what the daemon takes. `self_contained` inlines its `$defs`
because a schema embedded in another (the Helm chart's values.schema.json) has no room for them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from netmon.bandwidth import DURATION_PATTERN, RATE_PATTERN, SIZE_PATTERN

JsonDict = dict[str, Any]
Widen = Callable[[JsonDict], None]

# What a field's schema keeps for itself when its types are widened: words, not types.
_ANNOTATIONS = ("title", "description", "default", "examples")


def _text(pattern: str) -> JsonDict:
    return {"type": "string", "pattern": pattern}


def _comma_list(pattern: str) -> str:
    """Items of `pattern` separated by commas, as the validators split them (empty parts too)."""
    item = pattern.removeprefix("^").removesuffix("$")
    return f"^(?:{item})?(?:,(?:{item})?)*$"


DURATION_TEXT = _text(DURATION_PATTERN)
SIZE_TEXT = _text(SIZE_PATTERN)
RATE_TEXT = _text(RATE_PATTERN)
SIZES_TEXT = _text(_comma_list(SIZE_PATTERN))
ANY_TEXT: JsonDict = {"type": "string"}
INTEGER: JsonDict = {"type": "integer"}
SIZE_SWEEP: JsonDict = {
    "type": "object",
    "properties": {"min": {}, "max": {}, "factor": {"type": "integer", "minimum": 2}},
    "required": ["min", "max"],
    "additionalProperties": False,
}
SIZE_SWEEP["properties"]["min"] = SIZE_SWEEP["properties"]["max"] = {
    "anyOf": [{"type": "integer", "minimum": 1}, SIZE_TEXT]
}


def also(*forms: JsonDict) -> Widen:
    """json_schema_extra for a field that also takes `forms`: its own schema stays the first
    choice, so its bounds and enums still hold for the values of its own type."""

    def widen(schema: JsonDict) -> None:
        own = {k: v for k, v in schema.items() if k not in _ANNOTATIONS}
        for key in own:
            del schema[key]
        schema["anyOf"] = [own, *(copy.deepcopy(form) for form in forms)]

    return widen


def items_also(*forms: JsonDict) -> Widen:
    """For a list field whose items may be given as `forms` too (sizes as [8, 1K])."""

    def widen(schema: JsonDict) -> None:
        for choice in [schema, *schema.get("anyOf", ())]:
            if choice.get("type") == "array":
                choice["items"] = {"anyOf": [choice["items"], *forms]}

    return widen


def both(*steps: Widen) -> Widen:
    def widen(schema: JsonDict) -> None:
        for step in steps:
            step(schema)

    return widen


def self_contained(schema: JsonDict) -> JsonDict:
    """`schema` with every `$ref` into its `$defs` replaced by the definition (no recursion in
    netmon's models, so the tree is finite)."""
    defs = schema.get("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return {**inline(defs[ref.removeprefix("#/$defs/")]), **inline(rest)}
            return {k: inline(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    out: JsonDict = inline(schema)
    return out
