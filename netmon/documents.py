"""YAML and JSON documents read strictly: a key written twice in one mapping is an error naming the
key and both lines, never "the last one wins". Every file netmon reads as YAML goes through `load`.

PyYAML's safe_load keeps the last of two equal keys without a word, so a second, empty
`basic_auth_users:` in a web config turned authentication off, and a second `listen:` in
netmon.yaml opened the port wider than the first said. exporter-toolkit (Go, strict unmarshalling)
refuses both; so does netmon. Merge keys (`<<: *defaults`) keep their YAML meaning: a key written
beside a merge overrides the merged one, which is what a merge is for, not a duplicate.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, ScalarNode

_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.YAMLError):
    """A key given twice in one mapping. `problem` is the one-line message; no `problem_mark`, so
    errors.describe_yaml_error shows the message as it is (it already names both lines)."""

    def __init__(self, key: Any, first: int, second: int) -> None:
        self.problem = f"duplicate key {key!r} at lines {first} and {second}; keep one of them"
        self.problem_mark = None
        super().__init__(self.problem)


class StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping with a key given twice."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        _refuse_duplicates(self, node)
        return super().construct_mapping(node, deep=deep)


def _refuse_duplicates(constructor: SafeConstructor, node: MappingNode) -> None:
    # Only the keys written in this mapping are compared, before the merge keys are flattened
    # into it. Keys are compared as constructed, so `1` and `0x1`, or `yes` and `true`, collide as
    # they would in the dictionary; a key that is itself a mapping or a list is left to PyYAML.
    lines: dict[Any, int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE_TAG:
            continue
        key = constructor.construct_object(key_node)
        line = key_node.start_mark.line + 1
        try:
            first = lines.get(key)
        except TypeError:  # unhashable: PyYAML says so itself
            continue
        if first is not None:
            raise DuplicateKeyError(key, first, line)
        lines[key] = line


def load(text: str) -> Any:
    """The YAML document in `text` (safe tags only), DuplicateKeyError for a key given twice."""
    return yaml.load(text, Loader=StrictLoader)  # a SafeLoader: safe tags only


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object_pairs_hook: a JSON object with a key given twice is a ValueError."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}; keep one of them")
        result[key] = value
    return result
