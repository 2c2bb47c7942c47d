"""NETMON_ environment variables over the configuration file: NETMON_LISTEN, nested with "__",
list items by index (NETMON_PROBES__0__INTERVAL=30s), values read as YAML. Pure apart from the
warning for a variable that looks like a misspelt setting."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Collection, Mapping
from typing import Any

from netmon import documents
from netmon.errors import ConfigError, describe_yaml_error

log = logging.getLogger("netmon.config")

PREFIX = "NETMON_"


def name_of(path: list[str]) -> str:
    return PREFIX + "__".join(part.upper() for part in path)


def overrides(environ: Mapping[str, str]) -> list[tuple[list[str], Any]]:
    overrides = []
    for key, raw in sorted(environ.items()):
        if not key.startswith(PREFIX) or key == PREFIX:
            continue
        path = [part.lower() for part in key[len(PREFIX) :].split("__")]
        try:
            value = documents.load(raw) if raw.strip() else raw
        except documents.DuplicateKeyError as exc:
            # Clearly meant as a mapping: taken as a string it would fail further on, less clearly.
            raise ConfigError(f"{key}: {describe_yaml_error(exc)}") from None
        except Exception:  # not YAML (PyYAML also raises ValueError, KeyError...): the string
            value = raw
        overrides.append((path, value))
    return overrides


def apply(document: dict[str, Any], path: list[str], value: Any, source: str) -> None:
    node: Any = document
    for depth, part in enumerate(path):
        last = depth == len(path) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"{source}: no list item {part} at {'.'.join(path[:depth])}")
            index = int(part)
            if last:
                node[index] = value
            else:
                node = node[index]
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"{source}: {'.'.join(path[:depth])} is not a mapping")
        if last:
            node[part] = value
            continue
        following = path[depth + 1]
        if following.isdigit() and part not in node:
            # An index into a list the file never set: the embedded default (probes) depends on
            # the GPUs found, so there is nothing to index yet.
            whole = PREFIX + "__".join(p.upper() for p in path[: depth + 1])
            raise ConfigError(
                f"{source}: {'.'.join(path[: depth + 1])} is not set in the configuration file, "
                f"so item {following} cannot be overridden; write the list in the file, or "
                f"give the whole list as YAML in {whole}"
            )
        node = node.setdefault(part, {})


def warn_if_misspelt(env_name: str, root: str, roots: Collection[str]) -> None:
    """Other NETMON_ variables are left alone (NETMON_CONFIG, the Slurm scripts' settings), but
    one that looks like a setting's was most likely meant as one: said, not silently ignored."""
    close = difflib.get_close_matches(root, sorted(roots), n=1, cutoff=0.8)
    if close:
        meant = PREFIX + close[0].upper()
        log.warning("%s is not a setting and is ignored; did you mean %s?", env_name, meant)
