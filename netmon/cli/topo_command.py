"""`netmon topo`: the GPU matrix, path classes and pair plan, from NVML or a saved
`nvidia-smi topo -m`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from netmon.cli import EXIT_OK
from netmon.cli.table import add_wide_flag, width
from netmon.errors import CouldNotRun, UsageError


def add_parser(commands: Any) -> None:
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
    add_wide_flag(topo)
    topo.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from netmon.topology.parse import parse_topo_matrix
    from netmon.topology.plan import plan_rounds
    from netmon.topology.render import render_text, to_json

    if args.from_file is not None:
        try:
            text = args.from_file.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise UsageError(f"--from-file: {args.from_file}: {exc.strerror}") from None
        try:
            topo = parse_topo_matrix(text)
        except ValueError as exc:
            raise UsageError(f"--from-file: {args.from_file}: {exc}") from None
    else:
        from netmon.gpu.idle import IdleSourceError
        from netmon.gpu.nvml import read_topology

        try:
            topo = read_topology()
        except IdleSourceError as exc:
            raise CouldNotRun(f"{exc} (use --from-file FILE on a machine without GPUs)") from None
    rounds = plan_rounds(topo)
    if args.json:
        print(json.dumps(to_json(topo, rounds), indent=2))
    else:
        print(render_text(topo, rounds, width=None if args.wide else width()))
    return EXIT_OK
