"""`netmon rebaseline`: an operator accepts the links' current performance as normal.

The daemon's references never drift down on their own (docs/SIGNAL.md); after a deliberate
change that is known to be slower (a new driver, a topology change), this is how they move.
The command leaves a request in the daemon's state directory; the daemon takes it at its next
result (or at its next start), logs it and counts it (netmon_reference_resets_total
{reason="operator"}), and the series learn their baselines afresh.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from netmon.cli import EXIT_OK
from netmon.errors import UsageError


def add_parser(commands: Any) -> None:
    rebaseline = commands.add_parser(
        "rebaseline",
        help="accept the current performance as normal: series learn their baselines afresh",
        description="Ask the running daemon (or its next start) to forget the baselines and "
        "references of the given probes' series, so that they learn afresh from the next "
        "results. The only way a reference moves down; logged and counted by the daemon.",
    )
    rebaseline.add_argument(
        "--config",
        type=Path,
        default=os.environ.get("NETMON_CONFIG") or None,
        help="the daemon's YAML configuration (default: $NETMON_CONFIG, else embedded)",
    )
    rebaseline.add_argument("--state-dir", type=Path, help="the daemon's --state-dir, if given")
    rebaseline.add_argument(
        "--probe",
        action="append",
        default=[],
        metavar="NAME",
        help="this probe's series (repeatable); --all for every probe's",
    )
    rebaseline.add_argument(
        "--all",
        action="store_true",
        help="every probe's series: forgetting every reference of the node is never a default",
    )
    rebaseline.add_argument("--reason", default="", help="why, for the daemon's log")
    rebaseline.set_defaults(handler=_cmd_rebaseline)


def _cmd_rebaseline(args: argparse.Namespace) -> int:
    from netmon.baseline import requests
    from netmon.cli.daemon_config import load_daemon_config

    if not args.probe and not args.all:
        raise UsageError(
            "name what to forget: --probe NAME (repeatable) for a probe's series, or --all for "
            "every probe's; nothing was requested"
        )
    if args.probe and args.all:
        raise UsageError("--all forgets every probe's series: give it or --probe, not both")
    config, _ = load_daemon_config(args)
    known = [p.name for p in config.probes or ()]
    if config.inspector is not None:
        known.append("jobs")  # the jobs' own collectives (docs/INSPECTOR.md): judged series too
    for name in args.probe:
        if name not in known:
            raise UsageError(
                f"--probe {name}: no such probe in the configuration (probes: {', '.join(known)})"
            )
    if len(args.reason) > 500:
        raise UsageError("--reason: at most 500 characters")
    assert config.state_dir is not None
    try:
        path = requests.write(config.state_dir, tuple(dict.fromkeys(args.probe)), args.reason)
    except FileNotFoundError:
        raise UsageError(
            f"state_dir {config.state_dir} does not exist: give the daemon's --state-dir, or "
            "--config its configuration"
        ) from None
    except OSError as exc:
        raise UsageError(
            f"state_dir {config.state_dir}: cannot leave the request ({exc.strerror or exc}); "
            "run as the daemon's user, or give its --state-dir"
        ) from None
    which = ", ".join(args.probe) if args.probe else "every probe"
    print(
        f"rebaseline requested for {which} ({path}): the daemon applies it at its next result "
        "or its next start, and logs it"
    )
    return EXIT_OK
