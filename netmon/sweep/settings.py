"""The `sweep:` section of netmon.yaml: how `netmon sweep` runs its pairs and where it delivers
their results, and (on a node's daemon) the secret that the delivered reports are sealed with."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from netmon.bandwidth import MAX_PROBE_SIZE, bounded_size, parse_duration, parse_rate
from netmon.schema import DURATION_TEXT, RATE_TEXT, SIZE_TEXT, also
from netmon.sweep.kube.settings import KubernetesSweep


class SweepConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # The shared secret that seals each node's report (HMAC-SHA256, netmon.group.auth). A daemon
    # without it refuses every report; `netmon sweep` without it measures but delivers nothing.
    # Every node holds it, so any node can forge a report: the key pair below cannot be forged.
    secret_file: Path | None = None
    # The sweep host's Ed25519 private key (PEM): it signs each node's report (`netmon sweep`),
    # over secret_file where both are set. A daemon's verify_key_file is its public key: with
    # it, the daemon takes only reports the sweep host signed (netmon.sweep.delivery.signing).
    signing_key_file: Path | None = None
    verify_key_file: Path | None = None
    # Where `netmon sweep` reaches each node's daemon: the node's Slurm address, this port.
    daemon_port: int = Field(19464, ge=1, lt=65536)
    daemon_scheme: Literal["http", "https"] = "http"
    ca_file: Path | None = None  # https: the CA that signed the daemons' certificates
    # Where the daemons' web-config asks for basic auth: the user, and a file with the password.
    daemon_username: str | None = None
    daemon_password_file: Path | None = None
    # Where the pairs run: Slurm jobs, or JobSets on Kubernetes admitted by Kueue (`kubernetes`).
    scheduler: Literal["slurm", "kubernetes"] = "slurm"
    kubernetes: KubernetesSweep = Field(default_factory=KubernetesSweep)
    partition: str | None = None  # default for --partition
    qos: str | None = None  # a preemptible QOS, where preemption is by QOS
    account: str | None = None
    # The pair's all_reduce: one size, large enough to be bandwidth-bound (gloo on the CPU).
    size: int = Field(16 << 20, ge=1024, le=MAX_PROBE_SIZE, json_schema_extra=also(SIZE_TEXT))
    warmup: int = Field(3, ge=0)
    iters: int = Field(10, ge=1)
    # A GPU pair's (NCCL): 16 MiB x 10 is some 3.5 ms of traffic on a 400 Gb/s rail, too
    # little to be bandwidth-bound; 1 GiB x 20 is some 4.5 s.
    nccl_size: int = Field(1 << 30, ge=1024, le=MAX_PROBE_SIZE, json_schema_extra=also(SIZE_TEXT))
    nccl_iters: int = Field(20, ge=1)
    # Ranks per node, one per rail (rank k uses GPU k and the NIC nearest it); default: the
    # node's GPUs (its Slurm gres), 1 on nodes without GPUs.
    rails: int | None = Field(None, ge=1, le=64)
    # bytes/s: a pair under it fails
    min_busbw: float | None = Field(None, ge=0, json_schema_extra=also(RATE_TEXT))
    # nccl on nodes with GPUs (their Slurm gres), gloo on the CPU otherwise.
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    # Rail k's rendezvous listens on this port + k on the pair's first node.
    rendezvous_port: int = Field(29410, ge=1024, lt=65000)
    # The interpreter that runs netmon.sweep.ranks.rank on the nodes; default: this one (the same
    # install path on every node, as a shared software tree or an image gives).
    rank_python: str | None = None
    # A pair's cohort line: under ratio x the cohort's level (the upper quartile of its class).
    cohort_ratio: float = Field(0.8, gt=0, le=1)
    min_cohort: int = Field(2, ge=2)  # fewer pairs of a class than this: no cohort line
    # The cohort line is also this many spreads under the level (the daemon's is 3: a sweep
    # draws thousands of lines at once; docs/SWEEPS.md).
    spread_k: float = Field(4.0, ge=0)
    # Seconds from a pair's submission until all its ranks have met (Slurm): on a busy queue a
    # pair starts only at a backfill pass (every 30 s by default, longer on a large cluster).
    # A pair not started by then is `busy`, one started whose ranks did not meet `timeout`.
    launch_timeout: float = Field(120.0, gt=0, json_schema_extra=also(DURATION_TEXT))
    # Seconds one pair may run once its ranks have met (Slurm; on Kubernetes, queue included);
    # a confirming pair, which measures confirm_repeats times as long, may take that many
    # times it (pair_timeout_for).
    pair_timeout: float = Field(300.0, gt=0, json_schema_extra=also(DURATION_TEXT))
    # seconds the whole sweep may take
    deadline: float = Field(1800.0, gt=0, json_schema_extra=also(DURATION_TEXT))
    # The fabric, for round 1 inside scalable units and for naming uplinks: "slurm" (the
    # topology/tree plugin's switches, `scontrol show topology`), "flat" (every node under one
    # switch per rail), or a path to a topology.conf or a fabric file (docs/SWEEPS.md,
    # "Uplinks"); unset: the scheduler's switches where it lists any, else none
    # (netmon.sweep.locate.blind: what a sweep claims without one).
    fabric: str | None = None
    routing: Literal["table", "ecmp"] = (
        "table"  # how leaves pick an uplink (netmon.sweep.locate.fabric)
    )
    # Without a fabric (none given, and the scheduler lists no switches), more nodes than this
    # may span leaves: the sweep refuses rather than name contention as bad nodes
    # (netmon.sweep.locate.blind). Raise it only for a cluster known to sit under one switch.
    max_nodes_without_fabric: int = Field(64, ge=2)
    # A path is named in round 4: each end passes with two other partners first.
    max_rounds: int = Field(4, ge=1, le=10)
    # A pair that can name a node, a path or an uplink runs this many times `iters`: one slow
    # stretch of a measurement then does not name a healthy node (docs/SWEEPS.md).
    confirm_repeats: int = Field(3, ge=1, le=10)
    # An odd node out joins a pair of three ("trio") or waits for the next sweep ("wait").
    odd: Literal["trio", "wait"] = "trio"
    job_name: str = Field("netmon-sweep", pattern=r"^[A-Za-z0-9_.-]{1,40}$")
    state_dir: Path | None = None  # each end's history; default: <state_dir>/sweep
    # The node's netmon config, read by the pair's ranks on the node for its `env`
    # (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME: the interface that carries the traffic).
    node_config: Path = Path("/etc/netmon/netmon.yaml")

    @field_validator("min_busbw", mode="before")
    @classmethod
    def _rate(cls, value: object) -> object:
        return parse_rate(value) if isinstance(value, (str, int, float)) else value

    @field_validator("size", "nccl_size", mode="before")
    @classmethod
    def _size(cls, value: object) -> object:
        if isinstance(value, str):
            return bounded_size(value, MAX_PROBE_SIZE, "a pair moves")
        return value

    @field_validator("launch_timeout", "pair_timeout", "deadline", mode="before")
    @classmethod
    def _seconds(cls, value: object) -> object:
        return parse_duration(value) if isinstance(value, str) else value

    def pair_timeout_for(self, repeats: int) -> float:
        """The time a pair that measures `repeats` times `iters` may take: a confirming pair
        cut at the usual pair's timeout would come out `timeout` exactly when it matters."""
        return self.pair_timeout * max(1, repeats)
