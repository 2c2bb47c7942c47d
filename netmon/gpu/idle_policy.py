"""When a GPU counts as idle: the `idle:` settings, and where the kubelet is asked
(gpu/idle.py decides with them)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from netmon.bandwidth import MAX_MEMORY_SIZE, bounded_size
from netmon.schema import SIZE_TEXT, also


class KubeletPods(BaseModel):
    """Where the kubelet's own list of its pods is read, for the phase of each pod holding a GPU."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Its HTTPS port, https://<node IP>:10250/pods ("[...]" around an IPv6 address). An http://
    # URL (a read-only port) is asked without the token.
    url: str
    # A service-account token whose account may get nodes/pods (docs/DEPLOY.md); read at every
    # request, as the kubelet rotates projected tokens in place. None: no token is sent.
    token_file: Path | None = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    # The CA that signed the kubelet's serving certificate; None: the system's CAs.
    ca_file: Path | None = None
    # For kubelets with self-signed serving certificates: the token then goes to whoever answers.
    insecure_skip_verify: bool = False

    @field_validator("token_file", "ca_file", mode="before")
    @classmethod
    def _blank_is_none(cls, value: object) -> object:
        # An empty NETMON_IDLE__KUBELET_PODS__CA_FILE= means none, not the current directory.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        text = value.strip()
        try:
            parts = urlsplit(text)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
        except ValueError:  # a port that is no number, a malformed IPv6 address
            ok = False
        if not ok:
            raise ValueError("use a URL like https://10.0.0.5:10250/pods")
        return text


class IdlePolicy(BaseModel):
    """When a GPU counts as idle. Every limit must hold in every sample."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    samples: int = Field(default=3, ge=1, description="readings taken before a probe")
    # NVML averages utilization over its own window (1/6 s to 1 s by product), so readings closer
    # than that overlap; several of them still catch a job that is between kernels in one.
    sample_interval: float = Field(default=0.2, ge=0, description="seconds between readings")
    # NVML reports whole percents: the default 5 means "0-4 %"; 1 means "0 % exactly".
    max_utilization: float = Field(default=5.0, gt=0, description="percent; busy at or above this")
    # Counts memory of processes that are not ours (the total minus our own processes' share).
    max_memory_used: int = Field(
        default=1 << 30,
        ge=0,
        le=MAX_MEMORY_SIZE,
        json_schema_extra=also(SIZE_TEXT),
        description="bytes; busy above this",
    )
    skip_mig: bool = True
    # EXCLUSIVE_PROCESS: our rank's context would stop a job's process from starting on the GPU.
    require_default_compute_mode: bool = True
    # A reading NVML could not take (utilization, memory, the process list) blocks probing: a GPU
    # we cannot see into may be running a job. False trusts whatever could be read. The same
    # holds for a kubelet that cannot be asked (kubelet_socket).
    unknown_is_busy: bool = True
    # The kubelet's pod-resources socket (Kubernetes): a GPU a device plugin gave to a pod other
    # than netmon's own is busy even before the pod's process starts. None (default): not asked.
    kubelet_socket: Path | None = None
    # Some kubelets also list finished pods with their devices (kubernetes issue 119423), so the
    # kubelet's pod list is read for each holder's phase: only a pod listed as Succeeded or
    # Failed gives its GPU back. None, or a list that cannot be read: every holder keeps it.
    kubelet_pods: KubeletPods | None = None

    @field_validator("max_memory_used", mode="before")
    @classmethod
    def _memory_size(cls, value: object) -> object:
        # A configuration file says "1G" (binary, as every size in netmon).
        if isinstance(value, str):
            return bounded_size(value, MAX_MEMORY_SIZE, "a GPU's memory may be")
        return value

    @field_validator("kubelet_socket", "kubelet_pods", mode="before")
    @classmethod
    def _socket_or_off(cls, value: object) -> object:
        # NETMON_IDLE__KUBELET_SOCKET= (empty) turns it off, as leaving it out of the file does.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("kubelet_socket")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_absolute():
            raise ValueError(
                "use an absolute path, like /var/lib/kubelet/pod-resources/kubelet.sock"
            )
        return value
