"""The daemon's configuration as its flags make it: the YAML file or the embedded default, the
flags that override it, and the GPUs it probes (MIG GPUs left out); shared by `serve`,
`check-config` and `rebaseline`, which must read the configuration the daemon runs with."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from netmon import sim


def load_daemon_config(args: argparse.Namespace) -> Any:
    from netmon import config as cfg
    from netmon.gpu.nvml import gpu_count, mig_gpus

    overrides: dict[str, Any] = {}
    if getattr(args, "listen", None):
        overrides["listen"] = args.listen
    if getattr(args, "state_dir", None):
        overrides["state_dir"] = str(args.state_dir)
    elif (node := sim.active()) is not None:
        # Baselines of simulated ranks must never meet a real daemon's: kept in the run
        # directory unless --state-dir names a place.
        overrides["state_dir"] = str(node.run_dir / "state")
    logging_over = {
        k: v
        for k, v in (
            ("format", getattr(args, "log_format", None)),
            ("level", getattr(args, "log_level", None)),
        )
        if v
    }
    path = getattr(args, "config", None) or getattr(args, "file", None)
    if logging_over:
        overrides["logging"] = logging_over
    config = cfg.load_config(path, flags=overrides)
    gpus = gpu_count() if config.backend != "gloo" else 0
    mig = mig_gpus() if gpus and config.devices is None else ()
    if mig and len(mig) < gpus:
        logging.getLogger("netmon").warning(
            "GPU(s) %s in MIG mode left out of the probed GPUs (netmon measures whole GPUs; "
            "set devices to choose)",
            ", ".join(map(str, mig)),
        )
    return cfg.resolve(config, gpus, mig), gpus
