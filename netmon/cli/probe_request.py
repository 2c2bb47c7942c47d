"""What `netmon probe`'s flags ask for: the node's settings and its probes as the daemon's
configuration would say them, their specs (through probe.build, as the daemon makes its own),
the topology and the rank zygote; every error said with the flag that caused it."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from netmon import bandwidth
from netmon.config import NetmonConfig, ProbeConfig
from netmon.errors import UsageError, describe_validation_error
from netmon.probe.build import SpecError, build_spec
from netmon.probe.forking import Zygote
from netmon.probe.spec import ProbeSpec
from netmon.probe.starting import base_env
from netmon.topology.model import Topology

DEFAULT_SIZES = {"gloo": "8,64K,1M,16M", "nccl": "8,64K,1M,16M,256M,1G"}

# Configuration field -> the flag a user typed, for one-line errors that name the fix.
_FLAG_OF_FIELD = {
    "op": "--op",
    "sizes": "--sizes",
    "dtype": "--dtype",
    "warmup": "--warmup",
    "warmup_s": "--warmup-s",
    "iters": "--iters",
    "batch": "--batch",
    "chunks": "--chunks",
    "backend": "--backend",
    "ranks": "--ranks",
    "devices": "--devices",
    "env": "--env",
    "timeout": "--timeout",
    "paths": "--paths",
    "rank_wrapper": "--wrapper",
    "rendezvous_host": "--host",
    "(top level)": "flags",
}


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
    from netmon.gpu.usable import missing_for_nccl

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
    if backend == "nccl":
        # Said once every other flag is known to be valid (run), so a bad flag is still named.
        args.nccl_missing = missing_for_nccl()
    if backend == "nccl" and not devices:
        count = args.ranks or gpu_count() or (2 if args.nccl_missing else 0)
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


@dataclass(frozen=True)
class Request:
    """What the flags ask for, as the daemon's configuration would say it: the node's settings
    and one probe per (op, chunking), each with its path variants."""

    node: NetmonConfig
    probes: tuple[ProbeConfig, ...]
    topology: Topology | None

    def specs(self) -> list[ProbeSpec]:
        return [
            spec_from(probe, self.node, path=path, topology=self.topology)
            for probe in self.probes
            for path in probe.paths
        ]


def spec_from(probe: ProbeConfig, node: NetmonConfig, **placed: Any) -> ProbeSpec:
    """A spec from probe.build, its errors said with the flag that caused them."""
    try:
        spec = build_spec(probe, node, **placed)
    except ValidationError as exc:
        raise UsageError(describe_validation_error(exc, _FLAG_OF_FIELD)) from None
    except SpecError as exc:
        message = str(exc)
        for field, flag in _FLAG_OF_FIELD.items():
            if message.startswith(f"{field}:"):
                message = flag + message[len(field) :]
        raise UsageError(message) from None
    return spec


def request_from(args: argparse.Namespace) -> Request:
    """What the flags ask for; UsageError naming the flag at fault."""
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
    except ValueError as exc:
        raise UsageError(f"--chunks: {exc}") from None
    wrapper = _wrapper(args.wrapper)
    common: dict[str, Any] = dict(
        name="probe",
        sizes=_sizes(args, backend),
        dtype=args.dtype,
        warmup=args.warmup,
        warmup_s=args.warmup_s,
        iters=args.iters,
        batch=args.batch,
        timing="per_op" if args.per_op else "batched",
        cuda_graph=args.cuda_graph,
        rank_stat=args.rank_stat,
        ranks=ranks,
        env=_parse_env(args.env),
        check=args.check,
        timeout=args.timeout,
        paths=args.paths,
    )
    try:
        node = NetmonConfig(
            backend=backend,  # type: ignore[arg-type]
            devices=devices or None,
            rank_wrapper=wrapper,
            rendezvous_host=args.host,
        )
        probes = tuple(
            ProbeConfig(op=op, chunks=chunks, **common) for op in ops for chunks in chunk_list
        )
    except ValidationError as exc:
        raise UsageError(describe_validation_error(exc, _FLAG_OF_FIELD)) from None
    needs_topology = args.pairs or backend == "nccl" or any("{numa}" in p for p in wrapper)
    topology = _topology(args, backend, ranks) if needs_topology else None
    return Request(node, probes, topology)


@contextlib.contextmanager
def rank_zygote(args: argparse.Namespace) -> Iterator[Zygote | None]:
    """The rank zygote for this command's probes (one torch import for all their ranks)."""
    if args.rank_start != "zygote":
        yield None
        return
    zygote = Zygote(sys.executable, base_env())
    try:
        yield zygote
    finally:
        zygote.close()


def _topology(args: argparse.Namespace, backend: str, ranks: int) -> Topology | None:
    """From --topology, else NVML on GPUs; CPU ranks form one class for pair probes."""
    from netmon.topology.parse import parse_topo_matrix
    from netmon.topology.plan import uniform

    if args.topology is not None:
        try:
            return parse_topo_matrix(args.topology.read_text(errors="replace"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"--topology: {args.topology}: {exc}") from None
    if backend == "nccl":
        from netmon.gpu.idle import IdleSourceError
        from netmon.gpu.nvml import read_topology

        try:
            return read_topology()
        except IdleSourceError as exc:
            if args.pairs:
                raise UsageError(f"--topology: {exc}; give a topo -m file") from None
            return None  # NUMA nodes and NVLink intents stay unknown
    return uniform(ranks, "CPU") if args.pairs else None
