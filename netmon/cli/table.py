"""Plain-text tables for a terminal: by default they fit WIDTH columns (long free text wraps within
its column, rarely needed columns are left out); `--wide` shows every column, each cell on one
line, for a wide terminal or a file."""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Collection, Mapping, Sequence
from typing import Any

# What the tables fit when not printed to a terminal (a file, a pipe, a log): wider than the
# classic 80, as nccl-tests' own table (about 110 columns) would not fit otherwise. On a terminal
# they fit its width (width()), down to NARROWEST.
WIDTH = 120
NARROWEST = 60
# The fewest columns the last (free-text) column keeps, however wide the others are.
_LAST_MIN = 24
WIDE_HELP = (
    f"every column, each cell on one line (default: fit the terminal, or {WIDTH} columns when "
    "the output is not a terminal)"
)


def width() -> int:
    """The columns a table fits: the terminal's when stdout is one (COLUMNS, else its size),
    else WIDTH."""
    if not sys.stdout.isatty():
        return WIDTH
    return max(NARROWEST, shutil.get_terminal_size((WIDTH, 24)).columns)


def add_wide_flag(parser: Any) -> None:
    parser.add_argument("--wide", action="store_true", help=WIDE_HELP)


def wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters; a word longer than that is cut."""
    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


def comment(text: str, wide: bool, prefix: str = "# ") -> list[str]:
    """A prose line of a table, wrapped to WIDTH unless `wide`; continuations indented."""
    if wide or len(prefix) + len(text) <= width():
        return [prefix + text]
    return textwrap.wrap(
        text,
        width(),
        initial_indent=prefix,
        subsequent_indent=prefix + "  ",
        break_on_hyphens=False,
    )


def aligned(
    rows: Sequence[Sequence[str]],
    wide: bool = False,
    caps: Mapping[int, int] | None = None,
    right: Collection[int] = (),
    indent: str = "",
) -> list[str]:
    """Rows (the first is the heading) in columns padded to their widest cell, two spaces apart;
    the columns in `right` (figures) aligned right.

    Unless `wide`: a cell of column i wider than caps[i] wraps onto continuation lines within its
    column, and the last column wraps into what is left of WIDTH. With `wide`, nothing wraps.
    """
    count = len(rows[0])
    widths = [max(len(row[i]) for row in rows) for i in range(count)]
    if not wide:
        for i, cap in (caps or {}).items():
            widths[i] = min(widths[i], cap)
        used = len(indent) + sum(widths[:-1]) + 2 * (count - 1)
        widths[-1] = min(widths[-1], max(width() - used, _LAST_MIN))
    lines = []
    for row in rows:
        cells = [[cell] if wide else wrap(cell, w) for cell, w in zip(row, widths, strict=True)]
        for n in range(max(len(cell) for cell in cells)):
            parts = [cell[n] if n < len(cell) else "" for cell in cells]
            padded = [
                part.rjust(w) if i in right else part.ljust(w)
                for i, (part, w) in enumerate(zip(parts, widths, strict=True))
            ]
            lines.append((indent + "  ".join(padded)).rstrip())
    return lines
