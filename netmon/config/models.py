"""The daemon's settings as pydantic models, their JSON schema, the embedded default schedule and
what a machine fills in (backend, ranks, devices, probes, state directory)."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from netmon.bandwidth import (
    MAX_PROBE_SIZE,
    DTypeName,
    OpName,
    RankStat,
    bounded_size,
    parse_duration,
    parse_rate,
    size_sweep,
)
from netmon.baseline import BaselinePolicy
from netmon.baseline.expect import ExpectEntry
from netmon.errors import (
    CouldNotRun,
)
from netmon.gpu.idle_policy import IdlePolicy
from netmon.group.members import GroupConfig
from netmon.inspector.settings import InspectorConfig
from netmon.probe.paths import check_names, check_op
from netmon.probe.spec import Backend, Timing
from netmon.schema import (
    ANY_TEXT,
    DURATION_TEXT,
    INTEGER,
    RATE_TEXT,
    SIZE_SWEEP,
    SIZE_TEXT,
    SIZES_TEXT,
    JsonDict,
    also,
    both,
    items_also,
    self_contained,
)
from netmon.sweep.settings import SweepConfig

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_LISTEN = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.:-]*?):(?P<port>\d{1,5})$")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _duration(value: object) -> object:
    return parse_duration(value) if isinstance(value, (str, int, float)) else value


def _size(value: Any) -> int:
    try:
        return bounded_size(value, MAX_PROBE_SIZE, "a probe moves (a rank holds twice it)")
    except OverflowError:  # digits beyond a float's range: a ValueError, so the field is named
        raise ValueError("the size is too large") from None


def _devices(value: object) -> object:
    """GPUs as a list or a comma-separated string: indexes or UUIDs, as text."""
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [part for part in str(value).split(",") if part.strip()]
    if isinstance(value, (list, tuple)):
        # Only indexes and UUIDs: str() of anything else would name a GPU that never exists.
        ok = all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value)
        items = tuple(str(v).strip() for v in value)
        if not ok or not items or not all(items):
            raise ValueError("give one or more GPU indexes or UUIDs, like [0, 1] or 0,1")
        return items
    return value


_PROBE_SIZE = {**INTEGER, "maximum": MAX_PROBE_SIZE}

# The schema's side of _devices: a list of indexes or UUIDs, one of them, or "0,1".
_DEVICES = both(items_also(INTEGER), also(ANY_TEXT, INTEGER))


class ProbeConfig(_Strict):
    name: str
    op: OpName = "all_reduce"
    # Each at most MAX_PROBE_SIZE (16G: netmon.bandwidth says why), in the schema too.
    sizes: tuple[Annotated[int, Field(le=MAX_PROBE_SIZE)], ...] = Field(
        json_schema_extra=both(items_also(SIZE_TEXT), also(SIZES_TEXT, _PROBE_SIZE, SIZE_SWEEP))
    )
    interval: float = Field(60.0, gt=0, json_schema_extra=also(DURATION_TEXT))
    jitter: float | None = Field(
        None,
        ge=0,
        description="seconds; default 10% of the interval",
        json_schema_extra=also(DURATION_TEXT),
    )
    timeout: float = Field(300.0, gt=0, json_schema_extra=also(DURATION_TEXT))
    dtype: DTypeName = "float32"
    warmup: int = Field(5, ge=0)
    warmup_s: float | None = Field(None, ge=0, le=60)  # GPUs: 0.1 s (probe.build), 0 for none
    iters: int = Field(20, ge=1)
    batch: int = Field(5, ge=1)
    timing: Timing = "batched"
    cuda_graph: Literal["auto", "off"] = "auto"  # small sizes on NCCL timed from a CUDA graph
    rank_stat: RankStat = "max"  # a sample's time: the slowest rank's, or the mean (nccl-tests)
    chunks: int = Field(1, ge=1)
    devices: tuple[str, ...] | None = Field(None, json_schema_extra=_DEVICES)  # default: all
    ranks: int | None = Field(None, ge=1)  # gloo: CPU ranks; default: the node's
    env: dict[str, str] = Field(default_factory=dict)
    min_busbw: float | None = Field(
        None,
        ge=0,
        description="bytes/s; decimal suffixes: 1.5G",
        json_schema_extra=also(RATE_TEXT),
    )
    check: bool = False
    # collective: the op over all devices; pairs: every GPU pair as a 2-rank world, in rounds.
    kind: Literal["collective", "pairs"] = "collective"
    # local: this node's devices; with a `group`: group (all devices of every member),
    # group_one_gpu (one device or CPU rank per member), node_pairs (every pair of members,
    # in rounds of disjoint pairs, judged against the median of all node pairs).
    scope: Literal["local", "group", "group_one_gpu", "node_pairs"] = "local"
    # Path variants, each in its own rank processes and exported with its `path` label:
    # default, pcie (P2P off: the host-memory path), ring, tree, nvls (netmon.probe.paths).
    paths: tuple[str, ...] = Field(("default",), json_schema_extra=also(ANY_TEXT))
    # pairs: a pair is suspect under this fraction of its path class's median busbw.
    suspect_ratio: float = Field(0.7, gt=0, le=1)
    # pairs: run the plan this many times and judge each pair's best (noise only slows).
    passes: int = Field(1, ge=1, le=10)
    # collective: all (every configured GPU, or none while one is busy) or idle (the largest
    # idle set, one NVLink island where possible, at least min_gpus; exported with `ranks`).
    # Pairs probes always measure whichever pairs are idle.
    gpus: Literal["all", "idle"] = "all"
    min_gpus: int = Field(2, ge=1, description="gpus: idle: the fewest GPUs worth a run")

    @field_validator("name")
    @classmethod
    def _label_safe(cls, value: str) -> str:
        if not _NAME.fullmatch(value):  # fullmatch: "$" would let a trailing newline in
            raise ValueError("use 1-32 characters: lowercase letters, digits, _ (a label value)")
        return value

    @field_validator("paths", mode="before")
    @classmethod
    def _paths(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, (list, tuple)):
            if not value:
                raise ValueError("give at least one path, like [default, pcie]")
            return check_names([str(v) for v in value])
        return value

    @field_validator("paths")
    @classmethod
    def _paths_run_op(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        # A check of op and paths together, kept on `paths` so the error names the field to fix
        # (probes[0].paths, --paths). `op` is declared first, so it is validated by now; it is
        # missing only when invalid, and then its own error is reported.
        op = info.data.get("op")
        if op is not None:
            check_op(value, op)
        return value

    @field_validator("sizes", mode="before")
    @classmethod
    def _sizes(cls, value: object) -> object:
        if isinstance(value, Mapping):
            extra = ", ".join(sorted(map(str, set(value) - {"min", "max", "factor"})))
            if extra or "min" not in value or "max" not in value:
                unknown = f"unknown key {extra}: " if extra else ""
                raise ValueError(f"{unknown}a sweep is {{min: 8, max: 64K, factor: 2}}")
            factor = value.get("factor", 2)
            if isinstance(factor, bool) or not isinstance(factor, int):
                raise ValueError(f"the sweep factor must be a whole number >= 2 (got {factor!r})")
            return size_sweep(_size(value["min"]), _size(value["max"]), factor)
        if isinstance(value, (str, int)):
            value = [part for part in str(value).split(",") if part.strip()]
        if isinstance(value, (list, tuple)):
            return tuple(_size(v) for v in value)
        return value

    @field_validator("sizes")
    @classmethod
    def _some_sizes(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or min(value) <= 0:
            raise ValueError("give one or more sizes > 0, like [8, 1K, 64K]")
        return value

    @field_validator("interval", "jitter", "timeout", mode="before")
    @classmethod
    def _durations(cls, value: object) -> object:
        return _duration(value)

    @field_validator("min_busbw", mode="before")
    @classmethod
    def _rate(cls, value: object) -> object:
        try:
            return parse_rate(value) if isinstance(value, (str, int, float)) else value
        except OverflowError:
            raise ValueError("the rate is too large") from None

    @field_validator("devices", mode="before")
    @classmethod
    def _device_list(cls, value: object) -> object:
        return _devices(value)

    @field_validator("gpus")
    @classmethod
    def _idle_set_is_local(cls, value: str, info: ValidationInfo) -> str:
        # kind and scope are declared first, so they are validated by now.
        kind, scope = info.data.get("kind"), info.data.get("scope")
        if value == "idle" and (kind != "collective" or scope != "local"):
            raise ValueError(
                f"idle is for local collectives (kind: collective, scope: local), not kind "
                f"{kind}, scope {scope}: drop gpus (pairs always run on the idle GPUs)"
            )
        return value

    @property
    def effective_jitter(self) -> float:
        return self.jitter if self.jitter is not None else round(self.interval * 0.1, 3)


class SiteExpectation(ExpectEntry):
    """An `expect:` entry: the busbw this site's healthy nodes of a GPU model reach at least, for
    series of one shape (docs/SIGNAL.md, "Expected levels"); it replaces the shipped table's
    figures for that shape."""

    @field_validator("path")
    @classmethod
    def _path_runs_op(cls, value: str, info: ValidationInfo) -> str:
        # op is declared first, so it is validated by now (missing only when invalid, and then
        # its own error is reported): the error names this entry's path, the field to fix.
        check_names([value])
        op = info.data.get("op")
        if op is not None:
            check_op([value], op)
        return value


class LoggingConfig(_Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["plain", "json"] = "plain"


class LinkTelemetryConfig(_Strict):
    """NVML's NVLink and PCIe state and error counters, read on their own schedule whether or not
    jobs run (NVML reads create no CUDA context and leave jobs alone)."""

    interval: float = Field(
        30.0,
        ge=0,
        description="seconds between reads; 0: off",
        json_schema_extra=also(DURATION_TEXT),
    )
    # gpu: per-GPU sums (links active, errors summed over links); link: per-link series as well.
    nvlink_detail: Literal["gpu", "link"] = "gpu"

    @field_validator("interval", mode="before")
    @classmethod
    def _every(cls, value: object) -> object:
        return _duration(value)


class NetmonConfig(_Strict):
    listen: str = "127.0.0.1:19464"
    state_dir: Path | None = None  # default: /var/lib/netmon as root, else ~/.local/state/netmon
    # A baseline state file that is there but unusable: set aside and counted, starting afresh
    # (continue), or the daemon refuses to start and leaves it in place (refuse).
    state_on_corrupt: Literal["continue", "refuse"] = "continue"
    backend: Backend | None = None  # default: nccl where GPUs are present, else gloo
    ranks: int | None = Field(None, ge=1, le=64, description="gloo only: CPU ranks")
    devices: tuple[str, ...] | None = Field(None, json_schema_extra=_DEVICES)
    pause_file: Path | None = Path("/run/netmon/pause")
    # Each file here pauses the GPUs it lists (indexes or UUIDs), or the node when it lists
    # none: how a Slurm prolog pauses only a job's GPUs (serve.pausing).
    pause_dir: Path | None = Path("/run/netmon/pause.d")
    link_telemetry: LinkTelemetryConfig = LinkTelemetryConfig()
    probes: tuple[ProbeConfig, ...] | None = None  # default: the embedded small and large probes
    idle: IdlePolicy = IdlePolicy()
    baseline: BaselinePolicy = BaselinePolicy()
    # The levels a young series is checked against before it has learned its own, over the
    # shipped table of published figures (netmon.baseline.expect).
    expect: tuple[SiteExpectation, ...] = ()
    logging: LoggingConfig = LoggingConfig()
    rank_python: str | None = None  # interpreter for rank processes; default: this one
    # How rank processes start: forked by the rank zygote, which imported torch once
    # (netmon.probe.forking), or each spawned as a new interpreter importing torch itself.
    rank_start: Literal["zygote", "spawn"] = "zygote"
    # Extra environment for every rank (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME...).
    env: dict[str, str] = Field(default_factory=dict)
    # A per-rank command prefix; {rank}, {gpu} and {numa} are replaced for every kind of probe
    # (probe.build): [numactl, "--cpunodebind={numa}"] on real nodes, [ip, netns, exec, "ns{gpu}"]
    # in tests. {numa} needs the GPUs' NUMA nodes (NVML or topology_file), checked at start.
    rank_wrapper: tuple[str, ...] = Field((), json_schema_extra=also(ANY_TEXT))
    # The address rank 0 binds for rendezvous; {gpu} is replaced by rank 0's GPU (pair probes).
    rendezvous_host: str = "127.0.0.1"
    # `nvidia-smi topo -m` output: the GPU topology when NVML cannot give it (CPU ranks, tests).
    topology_file: Path | None = None
    # Node group: the daemons that probe across nodes together (docs/GROUPS.md).
    group: GroupConfig | None = None
    # Cluster sweeps (`netmon sweep`, docs/SWEEPS.md); the daemon reads `sweep.verify_key_file`
    # and `sweep.secret_file` only: with either, POST /sweep takes this node's results and
    # /metrics exports them.
    sweep: SweepConfig | None = None
    # The jobs' own collectives: NCCL Inspector's files under `inspector.dir` (docs/INSPECTOR.md).
    inspector: InspectorConfig | None = None

    @field_validator("rank_wrapper", mode="before")
    @classmethod
    def _wrapper(cls, value: object) -> object:
        return tuple(shlex.split(value)) if isinstance(value, str) else value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        match = _LISTEN.fullmatch(value)
        if not match or not 0 <= int(match.group("port")) < 65536:
            raise ValueError("use HOST:PORT like 127.0.0.1:19464 or [::1]:19464 (port 0: any free)")
        return value

    @field_validator("devices", mode="before")
    @classmethod
    def _device_list(cls, value: object) -> object:
        return _devices(value)

    @model_validator(mode="after")
    def _group_probes_need_a_group(self) -> NetmonConfig:
        for probe in self.probes or ():
            if probe.scope != "local" and self.group is None:
                raise ValueError(f"probe {probe.name} has scope {probe.scope}: configure `group`")
            if probe.scope != "local" and probe.kind == "pairs":
                raise ValueError(f"probe {probe.name}: pairs probes are local (scope: local)")
        return self

    @model_validator(mode="after")
    def _one_level_per_entry(self) -> NetmonConfig:
        # Two entries for one shape and size: which one the daemon takes would be an accident.
        seen: set[tuple[str, int, str, str, int]] = set()
        for i, e in enumerate(self.expect):
            shape = (e.gpu_model.casefold(), e.gpus, e.op, e.path, e.size_bytes_min)
            if shape in seen:
                raise ValueError(
                    f"expect[{i}]: a second entry for {e.gpu_model} x{e.gpus} {e.op} {e.path} at "
                    f"{e.size_bytes_min} bytes; keep one"
                )
            seen.add(shape)
        return self

    @model_validator(mode="after")
    def _unique_probe_names(self) -> NetmonConfig:
        names = [p.name for p in self.probes or ()]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"probe names must be unique; repeated: {', '.join(duplicates)}")
        return self

    @property
    def listen_host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]") or "0.0.0.0"

    @property
    def listen_port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


def json_schema() -> JsonDict:
    """netmon.yaml's JSON schema, self-contained: what `check-config --schema` prints and the
    Helm chart validates `config` with (deploy/render.py writes it into values.schema.json)."""
    return self_contained(NetmonConfig.model_json_schema(mode="validation"))


def default_probes(gpus: int) -> tuple[ProbeConfig, ...]:
    """The embedded schedule: latency and one judged bandwidth size every minute, the largest
    sizes every 15 minutes."""
    if gpus:
        return (
            # 64 MiB is bandwidth-bound (judged: >= baseline.latency_bound_below) and about 0.3 ms
            # an op on NVLink, so a cut link is judged within minutes, not quarter hours
            # (docs/BENCHMARKS.md, "Duty cycle": its cost, estimated).
            ProbeConfig(name="small", sizes=(8, 256, 8 << 10, 64 << 10, 64 << 20), interval=60),
            ProbeConfig(
                name="large", sizes=(256 << 20, 512 << 20, 1 << 30), interval=900, timeout=600
            ),
        )
    # CPU ranks over loopback: sizes that take milliseconds, not minutes.
    return (
        ProbeConfig(name="small", sizes=(8, 1 << 10, 64 << 10), interval=60),
        ProbeConfig(name="large", sizes=(1 << 20, 16 << 20), interval=900),
    )


def resolve(config: NetmonConfig, gpus: int, mig: Sequence[int] = ()) -> NetmonConfig:
    """Fill in what depends on the machine: backend, ranks, devices, probes, state directory.
    `mig`: GPUs in MIG mode, left out of the devices netmon picks itself when others are not
    (netmon measures whole GPUs: with one MIG GPU among them, no probe of all would ever run);
    on a node of MIG GPUs only they stay, and every run says gpu_mig."""
    backend = config.backend or ("nccl" if gpus else "gloo")
    updates: dict[str, Any] = {"backend": backend}
    whole = [i for i in range(gpus) if i not in set(mig)] or list(range(gpus))
    if backend == "nccl" and config.devices is None:
        if not gpus:  # no devices: every run would fail building its spec (ranks 0)
            raise CouldNotRun("backend: nccl needs GPUs and none were found; use gloo or devices")
        updates["devices"] = tuple(str(i) for i in whole)
    if backend == "gloo" and config.ranks is None:
        updates["ranks"] = 2
    if config.probes is None:
        count = len(whole) if config.devices is None else gpus
        updates["probes"] = default_probes(count if backend == "nccl" else 0)
    if config.state_dir is None:
        root = os.geteuid() == 0
        updates["state_dir"] = (
            Path("/var/lib/netmon") if root else (Path.home() / ".local" / "state" / "netmon")
        )
    return config.model_copy(update=updates)
