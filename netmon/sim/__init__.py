"""A simulated GPU node (`--simulate NODE.json`): a second implementation of the hardware boundary,
what NVML answers and what a rank registers when it would open its GPU. Everything above that
boundary (readiness, spec builder, launcher, rank zygote, ranks, results) is the code that runs on
a real node. See docs/SIMULATE.md.

The simulation is handed to every process netmon starts through the environment: the node file in
NETMON_SIMULATE, the run directory where ranks register in NETMON_SIMULATE_RUN.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

from netmon.sim.node import SimulatedNode, SimulationError

ENV_NODE = "NETMON_SIMULATE"
ENV_RUN = "NETMON_SIMULATE_RUN"

_cache: dict[tuple[str, str], SimulatedNode] = {}
_cache_lock = threading.Lock()

__all__ = ["ENV_NODE", "ENV_RUN", "SimulatedNode", "SimulationError", "activate", "active"]


def active(env: Mapping[str, str] | None = None) -> SimulatedNode | None:
    """The simulated node this process runs on, None on real hardware."""
    env = os.environ if env is None else env
    path, run = env.get(ENV_NODE), env.get(ENV_RUN)
    if not path:
        return None
    if not run:
        raise SimulationError(f"{ENV_NODE} is set but {ENV_RUN} is not: start with --simulate")
    with _cache_lock:
        node = _cache.get((path, run))
        if node is None:
            node = _cache[(path, run)] = SimulatedNode(Path(path), Path(run))
        return node


def activate(path: Path, run_dir: Path | None = None) -> SimulatedNode:
    """Simulate the node of `path` in this process and every process it starts. The file is
    checked now (SimulationError in one line); the run directory is made here and removed at
    exit unless the caller gave one."""
    node_path = path.resolve()
    if run_dir is None:
        run_dir = Path(tempfile.mkdtemp(prefix="netmon-sim-"))
        atexit.register(shutil.rmtree, run_dir, True)
    SimulatedNode(node_path, run_dir)  # the file must be usable before anything starts
    os.environ[ENV_NODE] = str(node_path)
    os.environ[ENV_RUN] = str(run_dir)
    node = active()
    assert node is not None
    return node


def deactivate() -> None:
    """Back to the hardware (tests)."""
    os.environ.pop(ENV_NODE, None)
    os.environ.pop(ENV_RUN, None)
