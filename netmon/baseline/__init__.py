"""Baselines and verdicts: the book that judges each series (book.py), the robust statistics it
uses (robust.py) and the file that keeps it across restarts (state.py). docs/SIGNAL.md."""

from netmon.baseline.book import (
    INCONCLUSIVE_REASONS,
    STATE_VERSION,
    BaselineBook,
    BaselineKey,
    BaselinePolicy,
    Verdict,
)
from netmon.baseline.state import MAX_STATE_BYTES, load, save

__all__ = [
    "INCONCLUSIVE_REASONS",
    "MAX_STATE_BYTES",
    "STATE_VERSION",
    "BaselineBook",
    "BaselineKey",
    "BaselinePolicy",
    "Verdict",
    "load",
    "save",
]
