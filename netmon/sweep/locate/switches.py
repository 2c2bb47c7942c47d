"""Whole switches: a leaf or a spine slow on all its uplinks, named as one suspect. Pure
(docs/SWEEPS.md, "A whole switch").

An uplink is named from failures whose other links are clear. A bad switch leaves no such
failure: every uplink of a slow spine fails, so a retest through one of them has no partner
whose own uplink to that spine is clear, and the sweep ended with dozens of undecided uplinks and
nothing named. The switch is its own hypothesis instead: every pair-rail measured across leaves
crosses two leaves and one or two spines; a switch through which the sweep's failures (their
cables clear) went, from several pairs with no node in common and over several of its uplinks,
while almost nothing through it passed, is named, and the failures it explains are no uplink's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

from netmon.sweep.locate.fabric import Link, Uplink

MIN_FAILS = 4  # failed pair-rails through the switch, no two sharing a node
MIN_LINKS = 3  # of its uplinks among them: one bad uplink is an uplink, not a switch
MAX_PASS_SHARE = 0.1  # passes through it, over its failures


class Seen(Protocol):
    """What the ledger kept of one measured pair-rail (netmon.sweep.locate.uplinks.Observation)."""

    @property
    def nodes(self) -> tuple[str, ...]: ...
    @property
    def rail(self) -> int: ...
    @property
    def links(self) -> frozenset[Link]: ...
    @property
    def passed(self) -> bool: ...
    @property
    def ratio(self) -> float | None: ...


S = TypeVar("S", bound=Seen)


@dataclass(frozen=True)
class NamedSwitch:
    switch: str
    level: Literal["leaf", "spine"]
    rail: int
    round: int
    ratio: float | None  # the worst failure's busbw over its expected level
    links: frozenset[Uplink]  # its uplinks the failures went through


@dataclass
class _Tally:
    level: Literal["leaf", "spine"]
    passes: int = 0
    fails: list[Seen] = field(default_factory=list)
    links: set[Uplink] = field(default_factory=set)


def tally(
    observations: Iterable[Seen], cables_clear: Callable[[Seen, str], bool]
) -> dict[str, _Tally]:
    """Every switch's passes, and its failures among pair-rails across leaves whose cables
    are clear but for failures through that switch (`cables_clear(obs, switch)`: a node under
    a slow leaf fails every pair that leaves it, and that is the leaf's to explain)."""
    found: dict[str, _Tally] = {}
    for obs in observations:
        for link in (link for link in obs.links if isinstance(link, Uplink)):
            for switch, level in zip(link.ends, ("leaf", "spine"), strict=True):
                entry = found.setdefault(switch, _Tally(level))  # type: ignore[arg-type]
                if obs.passed:
                    entry.passes += 1
                elif obs in entry.fails or cables_clear(obs, switch):
                    if obs not in entry.fails:
                        entry.fails.append(obs)
                    entry.links.add(link)
    return found


def name(found: dict[str, _Tally], named: Iterable[str], round_: int) -> list[NamedSwitch]:
    """The switches the tally convicts, not named before: enough failures apart, over enough
    of its uplinks, almost no pass; and none of the switches sharing its failures as likely."""
    ready = {s: t for s, t in found.items() if _convicted(t)}
    new = []
    for switch, entry in sorted(ready.items(), key=lambda item: -len(item[1].fails)):
        if switch in named or _rivalled(switch, entry, ready):
            continue
        ratios = [obs.ratio for obs in entry.fails if obs.ratio is not None]
        new.append(
            NamedSwitch(
                switch,
                entry.level,
                entry.fails[0].rail,
                round_,
                min(ratios) if ratios else None,
                frozenset(entry.links),
            )
        )
    return new


def _convicted(entry: _Tally) -> bool:
    return (
        len(apart(entry.fails)) >= MIN_FAILS
        and len(entry.links) >= MIN_LINKS
        and entry.passes <= MAX_PASS_SHARE * len(entry.fails)
    )


def _rivalled(switch: str, entry: _Tally, ready: dict[str, _Tally]) -> bool:
    """Another convicted switch explains as many of the same failures (two leaves matched
    with each other: each leaf's every pair went through the other): wait for a round that
    tells them apart."""
    mine = {id(obs) for obs in entry.fails}
    for other, rival in ready.items():
        if other == switch:
            continue
        shared = mine & {id(obs) for obs in rival.fails}
        if len(shared) * 2 >= len(mine) and len(rival.fails) >= len(entry.fails):
            return True
    return False


def apart(observations: Sequence[S]) -> list[S]:
    """Observations no two of which share a node (the first of each clash kept)."""
    kept: list[S] = []
    for obs in observations:
        if not any(set(obs.nodes) & set(other.nodes) for other in kept):
            kept.append(obs)
    return kept
