"""One-line, field-naming error messages for users (config files, web-config files and flags)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from pydantic import ValidationError


class UsageError(Exception):
    """Bad input from a user: printed as one line, exit status 2, never a traceback."""


class ConfigError(UsageError):
    """A configuration that cannot be used; the message is one line naming the field, the first
    wrong one; `others` names the rest, a line each (`netmon check-config` lists them all)."""

    def __init__(self, message: str, others: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.others = tuple(others)


class CouldNotRun(Exception):
    """Right input that this machine cannot run (no usable GPU for NCCL, no NVML): printed as
    one line, exit status 3, never a traceback. A GPU node whose driver failed is not a usage
    error: a health check that drains on 3 and only logs 2 must drain it."""


def field_path(location: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in location:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def describe_validation_error(exc: ValidationError, names: Mapping[str, str] | None = None) -> str:
    """The first error as "FIELD: what was wrong (got VALUE)", with fields renamed by `names`."""
    errors = exc.errors(include_url=False)
    tail = f" [and {len(errors) - 1} more]" if len(errors) > 1 else ""
    return describe_one_error(errors[0], names) + tail


def describe_one_error(error: Mapping[str, Any], names: Mapping[str, str] | None = None) -> str:
    """One of a ValidationError's errors as "FIELD: what was wrong (got VALUE)"."""
    location = tuple(part for part in error["loc"] if not str(part).startswith("function-"))
    path = field_path(location)
    if names and path in names:
        path = names[path]
    message = str(error["msg"]).removeprefix("Value error, ")
    got = error.get("input")
    shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
    return f"{path}: {message}{shown}".replace("\n", " ")


def describe_yaml_error(exc: Exception, *, quote: bool = True) -> str:
    """What PyYAML could not load, as one line: "line N: not valid YAML: what was wrong".

    Beyond its YAMLErrors, PyYAML's constructors raise what they meet (ValueError for
    `!!int x`, RecursionError for deep nesting). Their messages can quote the value: `quote`
    False names only the exception's type, for files that hold secrets.
    """
    if isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [repr(exc)])[0]
        return f"{where}not valid YAML: {problem}"
    if isinstance(exc, RecursionError):
        return "not valid YAML: nested too deeply"
    return f"not valid YAML: {one_line(exc) if quote else type(exc).__name__}"


def one_line(exc: BaseException, limit: int = 200) -> str:
    """The exception's message on one line, at most `limit` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
