"""A window's values in order, kept up to date as the window moves instead of sorted anew.

The rule reads the order of the same windows on every result (the learned results for the
baseline and the spread, the long window for the long level), and between two results a
window has moved by one append at most, the oldest value dropped when it is full. Taking the
new value in and the dropped one out (bisect, a move of pointers in C) costs far less than a
sort of 60 or 120 values.

Exact by construction: the copy of the values it last saw is compared with the window as it is
now (in C, item by item, the same float objects matching by identity), and anything but one
append, whoever changed the window and however (a rebase, a state file's load, a test), is
sorted anew. Equal values are interchangeable in every figure taken from the order, save a
zero's sign and a NaN's order: a window that takes in or lets go of a zero or a NaN is sorted
anew too.
"""

from __future__ import annotations

import bisect


class Ordered:
    """The values last given to of(), and the same values as sorted() orders them."""

    __slots__ = ("_ordered", "_plain", "_values")

    def __init__(self) -> None:
        self._values: list[float] = []
        self._ordered: list[float] = []
        self._plain = True  # no zero and no NaN among them

    def of(self, values: list[float]) -> list[float]:
        """`values` in order: the list kept, which the caller must not change."""
        if not self._plain or not values or not _plain(values[-1]):
            return self._sorted(values)
        seen, new = self._values, values[-1]
        moved = len(values) - len(seen)
        if moved == 0 and values == seen:
            return self._ordered
        if moved == 1 and values[:-1] == seen:
            bisect.insort(self._ordered, new)
        elif moved == 0 and values[:-1] == seen[1:]:
            del self._ordered[bisect.bisect_left(self._ordered, seen[0])]
            bisect.insort(self._ordered, new)
        else:
            return self._sorted(values)
        self._values = values
        return self._ordered

    def _sorted(self, values: list[float]) -> list[float]:
        self._values, self._ordered = values, sorted(values)
        self._plain = all(map(_plain, self._ordered))
        return self._ordered


def _plain(value: float) -> bool:
    """Neither a zero (0.0 and -0.0 are equal: which of them a window holds, a comparison
    cannot tell) nor a NaN (which has no place in an order)."""
    return bool(value) and value == value
