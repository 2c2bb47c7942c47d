"""Figures of a series' state that are read several times per result and change at most once:
kept beside the state, and recomputed only when the values they come from may differ.

A track's windows are Counted deques, which count every change made to them: a figure keyed on
a Counted window is keyed on the window itself and its count of changes, and is exact
whichever of the rule, a rebase or a state file's load changed it, in place or not, at the
cost of one comparison of two small tuples per read. Any other value (a plain deque or list a
test gives, the reference's hour medians) is keyed on a copy of its contents, compared item by
item in C.
"""

from __future__ import annotations

import functools
import operator
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Concatenate, ParamSpec, TypeAlias, TypeVar, cast

Owner = TypeVar("Owner")
Value = TypeVar("Value")
Item = TypeVar("Item")
Args = ParamSpec("Args")
Method: TypeAlias = Callable[Concatenate[Owner, Args], Value]

# Every method of a deque that changes what it holds (the operators too: `d[0] = x`, `d += x`).
_CHANGES = (
    "append", "appendleft", "extend", "extendleft", "pop", "popleft", "remove", "insert",
    "rotate", "reverse", "clear", "__setitem__", "__delitem__", "__iadd__", "__imul__",
)  # fmt: skip


class Counted(deque[Item]):
    """A deque that counts the changes made to it (`changes`): equal counts of one object are
    equal contents. A change that fails (a pop of an empty deque) is counted too: a figure is
    recomputed once more, never kept too long."""

    __slots__ = ("changes",)

    def __init__(self, iterable: Iterable[Item] = (), maxlen: int | None = None) -> None:
        # Called again on a deque it empties and fills anew: counted as a change.
        self.changes = getattr(self, "changes", -1) + 1
        super().__init__(iterable, maxlen)


def _counting(name: str) -> Callable[..., Any]:
    change = getattr(deque, name)

    def counted(self: Counted[Any], *args: Any) -> Any:
        self.changes += 1
        return change(self, *args)

    counted.__name__ = counted.__qualname__ = name
    return counted


for _name in _CHANGES:
    setattr(Counted, _name, _counting(_name))


def keyed_on(*names: str) -> Callable[[Method[Owner, Args, Value]], Method[Owner, Args, Value]]:
    """Cache a method's figure on its instance until one of the attributes `names` (dotted:
    "hours.done") holds other values, or it is called with other arguments. Those values are
    Counted deques, or compare by content (floats, lists, deques); so do the arguments, which
    must not change in place (a frozen BaselinePolicy); the method must read nothing else that
    changes.
    """
    # One value, or a tuple of them for several names.
    read: Callable[[Any], Any] = operator.attrgetter(*names)
    single = len(names) == 1

    def decorate(method: Method[Owner, Args, Value]) -> Method[Owner, Args, Value]:
        slot = f"_memo_{method.__name__}"

        @functools.wraps(method)
        def cached(self: Owner, *args: Args.args, **kwargs: Args.kwargs) -> Value:
            if kwargs:  # keyed by position only: a call by keyword is not cached
                return method(self, *args, **kwargs)
            if single:
                window = read(self)
                inputs = (window, window.changes) if type(window) is Counted else _kept(window)
            else:
                inputs = tuple(map(_kept, read(self)))
            memo: tuple[tuple[Any, ...], Any, Value] | None = self.__dict__.get(slot)
            # Tuples and lists compare item by item in C, an item that is the same object at
            # once (a Counted window, a float copied from the window).
            if memo is not None and memo[1] == inputs and memo[0] == args:
                return memo[2]
            value = method(self, *args, **kwargs)
            self.__dict__[slot] = (args, inputs, value)
            return value

        return cast("Method[Owner, Args, Value]", cached)  # wraps() types it as its own

    return decorate


def _kept(value: Any) -> Any:
    """What a figure is keyed on for one attribute: a Counted window and its count of changes;
    a copy of any other deque or list, as a list (a deque compares through its iterator, a
    list item by item, in a fraction of the time); anything else as it is, which must not
    change in place."""
    if type(value) is Counted:
        return (value, value.changes)
    return list(value) if isinstance(value, (deque, list)) else value
