"""The one builder of probe specs: every probe that the daemon or `netmon probe` runs (a collective,
a path variant, a GPU pair, a group round) is made here from its configuration, where its ranks
run (a Placement) and the node's topology; the rank wrapper's placeholders are resolved here too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from netmon.config import NetmonConfig, ProbeConfig
from netmon.probe.paths import Intent, intent, variant_env
from netmon.probe.spec import ProbeSpec
from netmon.topology.model import Topology

# Placeholders the rank wrapper may use: {rank} (global rank), {gpu} (the rank's GPU, or its
# rank slot for CPU ranks) and {numa} (the NUMA node nearest that GPU, from the topology).
PLACEHOLDERS = ("rank", "gpu", "numa")
# A probe's first size on GPUs warms up for at least this long unless its `warmup_s` says
# otherwise: GPU Boost raises an idle GPU's clock only under load that lasts, and a few ops of
# 8 B take microseconds (docs/FACTS.md, "Timing small sizes").
GPU_WARMUP_S = 0.1


class SpecError(ValueError):
    """The configuration cannot make a runnable spec here; the message names the setting."""


@dataclass(frozen=True)
class Placement:
    """Where a probe's ranks run, when not on the node's configured GPUs or CPU ranks.

    Every field left None comes from the configuration: a pair narrows the probe to two GPUs,
    a group round spans nodes (its world size, rendezvous host and the ranks started here).
    """

    devices: tuple[str, ...] | None = None  # GPU (or CPU rank slot) per global rank
    ranks: int | None = None
    host: str | None = None  # rendezvous address; default: rendezvous_host for rank 0's GPU
    reporters: tuple[int, ...] = (0,)
    local_ranks: tuple[int, ...] | None = None  # the ranks this node starts; default: all
    # The placement's own NCCL settings, under the operator's env (which wins).
    env: Mapping[str, str] = field(default_factory=dict)
    label: str | None = None  # the result label, when not the path name (group rounds)
    intent: Intent | None = None  # default: from the path and the topology


LOCAL = Placement()


def build_spec(
    probe: ProbeConfig,
    node: NetmonConfig,
    *,
    path: str = "default",
    placement: Placement = LOCAL,
    topology: Topology | None = None,
) -> ProbeSpec:
    """The spec of `probe` on `path`, placed as `placement` says (raises SpecError or pydantic's
    ValidationError for settings that cannot run)."""
    backend = node.backend or "gloo"
    devices = _devices(probe, node, placement, backend)
    ranks = placement.ranks or (
        len(devices) if backend == "nccl" else (probe.ranks or node.ranks or 2)
    )
    local = placement.local_ranks if placement.local_ranks is not None else tuple(range(ranks))
    env = {
        **variant_env(path, probe.op),
        **(without_p2p(topology, devices) if backend == "nccl" else {}),
        **placement.env,
        **node.env,
        **probe.env,
    }
    spec = ProbeSpec(
        op=probe.op,
        sizes=probe.sizes,
        dtype=probe.dtype,
        warmup=probe.warmup,
        warmup_s=_warmup_s(probe, backend),
        iters=probe.iters,
        batch=probe.batch,
        timing=probe.timing,
        cuda_graph=probe.cuda_graph,
        rank_stat=probe.rank_stat,
        chunks=probe.chunks,
        backend=backend,
        ranks=ranks,
        devices=devices,
        cuda_devices=tuple(uuid_of(topology, d) or d for d in devices) if backend == "nccl" else (),
        env=env,
        check=probe.check,
        timeout=probe.timeout,
        wrappers=rank_wrappers(node.rank_wrapper, local, devices, topology),
        host=placement.host or _host(node.rendezvous_host, devices),
        reporters=placement.reporters,
        path=placement.label or path,
        # With P2P off (the pcie path, a set NVML says cannot do it, or the operator's env) the
        # traffic goes through host memory whatever the path is called: the log must show that.
        intent=placement.intent
        or ("pcie" if env.get("NCCL_P2P_DISABLE") == "1" else None)
        or intent(path, all_nvlink_between(topology, devices)),
    )
    return spec.model_copy(update={"deadlines": spec.deadlines.capped(probe.timeout)})


def _warmup_s(probe: ProbeConfig, backend: str) -> float:
    if probe.warmup_s is not None:
        return probe.warmup_s
    return GPU_WARMUP_S if backend == "nccl" else 0.0


def without_p2p(topology: Topology | None, devices: Sequence[str]) -> dict[str, str]:
    """NCCL_P2P_DISABLE=1 where NVML says two of `devices` cannot do P2P (GeForce boards, many
    VMs): each rank sees one GPU, so NCCL takes a hidden peer's P2P status from NVML, and a
    GPU that cannot open its peer fails the communicator instead of falling back (NCCL's
    p2p.cc). Through host memory instead, as the pcie path goes; set by the configuration's
    env, the operator's word wins."""
    matrix = topology.p2p if topology is not None else None
    if matrix is None:
        return {}
    indices = [gpu_index(topology, d) for d in devices]
    if any(i is None for i in indices):
        return {}
    return (
        {"NCCL_P2P_DISABLE": "1"} if matrix.without([i for i in indices if i is not None]) else {}
    )


def _devices(
    probe: ProbeConfig, node: NetmonConfig, placement: Placement, backend: str
) -> tuple[str, ...]:
    if placement.devices is not None:
        return placement.devices
    if backend != "nccl":
        return ()
    return tuple(probe.devices or node.devices or ())


def _host(template: str, devices: Sequence[str]) -> str:
    try:
        return template.format(gpu=devices[0] if devices else 0, rank=0)
    except (KeyError, IndexError, ValueError) as exc:
        raise SpecError(
            f"rendezvous_host: {template!r} cannot be filled ({exc}); use {{gpu}} or {{rank}}"
        ) from None


def rank_wrappers(
    template: Sequence[str],
    ranks: Sequence[int],
    devices: Sequence[str],
    topology: Topology | None,
) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """The wrapper command of each rank started here, its placeholders filled in."""
    if not template:
        return ()
    wants_numa = any("{numa}" in part for part in template)
    resolved = []
    for rank in ranks:
        gpu = devices[rank] if rank < len(devices) else str(rank)
        numa = numa_of(topology, gpu)
        if wants_numa and numa is None:
            raise SpecError(
                f"rank_wrapper: {{numa}} needs the NUMA node of GPU {gpu} (rank {rank}), which "
                "the topology does not give; set topology_file or drop {numa}"
            )
        values = {"rank": str(rank), "gpu": gpu, "numa": "" if numa is None else str(numa)}
        try:
            command = tuple(part.format(**values) for part in template)
        except (KeyError, IndexError, ValueError) as exc:
            raise SpecError(
                f"rank_wrapper: cannot fill {exc} in {list(template)}; placeholders are "
                f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}, and a literal brace is doubled"
            ) from None
        resolved.append((rank, command))
    return tuple(resolved)


def numa_of(topology: Topology | None, device: str) -> int | None:
    """The NUMA node nearest a GPU named by NVML index or UUID; None when unknown."""
    gpu = gpu_index(topology, device)
    return None if topology is None or gpu is None else topology.gpu(gpu).numa


def gpu_index(topology: Topology | None, device: str) -> int | None:
    """The NVML index of a GPU named by index or UUID, when the topology knows it."""
    if topology is None:
        return None
    if device.isdigit():
        return int(device) if int(device) in topology.indices else None
    found = [g.index for g in topology.gpus if g.uuid and g.uuid == device]
    return found[0] if found else None


def uuid_of(topology: Topology | None, device: str) -> str | None:
    """The UUID NVML gave the GPU, for CUDA_VISIBLE_DEVICES: a name CUDA cannot renumber."""
    index = gpu_index(topology, device)
    return None if topology is None or index is None else topology.gpu(index).uuid


def all_nvlink_between(topology: Topology | None, devices: Sequence[str]) -> bool:
    """Whether NVLink joins every two of these GPUs (the transport log must then show P2P)."""
    indices = [i for i in (gpu_index(topology, d) for d in devices) if i is not None]
    if topology is None or len(indices) < 2 or len(indices) != len(devices):
        return False
    return all(topology.is_nvlink(a, b) for a in indices for b in indices if a < b)
