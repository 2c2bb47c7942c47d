"""`netmon`: the parser of every subcommand, `serve` and `check-config`, and the exit codes
(netmon.cli); `probe`, `topo` and `selftest` have modules of their own."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import netmon
from netmon import sim
from netmon.cli import (
    EXIT_OK,
    EXIT_USAGE,
    probe_command,
    rebaseline_command,
    selftest_command,
    sweep_command,
    topo_command,
)
from netmon.errors import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"netmon: {message} (see netmon {self.prog.split()[-1]} --help)\n")


def _add_daemon_parsers(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="run the daemon: probe idle GPUs on a schedule, export /metrics",
        description="Run probes on a schedule and serve Prometheus metrics. Without --config, "
        "an embedded default (all GPUs, or 2 CPU ranks with gloo).",
    )
    serve.add_argument(
        "--config",
        type=Path,
        default=os.environ.get("NETMON_CONFIG") or None,
        help="YAML configuration (default: $NETMON_CONFIG, else embedded)",
    )
    serve.add_argument("--listen", help="HOST:PORT for /metrics (overrides the config)")
    serve.add_argument("--state-dir", type=Path, help="where baselines persist")
    serve.add_argument("--log-format", choices=("plain", "json"))
    serve.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    serve.add_argument(
        "--idle-replay",
        type=Path,
        metavar="FILE",
        help="take GPU idle readings from a recording instead of NVML (testing)",
    )
    serve.add_argument(
        "--web-config",
        type=Path,
        metavar="FILE",
        help="TLS and basic auth for /metrics, in the Prometheus exporter-toolkit format "
        "(docs/SECURITY.md)",
    )
    serve.set_defaults(handler=_cmd_serve)
    check = commands.add_parser(
        "check-config",
        help="validate a configuration and print the effective one",
    )
    check.add_argument("file", type=Path, nargs="?", help="YAML file (default: embedded)")
    check.set_defaults(handler=_cmd_check_config)


def load_daemon_config(args: argparse.Namespace) -> Any:
    from netmon import config as cfg
    from netmon.gpu.nvml import gpu_count

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
    config = cfg.load_config(path)
    if overrides or logging_over:
        document = config.model_dump(mode="json", exclude_unset=True)
        document.update(overrides)
        if logging_over:
            document["logging"] = {**document.get("logging", {}), **logging_over}
        config = cfg.parse_config(document, "command line")
    gpus = gpu_count() if config.backend != "gloo" else 0
    return cfg.resolve(config, gpus), gpus


def _cmd_serve(args: argparse.Namespace) -> int:
    from netmon import logs
    from netmon.serve.daemon import Daemon

    config, gpus = load_daemon_config(args)
    logs.setup(config.logging.level, config.logging.format)
    if not gpus and args.config is None:
        logging.getLogger("netmon").info(
            "no GPU found: embedded default on CPU, gloo with %d ranks, probes %s",
            config.ranks,
            ", ".join(f"{p.name} every {p.interval:g} s" for p in config.probes or ()),
        )
    source = None
    if args.idle_replay is not None:
        from netmon.gpu.idle import ReplaySource

        try:
            source = ReplaySource.from_json(args.idle_replay)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--idle-replay: {args.idle_replay}: {exc}") from None
    web = None
    if args.web_config is not None:
        from netmon.exposition import webconfig

        web = webconfig.load(args.web_config)
        if web.auth is not None and web.tls is None:
            logging.getLogger("netmon").warning(
                "--web-config: basic_auth_users without tls_server_config: passwords cross the "
                "network in clear text"
            )

    def reload() -> Any:
        return load_daemon_config(args)[0]

    return int(Daemon(config, idle_source=source, web=web, loader=reload).serve_forever())


def _cmd_check_config(args: argparse.Namespace) -> int:
    from netmon import config as cfg

    config, _ = load_daemon_config(args)
    if config.group is not None:
        from netmon.group.auth import group_secret

        group_secret(config.group)  # readable and long enough, before any daemon needs it
    print(cfg.dump(config), end="")
    print(f"# OK: {args.file or 'embedded default'} is valid", file=sys.stderr)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="netmon", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"netmon {netmon.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    probe_command.add_parser(commands)
    _add_daemon_parsers(commands)
    topo_command.add_parser(commands)
    selftest_command.add_parser(commands)
    rebaseline_command.add_parser(commands)
    sweep_command.add_parser(commands)
    for name in SIMULATED_COMMANDS:
        commands.choices[name].add_argument(
            "--simulate",
            type=Path,
            metavar="NODE.json",
            help="run on a simulated GPU node described by NODE.json (docs/SIMULATE.md): NVML "
            "answers from the file, ranks run on gloo; every series says netmon_simulated 1",
        )
    return parser


# The commands that can run on a simulated GPU node.
SIMULATED_COMMANDS = ("serve", "probe", "selftest", "topo", "rebaseline")


def _simulate(path: Path | None) -> None:
    """Put this process (and every one it starts) on the simulated node of `path`."""
    if path is None:
        return
    # A run directory named in the environment is kept (the journal of the GPUs ranks opened).
    kept = os.environ.get(sim.ENV_RUN)
    try:
        node = sim.activate(path, Path(kept) if kept else None)
    except sim.SimulationError as exc:
        raise UsageError(str(exc)) from None
    gpus = node.current().gpus
    print(
        f"netmon: SIMULATED node {path} ({len(gpus)} x {gpus[0].name}): no figure measures a GPU",
        file=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _simulate(getattr(args, "simulate", None))
        return int(args.handler(args))
    except UsageError as exc:
        print(f"netmon: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
