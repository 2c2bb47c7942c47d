"""One-line, field-naming error messages for users (config files and command-line flags)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import ValidationError


class UsageError(Exception):
    """Bad input from a user: printed as one line, exit status 2, never a traceback."""


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
    first = exc.errors(include_url=False)[0]
    location = tuple(part for part in first["loc"] if not str(part).startswith("function-"))
    path = field_path(location)
    if names and path in names:
        path = names[path]
    message = str(first["msg"]).removeprefix("Value error, ")
    got = first.get("input")
    shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
    more = len(exc.errors())
    tail = f" [and {more - 1} more]" if more > 1 else ""
    return f"{path}: {message}{shown}{tail}".replace("\n", " ")
