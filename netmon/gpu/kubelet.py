"""Asks the kubelet which GPUs its device plugins gave to pods, as a guard around an idle source.

A GPU a pod was given may look idle to NVML while the pod's process has not started yet; probing
it then could take memory the job is about to need.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from netmon.gpu import idle
from netmon.gpu.podresources import DecodeError, decode_list_response, gpu_allocations

log = logging.getLogger("netmon.gpu.kubelet")

LIST_METHOD = "/v1.PodResourcesLister/List"
TIMEOUT_S = 2.0
# What the kubelet's own client accepts (defaultPodResourcesMaxSize in kubernetes'
# test/e2e_node/util.go); gRPC's 4 MiB default could cut off a node with many pods.
MAX_RESPONSE_BYTES = 16 << 20
# Distinct errors remembered for "log once"; a bound, should error texts ever vary without end.
_REMEMBERED_ERRORS = 32


class KubeletError(Exception):
    """The kubelet could not be asked, or its answer could not be read; one line."""


def _raw(data: bytes) -> bytes:
    # No generated code: the request is empty and the answer is decoded by netmon.gpu.podresources.
    return data


def _socket_problem(socket: Path) -> str | None:
    """Plain words for the usual deployment mistakes, before gRPC's longer text."""
    try:
        mode = socket.stat().st_mode
    except FileNotFoundError:
        return "no such socket (is /var/lib/kubelet/pod-resources mounted into the container?)"
    except PermissionError:
        return "permission denied on its directory (the kubelet's is root's, mode 0750)"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    if not stat.S_ISSOCK(mode):
        return "not a unix socket"
    if not os.access(socket, os.W_OK):
        # Connecting to a unix socket needs write permission on it.
        return "permission denied (the socket is root's; docs/DEPLOY.md says what netmon needs)"
    return None


def list_pod_resources(socket: Path, timeout: float = TIMEOUT_S) -> bytes:
    """The kubelet's raw ListPodResourcesResponse; KubeletError if it cannot be had in `timeout`.

    A channel per call: one call costs about a millisecond on a unix socket, and a channel that
    outlives its call would have to survive kubelet restarts (which replace the socket) and
    reloads that change the path. The `with` closes it, connection included.
    """
    problem = _socket_problem(socket)
    if problem is not None:
        raise KubeletError(f"{socket}: {problem}")
    import grpc  # here: a daemon that never asks the kubelet never loads gRPC

    options = [
        ("grpc.max_receive_message_length", MAX_RESPONSE_BYTES),
        # Not shared with other channels, so closing this one closes its connection.
        ("grpc.use_local_subchannel_pool", 1),
    ]
    try:
        with grpc.insecure_channel(f"unix://{socket}", options=options) as channel:
            call = channel.unary_unary(
                LIST_METHOD, request_serializer=_raw, response_deserializer=_raw
            )
            # wait_for_ready stays False: a kubelet that is down fails at once, not at timeout.
            answer: bytes = call(b"", timeout=timeout)
            return answer
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        name = code.name if code is not None else "error"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise KubeletError(f"{socket}: no answer within {timeout:g} s") from None
        raise KubeletError(f"{socket}: {name}: {' '.join(str(details).split())}") from None


def own_pod(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """netmon's own pod (namespace, name) from the downward API, whose GPUs are not a job's."""
    name = environ.get("POD_NAME", "").strip()
    namespace = environ.get("POD_NAMESPACE", "").strip()
    return (namespace, name) if name and namespace else None


class KubeletGuard:
    """An idle source that adds to each reading which pod, if any, holds the GPU.

    `policy` is read at every reading, so a reload that sets or clears `idle.kubelet_socket`
    takes effect at once; with no socket this is the wrapped source unchanged. Thread-safe as
    long as the wrapped source is.
    """

    def __init__(
        self,
        source: idle.IdleSource,
        policy: Callable[[], idle.IdlePolicy],
        own: tuple[str, str] | None = None,
        lister: Callable[[Path, float], bytes] = list_pod_resources,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.policy = policy
        self.own = own
        self.lister = lister
        self.clock = clock
        self._lock = threading.Lock()
        self._logged: set[str] = set()
        # (GPU UUID, pod) -> when the pod was last seen given the GPU with no process on it yet,
        # or with one running: an allocation idle longer than kubelet_stale_after is finished.
        self._quiet_since: dict[tuple[str, str], float] = {}
        self._finished_logged: set[tuple[str, str]] = set()

    def read(self) -> list[idle.GpuReading]:
        readings = self.source.read()
        socket = self.policy().kubelet_socket
        if socket is None or not readings:
            return readings
        try:
            pods = decode_list_response(self.lister(socket, TIMEOUT_S))
        except KubeletError as exc:
            return self._failed(readings, str(exc))
        except DecodeError as exc:
            return self._failed(readings, f"{socket}: unreadable answer: {exc}")
        self._answered(socket)
        given = idle.with_allocations(readings, gpu_allocations(pods, self.own))
        return self._without_finished(given)

    def _without_finished(self, readings: list[idle.GpuReading]) -> list[idle.GpuReading]:
        """Readings whose allocation has outlived any sign of its pod: a pod listed with a GPU
        but no process on it for kubelet_stale_after seconds is taken as finished (some kubelets
        list pods in a terminal phase, kubernetes issue 119423). A process on the GPU, or a new
        allocation, starts the count again."""
        stale_after = self.policy().kubelet_stale_after
        now = self.clock()
        out, seen = [], set()
        with self._lock:
            for reading in readings:
                pod = reading.allocated_to
                if pod is None:
                    out.append(reading)
                    continue
                key = (reading.uuid, pod)
                seen.add(key)
                if reading.compute_pids or key not in self._quiet_since:
                    self._quiet_since[key] = now
                quiet = now - self._quiet_since[key]
                if stale_after and quiet >= stale_after:
                    self._note_finished(key, reading, quiet)
                    reading = dataclasses.replace(reading, allocated_to=None)
                out.append(reading)
            for key in set(self._quiet_since) - seen:
                del self._quiet_since[key]
            self._finished_logged &= seen
        return out

    def _note_finished(self, key: tuple[str, str], reading: idle.GpuReading, quiet: float) -> None:
        """Said once per allocation (the caller holds the lock)."""
        if key not in self._finished_logged:
            self._finished_logged.add(key)
            log.info(
                "kubelet pod-resources: %s given to %s with no process on it for %.0f s: taken "
                "as a finished pod (idle.kubelet_stale_after); it may be probed",
                reading.name(),
                key[1],
                quiet,
            )

    def _failed(self, readings: list[idle.GpuReading], error: str) -> list[idle.GpuReading]:
        with self._lock:
            new = error not in self._logged and len(self._logged) < _REMEMBERED_ERRORS
            if new:
                self._logged.add(error)
        if new:
            # Once per distinct error until the kubelet answers again: every probe would
            # otherwise repeat it, up to once a second while one runs.
            busy = self.policy().unknown_is_busy
            log.warning(
                "kubelet pod-resources: %s; %s until it answers",
                error,
                "no GPU is probed (kubelet_error)" if busy else "NVML alone decides what is idle",
            )
        return idle.allocation_unknown(readings, error)

    def _answered(self, socket: Path) -> None:
        with self._lock:
            recovered = bool(self._logged)
            self._logged.clear()
        if recovered:
            log.info("kubelet pod-resources: %s answers again", socket)
