"""What each node showed in one sweep's pairs: whom it passed and failed with, and the rails it
failed on; and so whom it may still be paired with, and whether it is vouched for. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field


@dataclass
class Partners:
    passed_with: dict[str, set[str]] = field(default_factory=dict)
    failed_with: dict[str, set[str]] = field(default_factory=dict)
    # The rails each node failed on, of the failures that may be its own.
    failed_rails: dict[str, set[int]] = field(default_factory=dict)

    def passed(self, nodes: Sequence[str]) -> None:
        for node in nodes:
            self.passed_with.setdefault(node, set()).update(set(nodes) - {node})

    def failed(self, nodes: Sequence[str]) -> None:
        for node in nodes:
            self.failed_with.setdefault(node, set()).update(set(nodes) - {node})

    def failed_on(self, node: str, rails: Iterable[int]) -> None:
        self.failed_rails.setdefault(node, set()).update(rails)

    def rails_failed(self, node: str) -> set[int]:
        return self.failed_rails.get(node, set())

    def witnesses(self, good: Iterable[str]) -> list[str]:
        """Good nodes that never failed: a node that failed and then passed is cleared of one
        failure, not vouched for, and its next failure is its own."""
        return [n for n in good if not self.failed_rails.get(n)]

    def vouched(self, node: str, has_history: Callable[[str], bool]) -> bool:
        """Good twice: passed with two different partners, or once with a history of passing
        sweeps behind it. One pass of a flapping node is a coin that came up heads."""
        partners = self.passed_with.get(node, set())
        if len(partners) >= 2:
            return True
        if not partners:
            return False
        return has_history(node)

    def avoid(self) -> dict[str, set[str]]:
        """Who each node must not be paired with: those it failed with, and those it passed
        with (a second pass with the same partner vouches for nothing new)."""
        avoid = {name: set(peers) for name, peers in self.failed_with.items()}
        for name, peers in self.passed_with.items():
            avoid.setdefault(name, set()).update(peers)
        return avoid

    def suspect_end(self, node: str, good_before: set[str]) -> bool:
        """Whether a failed pair's failure may be this end's: not known good; or known good
        but failing more than passing, by two partners (a marginal cable passes now and then,
        and would never be named once it had; a healthy node fails by noise now and then)."""
        if node not in good_before:
            return True
        if not self.failed_rails.get(node):
            return False
        fails = len(self.failed_with.get(node, ()))
        return fails >= len(self.passed_with.get(node, ())) + 2
