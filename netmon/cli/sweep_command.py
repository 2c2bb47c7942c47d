"""`netmon sweep`: one sweep of a cluster's idle nodes through Slurm, or on Kubernetes as JobSets
that Kueue admits (docs/SWEEPS.md).

Exit codes: 0 no suspect; 1 suspects named; 2 a usage or configuration error; 3 the sweep could
not run (the controller unreachable, too few idle nodes, another sweep running, no pair
measured); 4 no suspect, but a failure left undecided (neither named nor cleared in the rounds
the sweep had: not a healthy verdict).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from netmon.cli import (
    EXIT_COULD_NOT_RUN,
    EXIT_GATE,
    EXIT_OK,
    EXIT_UNDECIDED,
    table,
    textfile_warning,
)
from netmon.errors import UsageError

EXIT_NO_SWEEP = EXIT_COULD_NOT_RUN  # 3


def add_parser(commands: Any) -> None:
    sweep = commands.add_parser(
        "sweep",
        help="sweep a cluster's idle nodes in pairs (Slurm or Kubernetes); name the bad end",
        description="Measure node pairs from a cluster's idle nodes, each pair a preemptible "
        "Slurm job (or, on Kubernetes, a round a JobSet that Kueue admits at the lowest "
        "priority): round 1 a random matching, later rounds pair each end of a failed pair with "
        "a node that passed. Exit 0: no suspect; 1: suspects; 3: could not run; 4: a failure "
        "left undecided.",
    )
    sweep.add_argument(
        "--scheduler",
        choices=("slurm", "kubernetes"),
        help="where the pairs run: Slurm jobs, or Kubernetes JobSets admitted by Kueue "
        "(default: sweep.scheduler, else slurm)",
    )
    sweep.add_argument(
        "--partition",
        help="Slurm: the preemptible partition the pairs run in (not taken with kubernetes: "
        "the nodes are sweep.kubernetes.node_selector's)",
    )
    sweep.add_argument(
        "--nodelist",
        help="only these nodes: Slurm's hostlist syntax; on Kubernetes node names separated "
        "by commas (default: all idle)",
    )
    sweep.add_argument("--json", action="store_true", help="print the whole report as JSON")
    sweep.add_argument(
        "--config",
        type=Path,
        default=os.environ.get("NETMON_CONFIG") or None,
        help="netmon YAML with a `sweep:` section (default: $NETMON_CONFIG, else defaults)",
    )
    sweep.add_argument("--state-dir", type=Path, help="where the nodes' history is kept")
    sweep.add_argument("--seed", type=int, help="seed of the random matching (default: random)")
    sweep.add_argument(
        "--textfile",
        type=Path,
        help="also write the verdicts (suspects, undecided, pairs, exit code) here in "
        "node_exporter's textfile format: a suspect whose daemon is down is still named",
    )
    table.add_wide_flag(sweep)
    sweep.set_defaults(handler=_cmd_sweep)


def _settings(args: argparse.Namespace) -> tuple[Any, Any, Path]:
    from netmon import config as cfg
    from netmon.sweep.settings import SweepConfig

    config = cfg.resolve(cfg.load_config(args.config), 0)
    settings = config.sweep or SweepConfig()
    assert config.state_dir is not None  # resolve() sets it
    directory = args.state_dir or settings.state_dir or config.state_dir / "sweep"
    return config, settings, directory


def _secret(settings: Any) -> Any:
    """What seals each node's report: the sweep host's Ed25519 key where set (no node can
    forge it), else the shared secret, else None (nothing is delivered)."""
    from netmon.group.auth import read_secret
    from netmon.sweep.delivery import signing
    from netmon.sweep.delivery.node_report import SEAL_GROUP

    if settings.signing_key_file is not None:
        return signing.load_signer(SEAL_GROUP, settings.signing_key_file)
    if settings.secret_file is None:
        return None
    try:
        return signing.shared(SEAL_GROUP, read_secret(settings.secret_file))
    except ValueError as exc:
        raise UsageError(f"sweep.secret_file: {exc}") from None


def _cmd_sweep(args: argparse.Namespace) -> int:
    from netmon.sweep import history
    from netmon.sweep.runner import CouldNotRun, new_sweep_id
    from netmon.sweep.scheduler import exiting_on_signals

    config, settings, directory = _settings(args)
    sweep_id = new_sweep_id()
    scheduler, partition = _scheduler(args, settings, sweep_id)
    secret = _secret(settings)
    auth = _basic_auth(settings)
    # Once the flags and settings are known to be valid: a usage error stays one line.
    if args.textfile is not None and (warning := textfile_warning(args.textfile)):
        print(warning, file=sys.stderr)
    try:
        with exiting_on_signals(), history.exclusive(directory):
            whole = _sweep(args, config, settings, directory, scheduler, partition, secret, auth)
    except CouldNotRun as exc:
        return _could_not_run(args, sweep_id, partition, str(exc), exc.partial)
    except history.Busy as exc:
        return _could_not_run(args, sweep_id, partition, str(exc), {})
    _print(args, whole)
    code = exit_code(whole)
    _textfile(args, whole, code)
    return code


def _textfile(args: argparse.Namespace, whole: dict[str, Any], code: int) -> None:
    """--textfile: the verdicts for node_exporter's textfile collector, whatever they are."""
    if args.textfile is None:
        return
    from netmon.sweep.delivery import textfile

    try:
        textfile.write(args.textfile, whole, code, time.time())
    except OSError as exc:
        print(f"netmon sweep: --textfile {args.textfile}: {exc.strerror or exc}", file=sys.stderr)


def exit_code(whole: dict[str, Any]) -> int:
    """1 with a suspect; else 4 when a failure was left undecided (nothing named, nothing
    cleared: the sweep cannot say the cluster is healthy); else 0."""
    if whole["suspects"]:
        return EXIT_GATE
    if whole["undecided"] or whole.get("undecided_uplinks"):
        return EXIT_UNDECIDED
    return EXIT_OK


def _scheduler(args: argparse.Namespace, settings: Any, sweep_id: str) -> tuple[Any, str]:
    """The scheduler the pairs run on, and what the report calls the nodes' partition: Slurm's,
    or on Kubernetes the node selector."""
    if (args.scheduler or settings.scheduler) == "kubernetes":
        from netmon.sweep.kube.scheduler import KubernetesScheduler
        from netmon.sweep.kube.state import label_selector

        if args.partition:
            raise UsageError(
                "--partition: Slurm's; on Kubernetes the nodes are sweep.kubernetes.node_selector's"
            )
        chosen = label_selector(settings.kubernetes.node_selector) or "all nodes"
        return KubernetesScheduler.connect(settings, sweep_id), chosen
    from netmon.sweep.slurm.scheduler import SlurmScheduler

    partition = args.partition or settings.partition
    if not partition:
        raise UsageError("--partition: name the preemptible partition (or set sweep.partition)")
    return SlurmScheduler(settings, sweep_id, partition), partition


def _sweep(
    args: argparse.Namespace,
    config: Any,
    settings: Any,
    directory: Path,
    scheduler: Any,
    partition: str,
    secret: Any,
    auth: tuple[str, str] | None,
) -> dict[str, Any]:
    from netmon.sweep import history, report
    from netmon.sweep.delivery import deliver
    from netmon.sweep.runner import run_sweep

    sweep_id = scheduler.sweep
    book = history.load(directory, config.baseline)
    rng = random.Random(args.seed)
    outcome = run_sweep(
        scheduler,
        settings,
        book,
        sweep=sweep_id,
        partition=partition,
        nodelist=args.nodelist,
        rng=rng,
    )
    history.save(directory, book)
    whole = outcome.whole
    if secret is None:
        whole["delivered"] = {}
        whole["notes"].append(
            "not delivered to the daemons: neither sweep.signing_key_file nor sweep.secret_file "
            "is set"
        )
        return whole
    reports = report.node_reports(sweep_id, outcome.localiser, outcome.finished_at)
    whole["delivered"] = deliver.deliver(
        reports,
        scheduler.addresses,
        secret,
        scheme=settings.daemon_scheme,
        port=settings.daemon_port,
        ca_file=settings.ca_file,
        basic_auth=auth,
    )
    return whole


def _basic_auth(settings: Any) -> tuple[str, str] | None:
    if settings.daemon_username is None:
        return None
    if settings.daemon_password_file is None:
        raise UsageError("sweep.daemon_password_file: set it with sweep.daemon_username")
    try:
        password = settings.daemon_password_file.read_text().strip()
    except OSError as exc:
        raise UsageError(f"sweep.daemon_password_file: {exc.strerror or exc}") from None
    return settings.daemon_username, password


def _could_not_run(
    args: argparse.Namespace, sweep_id: str, partition: str, why: str, partial: dict[str, Any]
) -> int:
    from netmon.sweep import report

    print(f"netmon sweep: could not run: {why}", file=sys.stderr)
    now = time.time()
    started = int(sweep_id.split("-", 1)[0]) / 1000  # the id starts with its start in ms
    empty = report.empty(sweep_id, partition, started, now) | partial | {"error": why}
    if args.json:
        print(json.dumps(empty, indent=2))
    _textfile(args, empty, EXIT_NO_SWEEP)
    return EXIT_NO_SWEEP


def _print(args: argparse.Namespace, whole: dict[str, Any]) -> None:
    print(json.dumps(whole, indent=2) if args.json else human(whole, args.wide))


def human(whole: dict[str, Any], wide: bool = False) -> str:
    """The sweep's report for a person: one row per pair, then the suspects and notes. Fits
    table.WIDTH columns (long node names and details wrap) unless `wide`."""
    lines = [
        f"sweep {whole['sweep']}: {len(whole['nodes'])} nodes, {whole['rounds']} round(s), "
        f"{whole['wall_seconds']:.1f} s"
    ]
    rows = [("round", "pair", "outcome", "busbw GB/s", "detail")]
    for pair in whole["pairs"]:
        busbw = f"{pair['busbw'] / 1e9:.3f}" if pair["busbw"] is not None else "-"
        label = " - ".join(pair["nodes"])  # spaces: a long pair wraps between its nodes
        rows.append((str(pair["round"]), label, pair["outcome"], busbw, pair["detail"] or ""))
    lines += table.aligned(rows, wide, caps={1: 48}, right={0, 3})
    for suspect in whole["suspects"]:
        lines += table.comment(
            f"SUSPECT {_suspect_text(suspect)}, rails {suspect['rails']}", wide, ""
        )
    for link in whole.get("undecided_uplinks", []):
        lines += table.comment(f"undecided uplink: {link}", wide, "")
    for note in whole.get("notes", []):
        lines += table.comment(f"note: {note}", wide, "")
    if not whole["suspects"]:
        lines.append("no suspect")
    return "\n".join(lines)


def _suspect_text(suspect: dict[str, Any]) -> str:
    if suspect.get("kind") == "uplink":
        return f"uplink {suspect['uplink']}"
    if suspect.get("kind") == "switch":
        return f"{suspect['level']} switch {suspect['switch']} (every uplink of it)"
    where = f" (the path to {suspect['peer']})" if "peer" in suspect else ""
    return f"{suspect['node']}{where}"
