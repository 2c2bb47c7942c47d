"""The running configuration, held once: a reload publishes a new immutable NetmonConfig that the
runner, results and coordinator all read on their next look, instead of each keeping a copy."""

from __future__ import annotations

import threading
from collections.abc import Callable

from netmon.config import NetmonConfig, ProbeConfig


class CurrentConfig:
    def __init__(self, config: NetmonConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._listeners: list[Callable[[NetmonConfig], None]] = []

    def get(self) -> NetmonConfig:
        return self._config  # one reference read: a reader sees the old or the new, never a mix

    def probe(self, name: str) -> ProbeConfig | None:
        return next((p for p in self._config.probes or () if p.name == name), None)

    def probes(self) -> tuple[ProbeConfig, ...]:
        return tuple(self._config.probes or ())

    def on_change(self, listener: Callable[[NetmonConfig], None]) -> None:
        """Called with every configuration published after this (state keyed by probe name)."""
        self._listeners.append(listener)

    def publish(self, config: NetmonConfig) -> None:
        with self._lock:
            self._config = config
            listeners = list(self._listeners)
        for listener in listeners:
            listener(config)
