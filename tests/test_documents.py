"""The strict YAML and JSON reader (netmon.documents): a key given twice is refused with both lines,
never "the last one wins"; merge keys keep their meaning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from netmon import documents
from netmon.errors import describe_yaml_error
from netmon.sim.node import SimulationError, load_node_file
from netmon.sweep.locate import fabric_file


def refusal(text: str) -> str:
    with pytest.raises(documents.DuplicateKeyError) as caught:
        documents.load(text)
    return describe_yaml_error(caught.value)


def test_a_key_twice_names_the_key_and_both_lines() -> None:
    text = "listen: 127.0.0.1:19464\nbackend: gloo\nranks: 2\nlisten: 0.0.0.0:19464\n"
    assert yaml.safe_load(text)["listen"] == "0.0.0.0:19464"  # what PyYAML alone does
    message = refusal(text)
    assert message == ("not valid YAML: duplicate key 'listen' at lines 1 and 4; keep one of them")


def test_a_second_empty_section_is_refused_not_read_as_none() -> None:
    text = "basic_auth_users:\n  prometheus: $2b$12$x\ntls_server_config: {}\nbasic_auth_users:\n"
    assert "duplicate key 'basic_auth_users' at lines 1 and 4" in refusal(text)


def test_nested_flow_and_equal_valued_keys_are_refused() -> None:
    assert "duplicate key 'interval' at lines 3 and 4" in refusal(
        "probes:\n  - name: a\n    interval: 1s\n    interval: 2s\n"
    )
    assert "duplicate key 'a' at lines 1 and 1" in refusal("{a: 1, b: 2, a: 1}")
    # Keys are compared as YAML reads them: 1 and 0x1 are the same integer key.
    assert "duplicate key 1 at lines 1 and 2" in refusal("1: a\n0x1: b\n")


def test_merge_keys_keep_their_meaning() -> None:
    text = "base: &base {iters: 3, warmup: 1}\nprobe:\n  <<: *base\n  iters: 5\n"
    assert documents.load(text) == {
        "base": {"iters": 3, "warmup": 1},
        "probe": {"iters": 5, "warmup": 1},  # a key beside a merge overrides it, as in YAML
    }
    assert "duplicate key 'iters'" in refusal(
        "base: &base {iters: 3}\nprobe:\n  <<: *base\n  iters: 5\n  iters: 6\n"
    )


def test_documents_without_duplicates_read_as_safe_load_reads_them() -> None:
    text = "a: [1, {b: 2}]\nc: !!str 3\nd: null\ne: {f: {g: yes}}\n"
    assert documents.load(text) == yaml.safe_load(text)
    with pytest.raises(yaml.YAMLError):
        documents.load("a: !!python/object:os.system x\n")  # still safe tags only


def test_a_json_object_with_a_key_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="duplicate key 'gpus'"):
        json.loads('{"gpus": [], "x": 1, "gpus": [1]}', object_pairs_hook=documents.unique_keys)
    assert json.loads('{"a": {"b": 1}}', object_pairs_hook=documents.unique_keys) == {"a": {"b": 1}}


def test_a_fabric_file_with_a_leaf_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fabric.yaml"
    path.write_text(
        "routing: table\nleaves:\n"
        "  su1: {rail: 0, nodes: 'n[01-02]', spines: s1}\n"
        "  su1: {rail: 0, nodes: 'n[03-04]', spines: s1}\n"
    )
    with pytest.raises(ValueError) as caught:
        fabric_file.load(path, rails=1)  # the sweep says "sweep.fabric: " and this line
    assert str(caught.value) == (
        f"{path}: not valid YAML: duplicate key 'su1' at lines 3 and 4; keep one of them"
    )


def test_a_simulated_node_file_with_a_key_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    path.write_text('{"gpus": [], "gpus": []}')
    with pytest.raises(SimulationError, match=r"not JSON: duplicate key 'gpus'; keep one of them"):
        load_node_file(path)
