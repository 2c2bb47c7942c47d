"""`netmon`: the parser of every subcommand, `serve` and `check-config`, and the exit codes
(netmon.cli); `probe`, `topo` and `selftest` have modules of their own."""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import sys
import textwrap
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import netmon
from netmon import sim
from netmon.cli import (
    EXIT_CODES,
    EXIT_COULD_NOT_RUN,
    EXIT_OK,
    EXIT_READER_GONE,
    EXIT_USAGE,
    probe_command,
    rebaseline_command,
    replay_command,
    selftest_command,
    sweep_command,
    topo_command,
)
from netmon.cli.daemon_config import load_daemon_config
from netmon.errors import ConfigError, CouldNotRun, UsageError

if TYPE_CHECKING:
    from netmon.config import NetmonConfig
    from netmon.exposition.webconfig import WebSecurity

# The top-level help, written for a user (the module docstring is for the code's reader).
DESCRIPTION = (
    "netmon measures GPU interconnects with collective probes (algbw and busbw as nccl-tests\n"
    "defines them), as a one-shot command or as a daemon that probes idle GPUs on a schedule and\n"
    "exports the results to Prometheus. Without a GPU it runs on CPU ranks with gloo."
)
EPILOG = """examples:
  netmon probe --op all_reduce --sizes 8,64K,16M   one sweep, printed as nccl-tests prints it
  netmon probe --min-busbw 150G                    a health gate: exit 1 if the largest size's
                                                   busbw is under 150 GB/s
  netmon selftest                                  a GPU node's acceptance checks
  netmon serve --config netmon.yaml                the daemon: /metrics on 127.0.0.1:19464

exit codes, every command:
{codes}

Each command's flags: netmon COMMAND --help.
Documentation: README.md and docs/ in netmon's source tree.""".format(
    codes="\n".join(
        textwrap.fill(text, 96, initial_indent=f"  {code:>3}  ", subsequent_indent=" " * 7)
        for code, text in EXIT_CODES
    )
)


# Commands whose exit status carries no verdict: a reader gone ends them with 0. Every other
# one (probe's --min-busbw, selftest, sweep) is a gate, and ends with EXIT_READER_GONE.
NO_VERDICT_COMMANDS = frozenset({"replay", "check-config", "topo"})


class _Help(argparse.RawDescriptionHelpFormatter):
    """The commands listed at the options' indent, one line each, without argparse's metavar line
    above them (which also puts the help column too far left for `check-config`)."""

    def _iter_indented_subactions(
        self, action: argparse.Action
    ) -> Generator[argparse.Action, None, None]:
        if action.nargs == argparse.PARSER:
            yield from action._get_subactions()  # type: ignore[attr-defined]
        else:
            yield from super()._iter_indented_subactions(action)

    def _format_action(self, action: argparse.Action) -> str:
        text = super()._format_action(action)
        return text.split("\n", 1)[1] if action.nargs == argparse.PARSER else text


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No abbreviations: `--liste` or `--conf` would reach a flag that deployments pin (the
        # Helm chart refuses --listen and --config in extraArgs by their full names).
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # prog is "netmon" or "netmon probe": the hint names the help of the command at fault.
        self.exit(EXIT_USAGE, f"netmon: {message} (see {self.prog} --help)\n")


class _CommandParser(_Parser):
    """A command's parser says itself which of its arguments it does not know, so that the hint
    names the command's help rather than netmon's; and where one is a flag of another tool that
    the command stands in for (`hints`: nccl-tests' for `probe`), what to give instead."""

    hints: Mapping[str, str] = {}

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        if extra:
            hint = _hint(self.hints, list(sys.argv[1:] if args is None else args), extra)
            self.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
        return parsed, extra


def _hint(hints: Mapping[str, str], args: list[str], extra: list[str]) -> str:
    """The hint for the first unknown argument that is one of `hints`' flags, or the value
    given to one that takes none here (`-c 1`: the 1 is unknown, -c was taken)."""
    for token in extra:
        before = [args[at - 1] for at, given in enumerate(args) if given == token and at > 0]
        flag = next((f for f in [token.split("=", 1)[0], *before] if f in hints), None)
        if flag is not None:
            return f" ({hints[flag]})"
    return ""


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
        description="Validate a YAML configuration (or the embedded default) and print the "
        "configuration the daemon would run with, defaults filled in.",
    )
    check.add_argument("file", type=Path, nargs="?", help="YAML file (default: embedded)")
    check.add_argument(
        "--schema",
        action="store_true",
        help="print netmon.yaml's JSON schema instead (for editors; the Helm chart uses it)",
    )
    check.set_defaults(handler=_cmd_check_config)


def _cmd_serve(args: argparse.Namespace) -> int:
    from netmon import logs
    from netmon.serve.daemon import Daemon

    config, gpus = load_daemon_config(args)
    if config.inspector is not None:
        from netmon.inspector.jobdirs import check_root

        check_root(config.inspector.dir)  # before anything starts (Daemon checks it too)
    logs.setup(config.logging.level, config.logging.format)
    if not gpus and args.config is None:
        logging.getLogger("netmon").info(
            "no GPU found: embedded default on CPU, gloo with %d ranks, probes %s",
            config.ranks,
            ", ".join(f"{p.name} every {p.interval:g} s" for p in config.probes or ()),
        )
    source = None
    if args.idle_replay is not None:
        from netmon.gpu.idle_sources import ReplaySource

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
    _warn_if_exposed(config, web)

    def reload() -> Any:
        return load_daemon_config(args)[0]

    return int(Daemon(config, idle_source=source, web=web, loader=reload).serve_forever())


def _warn_if_exposed(config: NetmonConfig, web: WebSecurity | None) -> None:
    import ssl

    from netmon.listen import exposure_warning, shares_pid1_network

    # Basic auth or client certificates: TLS alone encrypts, and still answers anyone.
    tls = web.tls if web is not None else None
    client_certs = tls is not None and tls.verify_mode == ssl.CERT_REQUIRED
    authenticated = client_certs or (web is not None and web.auth is not None)
    warning = exposure_warning(
        config.listen_host, config.listen_port, authenticated, shares_pid1_network()
    )
    if warning:
        logging.getLogger("netmon").warning(warning)


def _cmd_check_config(args: argparse.Namespace) -> int:
    from netmon import config as cfg

    if args.schema:
        print(json.dumps(cfg.json_schema(), indent=2))
        return EXIT_OK
    try:
        config, _ = load_daemon_config(args)
    except ConfigError as exc:
        # Every error, a line each: a file is mended in one pass, not one run per mistake
        # (the daemon's own refusal names the first, and how many more).
        for line in (str(exc), *exc.others):
            print(f"netmon: {line}", file=sys.stderr)
        return EXIT_USAGE
    if config.group is not None:
        from netmon.group.keys import load_keys

        # The secret readable and long enough, member keys Ed25519, before any daemon needs them.
        load_keys(config.group)
    if config.inspector is not None:
        from netmon.inspector.jobdirs import check_root

        check_root(config.inspector.dir)  # marked as netmon's: the daemon removes jobs' in it
    print(cfg.dump(config), end="")
    print(f"# OK: {args.file or 'embedded default'} is valid", file=sys.stderr)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="netmon",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=_Help,
    )
    parser.add_argument("--version", action="version", version=f"netmon {netmon.__version__}")
    commands = parser.add_subparsers(
        title="commands",
        metavar="COMMAND",
        dest="command",
        required=True,
        parser_class=_CommandParser,
    )
    # In the help's order: one node's commands first, then the daemon's, then the cluster's.
    probe_command.add_parser(commands)
    selftest_command.add_parser(commands)
    topo_command.add_parser(commands)
    _add_daemon_parsers(commands)
    rebaseline_command.add_parser(commands)
    replay_command.add_parser(commands)
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
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        # As argparse does for a missing argument: the usage, then one line, exit 2.
        parser.print_usage(sys.stderr)
        print("netmon: give a command (netmon --help lists them)", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    try:
        _simulate(getattr(args, "simulate", None))
        code = int(args.handler(args))
        sys.stdout.flush()  # a reader gone shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe or socket of the command's: a real failure
        # `netmon replay F --json | head -1`: the reader had what it wanted. Quiet, as cat
        # is; exit 0 where the status says only that the command ran, and a gate's reader gone
        # before its verdict exits as a process killed by SIGPIPE does: never a pass.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK if args.command in NO_VERDICT_COMMANDS else EXIT_READER_GONE
    except UsageError as exc:
        print(f"netmon: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CouldNotRun as exc:
        print(f"netmon: {exc}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    except KeyboardInterrupt:
        return 130


def _stdout_closed() -> bool:
    """Whether nothing reads standard output any more: the write end of a pipe whose reader
    closed polls as an error (POLLERR; a socket's as hung up)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        events = poller.poll(0)
    except (OSError, ValueError, AttributeError):  # no file descriptor, or not pollable
        return False
    return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in events)
