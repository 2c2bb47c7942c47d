"""The `netmon` command: subcommands, flags and exit codes; the work happens elsewhere.

Exit codes: 0 success; 1 a health gate failed (busbw under --min-busbw); 2 a usage or
configuration error (one line on stderr, no traceback); 3 a probe failed to complete.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

import netmon
from netmon import bandwidth
from netmon.cli import report
from netmon.errors import UsageError, describe_validation_error
from netmon.probe.launcher import run_probe
from netmon.probe.paths import check_names, variant_env
from netmon.probe.spec import ProbeOutcome, ProbeSpec

EXIT_OK, EXIT_GATE, EXIT_USAGE, EXIT_PROBE_FAILED = 0, 1, 2, 3

DEFAULT_SIZES = {"gloo": "8,64K,1M,16M", "nccl": "8,64K,1M,16M,256M,1G"}

# pydantic field -> the flag a user typed, for one-line errors that name the fix.
_FLAG_OF_FIELD = {
    "op": "--op",
    "sizes": "--sizes",
    "dtype": "--dtype",
    "warmup": "--warmup",
    "iters": "--iters",
    "batch": "--batch",
    "chunks": "--chunks",
    "backend": "--backend",
    "ranks": "--ranks",
    "devices": "--devices",
    "env": "--env",
    "timeout": "--timeout",
    "(top level)": "flags",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"netmon: {message} (see netmon {self.prog.split()[-1]} --help)\n")


def _add_probe_parser(commands: Any) -> None:
    probe = commands.add_parser(
        "probe",
        help="run collectives once and print nccl-tests-style results",
        description="Run a collective sweep in fresh rank processes, like nccl-tests.",
    )
    probe.add_argument(
        "--backend",
        choices=("nccl", "gloo"),
        help="default: nccl where CUDA GPUs exist, else gloo with 2 CPU ranks",
    )
    probe.add_argument("--ranks", type=int, help="number of ranks (default: all GPUs, or 2 on CPU)")
    probe.add_argument("--devices", help="GPUs per rank, by index or UUID: 0,1,2,3")
    probe.add_argument(
        "--op",
        default="all_reduce",
        help=f"one or more of {','.join(bandwidth.OPS)}, comma separated",
    )
    probe.add_argument("--sizes", help="sizes with binary suffixes: 8,64K,16M (64K = 65536 B)")
    probe.add_argument("-b", "--minbytes", help="sweep start, as nccl-tests -b")
    probe.add_argument("-e", "--maxbytes", help="sweep end, as nccl-tests -e")
    probe.add_argument("-f", "--stepfactor", type=int, default=2, help="sweep factor (default 2)")
    probe.add_argument("-n", "--iters", type=int, default=20, help="timed samples per size")
    probe.add_argument("-w", "--warmup", type=int, default=5, help="warm-up ops per size")
    probe.add_argument(
        "--batch",
        type=int,
        default=5,
        help="back-to-back ops per sample in batched timing (default 5)",
    )
    probe.add_argument(
        "-z",
        "--per-op",
        action="store_true",
        help="synchronise after every op (nccl-tests -z, latency view)",
    )
    probe.add_argument(
        "--rank-stat",
        choices=bandwidth.RANK_STATS,
        default="max",
        help="a sample's time across ranks: max, the slowest rank (default), or mean, as "
        "nccl-tests -a 1, or min",
    )
    probe.add_argument(
        "--chunks",
        "--repeat",
        default="1",
        help="carry each size as k ops of S/k; a list (1,8,64) compares them",
    )
    probe.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    probe.add_argument("--timeout", default="300s", help="deadline for each probe (300s, 5m)")
    probe.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the ranks (NCCL_ALGO=Ring); repeatable",
    )
    probe.add_argument(
        "--paths",
        default="default",
        help="path variants, each in fresh ranks: default, pcie (NCCL_P2P_DISABLE=1, the "
        "host-memory path), ring, tree, nvls; a list compares them (default,pcie)",
    )
    probe.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="draw busbw against size for every op, path and chunking (needs matplotlib: "
        "pip install 'netmon[plot]')",
    )
    probe.add_argument("-c", "--check", action="store_true", help="verify results after timing")
    probe.add_argument(
        "--min-busbw",
        metavar="RATE",
        help="health gate: exit 1 if busbw at the largest size is under RATE "
        "(decimal: 1.5G = 1.5e9 B/s)",
    )
    probe.add_argument("--json", action="store_true", help="one JSON document on stdout")
    probe.add_argument(
        "--textfile",
        type=Path,
        metavar="PATH",
        help="also write the results in Prometheus text format, atomically, for "
        "node_exporter's textfile collector (PATH ending in .prom)",
    )
    probe.add_argument(
        "--name", default="cli", help="the probe label in --textfile output (default cli)"
    )
    probe.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    probe.add_argument(
        "--host",
        default="127.0.0.1",
        help="rendezvous address rank 0 binds; {gpu} is replaced by rank 0's GPU (pair probes)",
    )
    probe.add_argument(
        "--wrapper",
        metavar="CMD",
        help="per-rank command prefix; {rank}, {gpu}, {numa} are replaced "
        "(numactl --cpunodebind={numa}, ip netns exec ns{gpu})",
    )
    probe.add_argument(
        "--pairs",
        action="store_true",
        help="pairwise link probes: every GPU pair as a 2-rank world, in rounds of disjoint "
        "pairs; names a suspect pair or GPU (exit 1 when there is one)",
    )
    probe.add_argument(
        "--topology",
        type=Path,
        metavar="FILE",
        help="`nvidia-smi topo -m` output for the pair plan and path classes "
        "(default: NVML; with gloo, --ranks members of one class)",
    )
    probe.add_argument(
        "--passes",
        type=int,
        default=1,
        help="pair probes: run the whole plan N times and judge each pair's best (default 1)",
    )
    probe.add_argument(
        "--suspect-ratio",
        type=float,
        default=0.7,
        help="a pair is low under this fraction of its path-class median (default 0.7)",
    )
    probe.set_defaults(handler=_cmd_probe)


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


def _load_daemon_config(args: argparse.Namespace) -> Any:
    from netmon import config as cfg
    from netmon.gpu.nvml import gpu_count

    overrides: dict[str, Any] = {}
    if getattr(args, "listen", None):
        overrides["listen"] = args.listen
    if getattr(args, "state_dir", None):
        overrides["state_dir"] = str(args.state_dir)
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

    config, gpus = _load_daemon_config(args)
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
        return _load_daemon_config(args)[0]

    return int(Daemon(config, idle_source=source, web=web, loader=reload).serve_forever())


def _cmd_check_config(args: argparse.Namespace) -> int:
    from netmon import config as cfg

    config, _ = _load_daemon_config(args)
    if config.group is not None:
        from netmon.group.auth import group_secret

        group_secret(config.group)  # readable and long enough, before any daemon needs it
    print(cfg.dump(config), end="")
    print(f"# OK: {args.file or 'embedded default'} is valid", file=sys.stderr)
    return EXIT_OK


def _add_topo_parser(commands: Any) -> None:
    topo = commands.add_parser(
        "topo",
        help="print the GPU topology, path classes and the pair probe plan",
        description="The GPU matrix as nvidia-smi topo -m shows it, from NVML or a file.",
    )
    topo.add_argument(
        "--from-file",
        type=Path,
        metavar="FILE",
        help="parse saved `nvidia-smi topo -m` output instead of asking NVML",
    )
    topo.add_argument("--json", action="store_true", help="one JSON document on stdout")
    topo.set_defaults(handler=_cmd_topo)


def _cmd_topo(args: argparse.Namespace) -> int:
    from netmon.topology import model as topology

    if args.from_file is not None:
        try:
            text = args.from_file.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise UsageError(f"--from-file: {args.from_file}: {exc.strerror}") from None
        try:
            topo = topology.parse_topo_matrix(text)
        except ValueError as exc:
            raise UsageError(f"--from-file: {args.from_file}: {exc}") from None
    else:
        from netmon.gpu.idle import IdleSourceError
        from netmon.gpu.nvml import read_topology

        try:
            topo = read_topology()
        except IdleSourceError as exc:
            raise UsageError(f"{exc} (use --from-file FILE on a machine without GPUs)") from None
    rounds = topology.plan_rounds(topo)
    if args.json:
        print(json.dumps(topology.to_json(topo, rounds), indent=2))
    else:
        print(topology.render_text(topo, rounds))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="netmon", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"netmon {netmon.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_probe_parser(commands)
    _add_daemon_parsers(commands)
    _add_topo_parser(commands)
    return parser


def _parse_env(pairs: Sequence[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"--env: {pair!r} is not KEY=VALUE (example: --env NCCL_ALGO=Ring)")
        env[name] = value
    return env


def _sizes(args: argparse.Namespace, backend: str) -> list[int] | str:
    if args.sizes and (args.minbytes or args.maxbytes):
        raise UsageError("--sizes: give either --sizes or -b/-e, not both")
    if args.minbytes or args.maxbytes:
        try:
            low = bandwidth.parse_size(args.minbytes or "8")
            high = bandwidth.parse_size(args.maxbytes or args.minbytes)
            return bandwidth.size_sweep(low, high, args.stepfactor)
        except ValueError as exc:
            raise UsageError(f"-b/-e/-f: {exc}") from None
    return str(args.sizes or DEFAULT_SIZES[backend])


def _resolve_backend(args: argparse.Namespace) -> tuple[str, int, tuple[str, ...]]:
    from netmon.gpu.nvml import gpu_count

    if args.ranks is not None and args.ranks < 1:
        raise UsageError(f"--ranks: must be >= 1 (got {args.ranks})")
    devices = tuple(d.strip() for d in args.devices.split(",")) if args.devices else ()
    backend = args.backend
    if backend is None:
        gpus = gpu_count()
        backend = "nccl" if gpus else "gloo"
        ranks = args.ranks or len(devices) or gpus or 2
        # Said once the flags are known to be valid, so a usage error stays one line.
        args.announce = (
            f"netmon: no --backend given; using {backend} with {ranks} "
            f"{'GPU' if gpus else 'CPU'} ranks"
        )
    if backend == "nccl" and not devices:
        count = args.ranks or gpu_count()
        devices = tuple(str(i) for i in range(count))
    ranks = args.ranks or len(devices) or 2
    return backend, ranks, devices


def _wrapper(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise UsageError(f"--wrapper: {exc} in {text!r}; quote as in a shell") from None


def _specs(args: argparse.Namespace) -> list[ProbeSpec]:
    backend, ranks, devices = _resolve_backend(args)
    ops = [op.strip() for op in args.op.split(",") if op.strip()]
    unknown = [op for op in ops if op not in bandwidth.OPS]
    if unknown or not ops:
        raise UsageError(
            f"--op: {','.join(map(repr, unknown)) or 'nothing'} is not an op; "
            f"use one of {','.join(bandwidth.OPS)}"
        )
    try:
        chunk_list = [int(c) for c in str(args.chunks).split(",")]
        timeout = bandwidth.parse_duration(args.timeout)
    except ValueError as exc:
        raise UsageError(f"--chunks/--timeout: {exc}") from None
    common: dict[str, Any] = dict(
        sizes=_sizes(args, backend),
        dtype=args.dtype,
        warmup=args.warmup,
        iters=args.iters,
        batch=args.batch,
        timing="per_op" if args.per_op else "batched",
        rank_stat=args.rank_stat,
        backend=backend,
        ranks=ranks,
        devices=devices,
        env=_parse_env(args.env),
        check=args.check,
        timeout=timeout,
        host=args.host,
        wrapper=_wrapper(args.wrapper),
    )
    specs = []
    try:
        path_list = check_names([p.strip() for p in args.paths.split(",") if p.strip()])
    except ValueError as exc:
        raise UsageError(f"--paths: {exc}") from None
    for op in ops:
        for chunks in chunk_list:
            for path in path_list or ("default",):
                env = {**variant_env(path), **common["env"]}
                try:
                    spec = ProbeSpec(op=op, chunks=chunks, path=path, **{**common, "env": env})
                except ValidationError as exc:
                    raise UsageError(describe_validation_error(exc, _FLAG_OF_FIELD)) from None
                deadlines = spec.deadlines.capped(timeout)
                specs.append(spec.model_copy(update={"deadlines": deadlines}))
    return specs


def _progress(quiet: bool, total: int) -> Any:
    done = [0]

    def on_event(kind: str, event: dict[str, Any]) -> None:
        if kind != "result" or quiet:
            return
        done[0] += 1
        result = event["result"]
        print(
            f"netmon: [{done[0]}/{total}] {result.op} {bandwidth.format_size(result.size_bytes)}"
            f" x{result.chunks}: busbw {result.busbw_bytes_per_second / 1e9:.3f} GB/s",
            file=sys.stderr,
            flush=True,
        )

    return on_event


def _gate(outcomes: Sequence[ProbeOutcome], min_busbw: float) -> list[str]:
    """Messages for every probe whose largest size fell under the threshold."""
    failures = []
    for outcome in outcomes:
        if not outcome.results:
            continue
        largest = max(outcome.results, key=lambda r: r.size_bytes)
        if largest.busbw_bytes_per_second < min_busbw:
            failures.append(
                f"{largest.op} busbw {largest.busbw_bytes_per_second / 1e9:.3f} GB/s at "
                f"{bandwidth.format_size(largest.size_bytes)} is under --min-busbw "
                f"{min_busbw / 1e9:.3f} GB/s"
            )
    return failures


def _cmd_probe(args: argparse.Namespace) -> int:
    min_busbw = None
    if args.min_busbw is not None:
        try:
            min_busbw = bandwidth.parse_rate(args.min_busbw)
        except ValueError as exc:
            raise UsageError(f"--min-busbw: {exc}") from None
    specs = _specs(args)
    if getattr(args, "announce", None):
        print(args.announce, file=sys.stderr)
    if args.pairs:
        return _cmd_probe_pairs(args, specs)
    total = sum(len(spec.sizes) for spec in specs)
    on_event = _progress(args.quiet or total < 2, total)
    outcomes = [run_probe(spec, on_event=on_event) for spec in specs]
    if args.plot is not None:
        from netmon.cli import plot

        plot.busbw_against_size(outcomes, args.plot)
    if args.textfile is not None:
        from netmon.exposition import textfile

        try:
            textfile.write(args.textfile, outcomes, args.name, min_busbw)
        except OSError as exc:
            raise UsageError(f"--textfile: {args.textfile}: {exc.strerror}") from None
    if args.json:
        print(json.dumps(report.json_document(outcomes), indent=2))
    else:
        print("\n\n".join(report.table(outcome) for outcome in outcomes))
    failed = [o for o in outcomes if o.failure is not None]
    for outcome in failed:
        assert outcome.failure is not None
        print(
            f"netmon: probe {outcome.spec.op} failed: {outcome.failure.describe()}", file=sys.stderr
        )
    if failed:
        return EXIT_PROBE_FAILED
    if min_busbw is not None:
        gate = _gate(outcomes, min_busbw)
        for message in gate:
            print(f"netmon: UNHEALTHY: {message}", file=sys.stderr)
        if gate:
            return EXIT_GATE
    return EXIT_OK


def _pair_topology(args: argparse.Namespace, backend: str, ranks: int) -> Any:
    from netmon.topology import model as topology

    if args.topology is not None:
        try:
            return topology.parse_topo_matrix(args.topology.read_text(errors="replace"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"--topology: {args.topology}: {exc}") from None
    if backend == "nccl":
        from netmon.gpu.idle import IdleSourceError
        from netmon.gpu.nvml import read_topology

        try:
            return read_topology()
        except IdleSourceError as exc:
            raise UsageError(f"--topology: {exc}; give a topo -m file") from None
    return topology.uniform(ranks, "CPU")


def _cmd_probe_pairs(args: argparse.Namespace, specs: Sequence[ProbeSpec]) -> int:
    from netmon.probe import pairs
    from netmon.topology import model as topology

    if len(specs) != 1:
        raise UsageError("--pairs: give one --op and one --chunks value")
    base = specs[0]
    topo = _pair_topology(args, base.backend, base.ranks)
    rounds = topology.plan_rounds(topo)
    paths = {pair: str(path) for pair, path in topo.pairs().items()}

    def progress(item: pairs.PairOutcome) -> None:
        if not args.quiet:
            state = "ok" if item.outcome.ok else f"FAILED ({item.outcome.failure.reason})"  # type: ignore[union-attr]
            print(
                f"netmon: pair {item.pair[0]}-{item.pair[1]} ({item.path}): {state}",
                file=sys.stderr,
                flush=True,
            )

    if args.passes < 1:
        raise UsageError(f"--passes: must be >= 1 (got {args.passes})")
    measured: list[pairs.PairOutcome] = []
    for _ in range(args.passes):
        measured += pairs.run_pair_rounds(
            base, rounds, paths, topology=topo, host_template=base.host, on_pair=progress
        )
    results = pairs.best_per_pair(measured)
    verdict = pairs.verdict_at_largest(results, args.suspect_ratio)
    if args.json:
        print(json.dumps(report.pairs_document(results, verdict, rounds), indent=2))
    else:
        print(report.pairs_table(results, verdict))
    failed = [item for item in results if not item.outcome.ok]
    for item in failed:
        assert item.outcome.failure is not None
        print(
            f"netmon: pair {item.pair[0]}-{item.pair[1]} failed: {item.outcome.failure.describe()}",
            file=sys.stderr,
        )
    if failed:
        return EXIT_PROBE_FAILED
    if verdict.suspect_pairs or verdict.suspect_members:
        print(f"netmon: UNHEALTHY: {verdict.describe()}", file=sys.stderr)
        return EXIT_GATE
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except UsageError as exc:
        print(f"netmon: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
