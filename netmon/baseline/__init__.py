"""Baselines and verdicts: the settings (policy.py), the rule that judges one series (track.py)
with the robust statistics it uses (robust.py), the book of all series (book.py), the state
file's document (document.py) and the file itself (state.py). docs/SIGNAL.md."""

from netmon.baseline.book import CROSS_NODE_PATHS, RESET_REASONS, BaselineBook, BaselineKey
from netmon.baseline.document import STATE_VERSION
from netmon.baseline.policy import BaselinePolicy
from netmon.baseline.state import MAX_STATE_BYTES, load, save
from netmon.baseline.track import INCONCLUSIVE_REASONS
from netmon.baseline.verdict import DEGRADED_REASONS, Verdict

__all__ = [
    "CROSS_NODE_PATHS",
    "DEGRADED_REASONS",
    "INCONCLUSIVE_REASONS",
    "MAX_STATE_BYTES",
    "RESET_REASONS",
    "STATE_VERSION",
    "BaselineBook",
    "BaselineKey",
    "BaselinePolicy",
    "Verdict",
    "load",
    "save",
]
