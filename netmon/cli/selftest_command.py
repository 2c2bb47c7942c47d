"""`netmon selftest`: flags in, a selftest plan (the node's configuration and one probe
configuration, every spec made by probe.build), the report's table or JSON out; exit 0 when nothing
failed, 1 when a check failed, 2 for a usage error, 3 when the selftest itself could not run."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from netmon.bandwidth import OPS
from netmon.cli import EXIT_COULD_NOT_RUN, table
from netmon.config import NetmonConfig, ProbeConfig
from netmon.errors import UsageError, describe_validation_error
from netmon.probe.build import SpecError
from netmon.selftest import report as rendering
from netmon.selftest.checks import CHECKS, Row, exit_code
from netmon.selftest.report import Report
from netmon.selftest.run import Plan, SelftestError, run_selftest
from netmon.selftest.versus import BINARY

# Bandwidth sizes: small on CPU ranks so CI stays fast; on GPUs, sizes where busbw has levelled
# off, so that netmon and all_reduce_perf are compared where bandwidth, not latency, rules.
DEFAULT_SIZES = {"gloo": "1K,1M", "nccl": "64M,256M,1G"}
_FLAGS = {
    "sizes": "--sizes",
    "ranks": "--ranks",
    "devices": "--devices",
    "timeout": "--timeout",
    "backend": "--backend",
    "(top level)": "flags",
}


def add_parser(commands: Any) -> None:
    selftest = commands.add_parser(
        "selftest",
        help="a GPU node's acceptance checks: ops, paths, nccl-tests, preemption, memory, pinning",
        description="Run every op and path with correctness checks, compare with nccl-tests' "
        "all_reduce_perf, time a preemption drill, hold each rank's memory against its budget, "
        "and check GPU pinning. See docs/GPU-ACCEPTANCE.md.",
    )
    selftest.add_argument(
        "--backend",
        choices=("nccl", "gloo"),
        help="default: nccl where GPUs exist, else gloo with 2 CPU ranks (a reduced run)",
    )
    selftest.add_argument("--ranks", type=int, help="ranks (default: every GPU, or 2 on CPU)")
    selftest.add_argument("--devices", help="GPUs by NVML index or UUID: 0,1,2,3 (nccl)")
    selftest.add_argument(
        "--sizes",
        help=f"bandwidth sizes, binary suffixes (default {DEFAULT_SIZES['nccl']} on GPUs, "
        f"{DEFAULT_SIZES['gloo']} on CPU)",
    )
    selftest.add_argument("--timeout", default="300s", help="deadline of each probe (300s, 5m)")
    selftest.add_argument(
        "--nccl-tests",
        metavar="PATH",
        help=f"the {BINARY} binary of nccl-tests (default: {BINARY} on PATH)",
    )
    selftest.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=CHECKS,
        metavar="NAME",
        help=f"leave a check out: {', '.join(CHECKS)}; repeatable",
    )
    selftest.add_argument("--json", action="store_true", help="one JSON document on stdout")
    selftest.add_argument(
        "--report", type=Path, metavar="FILE", help="also write the JSON report to FILE"
    )
    selftest.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    table.add_wide_flag(selftest)
    selftest.set_defaults(handler=run)


def _devices(args: argparse.Namespace, backend: str) -> tuple[str, ...]:
    from netmon.gpu.nvml import gpu_count

    given = tuple(d.strip() for d in args.devices.split(",")) if args.devices else ()
    if backend == "gloo":
        if given:
            raise UsageError("--devices: CPU ranks (gloo) use no GPU; give --ranks instead")
        return ()
    if given:
        return given
    found = gpu_count()
    if not found:
        raise SelftestError("no GPU found for --backend nccl (NVML sees none)")
    if args.ranks is not None and args.ranks > found:
        raise UsageError(f"--ranks: {args.ranks} ranks, but this node has {found} GPUs")
    return tuple(str(i) for i in range(args.ranks or found))


def _require_gpu(explicit: bool) -> None:
    """On a machine that cannot run NCCL, say what is missing in one line. Falling back to gloo
    unasked would read as acceptance on a first GPU node whose driver or container is broken."""
    from netmon.gpu.usable import missing_for_nccl

    missing = missing_for_nccl()
    if missing is None:
        return
    if explicit:
        raise SelftestError(f"--backend nccl: no usable GPU: {missing}")
    raise SelftestError(
        f"no usable GPU: {missing}; --backend gloo runs the checks on CPU ranks, "
        "--simulate NODE.json on a simulated GPU node"
    )


def _nccl_tests(given: str | None) -> str | None:
    if given is None:
        return shutil.which(BINARY)
    if not (os.path.isfile(given) and os.access(given, os.X_OK)):
        raise UsageError(f"--nccl-tests: {given} is not an executable file")
    return given


def plan_of(args: argparse.Namespace) -> Plan:
    """The plan the flags ask for; UsageError naming the flag when they cannot make one."""

    if args.ranks is not None and args.ranks < 2:
        raise UsageError(
            f"--ranks: the selftest runs sendrecv, which needs 2 or more (got {args.ranks})"
        )
    backend = args.backend or "nccl"
    if backend == "nccl":
        _require_gpu(explicit=args.backend is not None)
    devices = _devices(args, backend)
    if devices and args.ranks is not None and len(devices) != args.ranks:
        raise UsageError(f"--ranks: {args.ranks} ranks for {len(devices)} --devices")
    try:
        node = NetmonConfig(backend=backend, devices=devices or None, pause_file=None)  # type: ignore[arg-type]
        probe = ProbeConfig(
            name="selftest",
            sizes=args.sizes or DEFAULT_SIZES[backend],  # type: ignore[arg-type]
            ranks=args.ranks if backend == "gloo" else None,
            check=True,
            timeout=args.timeout,
        )
        plan = Plan(
            node, probe, _topology(backend), _nccl_tests(args.nccl_tests), frozenset(args.skip)
        )
        for op in OPS:
            plan.spec(op=op)  # every spec the ops make, built once before anything runs
    except ValidationError as exc:
        raise UsageError(describe_validation_error(exc, _FLAGS)) from None
    except SpecError as exc:
        raise UsageError(str(exc)) from None
    return plan


def _topology(backend: str) -> Any:
    """NVML's view of the GPUs, for their UUIDs and NVLink; None on CPU or where NVML fails."""
    if backend != "nccl":
        return None
    from netmon.gpu.idle import IdleSourceError
    from netmon.gpu.nvml import read_topology

    try:
        return read_topology()
    except IdleSourceError:
        return None


def _check_writable(path: Path | None) -> None:
    if path is None:
        return
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise UsageError(f"--report: cannot write {path} (no such folder, or not writable)")


def _write(path: Path, document: dict[str, Any]) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps(document, indent=2) + "\n")
        os.replace(temporary, path)  # atomic: a reader sees the old report or the whole new one
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


def _progress(quiet: bool) -> Any:
    def show(row: Row) -> None:
        if not quiet:
            figure = f" ({row.measured})" if row.measured else ""
            print(
                f"netmon: selftest: {row.name}: {row.status}{figure}", file=sys.stderr, flush=True
            )

    return show


def _put_out(args: argparse.Namespace, document: dict[str, Any], table: bool) -> bool:
    """--report FILE, and --json on stdout unless the table path printed it; False when the
    report could not be written."""
    if not table and args.json:
        print(json.dumps(document, indent=2))
    if args.report is None:
        return True
    try:
        _write(args.report, document)
    except OSError as exc:
        print(f"netmon: --report: {args.report}: {exc.strerror}", file=sys.stderr)
        return False
    return True


def run(args: argparse.Namespace) -> int:
    _check_writable(args.report)
    try:
        plan = plan_of(args)
    except SelftestError as exc:
        # The report says why too (docs/GPU-ACCEPTANCE.md): a node that cannot run the selftest
        # is an answer to send back, not nothing.
        report = Report(
            backend=args.backend or "nccl",
            ranks=0,
            devices=(),
            sizes=(),
            rows=(),
            started_at=time.time(),
            wall_s=0.0,
            error=f"cannot run: {exc}",
        )
        _put_out(args, rendering.document(report), table=False)
        print(f"netmon: selftest cannot run: {exc}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    report = run_selftest(plan, _progress(args.quiet))
    document = rendering.document(report)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(rendering.table(report, args.wide))
    if not _put_out(args, document, table=True):
        return EXIT_COULD_NOT_RUN
    if report.error is not None:
        print(f"netmon: selftest stopped early: {report.error}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    return exit_code(report.rows)
