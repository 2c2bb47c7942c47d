"""The pure part of node groups: members, self, leader and a round's world, from literals."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from netmon.group.members import GroupConfig, World, identify_self, lay_out, leader_of

A, B, C = "10.0.0.1:29400", "10.0.0.2:29400", "gpu-c:29400"


def config(**fields: Any) -> GroupConfig:
    return GroupConfig.model_validate(
        {"name": "rack-a", "members": [B, A, C], "secret_file": "/s", **fields}
    )


def test_each_members_ranks_follow_the_previous_members_in_member_order() -> None:
    world = lay_out([C, A, B], {A: 2, B: 1, C: 3})
    assert world.members == (A, B, C)
    assert world.ranks_of == {A: (0, 1), B: (2,), C: (3, 4, 5)}
    assert world.size == 6
    assert world.reporters == (0, 2, 3)  # one per member
    assert world.host == "10.0.0.1"  # rank 0's member


def test_rank_0_listens_on_the_address_its_member_reported() -> None:
    # gpu-c may resolve to 127.0.1.1 on its own node; the address it bound is what others use.
    world = lay_out([C, "zz:1"], {C: 1, "zz:1": 1}, {C: "192.168.1.7", "zz:1": "192.168.1.9"})
    assert world.host == "192.168.1.7"
    assert lay_out([C], {C: 1}, {C: ""}).host == "gpu-c"


def test_a_world_survives_its_json() -> None:
    world = lay_out([A, B], {A: 1, B: 2}, {A: "::1"})
    assert World.from_json(world.to_json()) == world


def test_the_lowest_named_reachable_member_leads() -> None:
    assert leader_of([C, B, A]) == A
    assert leader_of([]) is None


def test_self_is_the_member_whose_host_is_one_of_this_hosts_names() -> None:
    assert identify_self(config(), names=["gpu-c", "gpu-c.example"]) == C
    assert identify_self(config(self=B), names=["anything"]) == B
    with pytest.raises(ValueError, match=r"group\.self: cannot tell"):
        identify_self(config(), names=["elsewhere"])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"members": ["10.0.0.1"]}, "is not HOST:PORT"),
        ({"members": [A, A]}, "unique"),
        ({"members": ["10.0.0.1:70000"]}, "is not HOST:PORT"),
        ({"name": "Rack A"}, "lowercase"),
        ({"self": "10.9.9.9:1"}, "not one of the members"),
    ],
)
def test_bad_group_settings_say_what_is_wrong(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        config(**fields)
