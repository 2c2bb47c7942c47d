"""Slurm's hostlist syntax, expanded: `n[001-003,7],gpu5` -> n001 n002 n003 n7 gpu5.

Ranges keep their zero padding (`n[08-10]` -> n08 n09 n10), as Slurm's own expansion does
(slurm.conf(5), "NodeName"); one bracket group per name, which is what topology.conf and node
lists written by hand use.
"""

from __future__ import annotations

import re

_GROUP = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<ranges>[^\[\]]+)\](?P<suffix>[^\[\]]*)$")


def expand(hostlist: str) -> list[str]:
    """Every name of `hostlist`, in order; a ValueError names the part it cannot read."""
    names: list[str] = []
    for part in _split(hostlist):
        names.extend(_expand_one(part))
    return names


def _split(hostlist: str) -> list[str]:
    """Commas outside brackets separate names."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in hostlist.strip():
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    if depth != 0:
        raise ValueError(f"hostlist {hostlist!r}: unbalanced brackets")
    return [p.strip() for p in parts if p.strip()]


def _expand_one(part: str) -> list[str]:
    if "[" not in part and "]" not in part:
        return [part]
    found = _GROUP.match(part)
    if found is None:
        raise ValueError(f"hostlist part {part!r}: one [a-b,c] group per name")
    prefix, suffix = found["prefix"], found["suffix"]
    names = []
    for item in found["ranges"].split(","):
        low, _, high = item.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"hostlist part {part!r}: {item!r} is not a number or a range")
        width = len(low)
        for number in range(int(low), int(high or low) + 1):
            names.append(f"{prefix}{number:0{width}d}{suffix}")
    return names
