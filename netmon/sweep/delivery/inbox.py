"""What a node's daemon accepts of a delivered sweep report (POST /sweep), decided without I/O:
signed by the sweep host (or sealed with the sweep secret) under the key of the node it names,
for this node, fresh, and from a newer sweep than the last one accepted; and the state the
accepted reports leave (netmon.serve.sweep_inbox keeps it, saves it and exports it)."""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, ClassVar

from pydantic import ValidationError

from netmon.errors import describe_validation_error
from netmon.group.auth import MAX_AGE_S, AuthError, Sealer
from netmon.sweep.delivery.node_report import SEAL_GROUP, NodeReport, seal_key
from netmon.sweep.delivery.signing import SIGNATURE_HEX, Opens

# A full report (MAX_RESULTS results of about 200 bytes with short node names) is some 50 KB.
MAX_REPORT_BYTES = 64 << 10
# How each delivery is counted (netmon_sweep_reports_total{outcome}).
REPORT_OUTCOMES = ("accepted", "malformed", "refused")
STATE_VERSION = 1
# The sweeps a node's daemon remembers the verdicts of, to tell a fault that comes and goes: at
# one sweep an hour, half a day.
RECENT_SWEEPS = 12
_MESSAGE_CHARS = 200  # what an answer's one line may carry of a reason


class InboxError(Exception):
    """A report that is not accepted: `status` is the HTTP answer, `outcome` how it is counted."""

    status: ClassVar[int] = 403
    outcome: ClassVar[str] = "refused"


class Malformed(InboxError):
    status = 400
    outcome = "malformed"


class TooLarge(Malformed):
    status = 413


class BadSeal(InboxError):
    """Not sealed with this daemon's sweep secret under the key of the node it names."""


class WrongNode(InboxError):
    """Sealed for another node: delivered to the wrong address."""


class Stale(InboxError):
    """Sealed too long ago (or ahead): a recording replayed, or clocks that disagree."""


class Replayed(InboxError):
    """From a sweep no newer than the last one accepted."""


def sweep_started_ms(sweep: str) -> int:
    """When a sweep started, from its id (13 digits of Unix milliseconds, then random)."""
    return int(sweep[:13])


def accept(
    sealed: str,
    opener: bytes | Opens,
    names: Collection[str],
    now: float,
    last_sweep: str | None,
    max_age: float = MAX_AGE_S,
) -> NodeReport:
    """The report in `sealed` if this node (known by `names`) takes it; else an InboxError.
    `opener`: the sweep host's public key (netmon.sweep.delivery.signing.Verifier), or the
    shared sweep secret."""
    if len(sealed.encode()) > MAX_REPORT_BYTES:
        raise TooLarge(f"a report is at most {MAX_REPORT_BYTES} bytes")
    node = _named_node(sealed)
    if isinstance(opener, bytes):
        opener = Sealer(SEAL_GROUP, opener)
    try:
        body = opener.open(seal_key(node), sealed)
    except AuthError as exc:  # the payload is a JSON object (read above): the seal is wrong
        raise BadSeal(_short(_why(exc, opener, seal_key(node), sealed))) from None
    if node not in names:
        raise WrongNode(_short(f"a report for node {node}; this is {', '.join(sorted(names))}"))
    try:
        report = NodeReport.model_validate(body)
    except ValidationError as exc:
        raise Malformed(_short(f"not a sweep report: {describe_validation_error(exc)}")) from None
    times = (report.at, report.finished_at, *(r.measured_at for r in report.results))
    if not all(math.isfinite(t) for t in times):  # JSON's NaN and Infinity parse as floats
        raise Malformed("a time that is not a finite number")
    _check_fresh(report, now, max_age)
    if last_sweep is not None and sweep_started_ms(report.sweep) <= sweep_started_ms(last_sweep):
        raise Replayed(f"sweep {report.sweep} is not newer than the last accepted, {last_sweep}")
    return report


def _why(exc: AuthError, opener: Opens, key: str, sealed: str) -> str:
    if not isinstance(opener, Sealer):
        return str(exc)  # the sweep host's key: its own reasons
    if len(sealed.partition(".")[0]) == SIGNATURE_HEX:
        return f"{key}: signed by a sweep host, but this daemon has no sweep.verify_key_file"
    return f"{key}: wrong MAC (another sweep secret, or tampered with)"


def _named_node(sealed: str) -> str:
    """The node a sealed report names, read before its MAC is checked: to choose the key."""
    mac, dot, payload = sealed.partition(".")
    if not dot or len(mac) not in (64, SIGNATURE_HEX):
        raise Malformed("not a sealed report (MAC.JSON or SIGNATURE.JSON)")
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError):
        raise Malformed("sealed, but not JSON") from None
    node = body.get("node") if isinstance(body, dict) else None
    if not isinstance(node, str) or not node:
        raise Malformed("no node named in the report")
    return node


def _check_fresh(report: NodeReport, now: float, max_age: float) -> None:
    skew = now - report.at
    if abs(skew) > max_age:
        way = "in the future" if skew < 0 else "old"
        raise Stale(
            f"sealed {abs(skew):.0f} s {way}, more than {max_age:.0f} s (a replay, or the "
            "clocks of this node and the sweep's disagree: check NTP)"
        )
    # A sweep id far ahead would refuse every later sweep as a replay until the clock caught up.
    if sweep_started_ms(report.sweep) > (now + max_age) * 1000:
        raise Stale(f"sweep {report.sweep} starts in the future")


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 3] + "..."


@dataclass(frozen=True)
class SweepState:
    """What the accepted reports leave: the last one, how many sweeps in a row named this node,
    and whether each of the last RECENT_SWEEPS named it, oldest first (a sweep that did not
    measure the node delivers nothing and changes nothing)."""

    report: NodeReport | None = None
    suspect_sweeps: int = 0
    recent: tuple[bool, ...] = ()

    def after(self, report: NodeReport) -> SweepState:
        in_a_row = self.suspect_sweeps + 1 if report.suspect else 0
        return SweepState(report, in_a_row, (*self.recent, report.suspect)[-RECENT_SWEEPS:])

    @property
    def last_sweep(self) -> str | None:
        return self.report.sweep if self.report is not None else None

    @property
    def suspect_onsets(self) -> int:
        """How often, in the recent sweeps, one named the node after one that did not (or as
        the first): a fault that comes and goes starts one each time it comes back."""
        return sum(named and not before for before, named in pairwise((False, *self.recent)))

    def to_json(self) -> dict[str, Any]:
        report = self.report.model_dump(mode="json") if self.report is not None else None
        return {
            "version": STATE_VERSION,
            "suspect_sweeps": self.suspect_sweeps,
            "recent": list(self.recent),
            "report": report,
        }

    @classmethod
    def from_json(cls, data: Any) -> SweepState:
        """ValueError when `data` is not a state document of this version. One saved before
        `recent` existed starts it from its sweeps in a row; a longer `recent` than this
        version keeps is cut to its last RECENT_SWEEPS."""
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise ValueError(f"not a sweep state document of version {STATE_VERSION}")
        count = data.get("suspect_sweeps")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"suspect_sweeps: a count >= 0, not {count!r}")
        recent = data.get("recent", [True] * min(count, RECENT_SWEEPS))
        if not isinstance(recent, list) or not all(isinstance(named, bool) for named in recent):
            raise ValueError("recent: a list of booleans")
        raw = data.get("report")
        report = NodeReport.model_validate(raw) if raw is not None else None
        return cls(report, count, tuple(recent[-RECENT_SWEEPS:]))
