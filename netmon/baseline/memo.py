"""Figures of a series' state that are read several times per result and change at most once:
kept beside the state, and recomputed only when the values they come from differ.

The key is a copy of those values, not a version counter: the rule, a rebase and a state file's
load all change a track's deques in place, and a figure keyed on the values themselves is exact
whichever of them did it. Comparing a window with its copy (in C, item by item, the same float
objects matching by identity) costs far less than the sorts that recompute the figure.
"""

from __future__ import annotations

import functools
import operator
from collections import deque
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeAlias, TypeVar, cast

Owner = TypeVar("Owner")
Value = TypeVar("Value")
Args = ParamSpec("Args")
Method: TypeAlias = Callable[Concatenate[Owner, Args], Value]


def keyed_on(*names: str) -> Callable[[Method[Owner, Args, Value]], Method[Owner, Args, Value]]:
    """Cache a method's figure on its instance until one of the attributes `names` (dotted:
    "hours.done") holds other values, or it is called with other arguments. Those values must
    compare by content (floats, lists, deques), and so do the arguments, which must not change
    in place (a frozen BaselinePolicy); the method must read nothing else that changes.
    """
    read = operator.attrgetter(*names)  # one value, or a tuple of them for several names
    single = len(names) == 1

    def decorate(method: Method[Owner, Args, Value]) -> Method[Owner, Args, Value]:
        slot = f"_memo_{method.__name__}"

        @functools.wraps(method)
        def cached(self: Owner, *args: Args.args, **kwargs: Args.kwargs) -> Value:
            if kwargs:  # keyed by position only: a call by keyword is not cached
                return method(self, *args, **kwargs)
            inputs = _kept(read(self)) if single else tuple(map(_kept, read(self)))
            memo: tuple[tuple[Any, ...], Any, Value] | None = self.__dict__.get(slot)
            # Lists and tuples compare item by item in C, an item that is the same object at
            # once: a hit costs a copy and a comparison (the rule reads about ten a result).
            if memo is not None and memo[1] == inputs and memo[0] == args:
                return memo[2]
            value = method(self, *args, **kwargs)
            self.__dict__[slot] = (args, inputs, value)
            return value

        return cast("Method[Owner, Args, Value]", cached)  # wraps() types it as its own

    return decorate


def _kept(value: Any) -> Any:
    """A copy of a deque or a list, as a list (the state's own go on changing in place; a
    deque compares through its iterator, a list item by item, in a fraction of the time);
    anything else is kept as it is, and must not change in place."""
    return list(value) if isinstance(value, (deque, list)) else value
