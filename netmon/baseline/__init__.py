"""Baselines and verdicts: the settings (policy.py), one series' state (track.py) and the rule
that moves it (rule.py), with the lines it is judged by (lines.py), the robust statistics they
use (robust.py) and its day-long reference (reference.py); the book of all series (book.py),
the state file's document (document.py) and the file itself (state.py). docs/SIGNAL.md."""

from netmon.baseline.book import CROSS_NODE_PATHS, RESET_REASONS, BaselineBook, BaselineKey
from netmon.baseline.document import STATE_VERSION
from netmon.baseline.policy import BaselinePolicy
from netmon.baseline.rule import INCONCLUSIVE_REASONS
from netmon.baseline.state import MAX_STATE_BYTES, load, save
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
