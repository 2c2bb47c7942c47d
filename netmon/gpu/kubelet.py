"""Asks the kubelet which GPUs its device plugins gave to pods, as a guard around an idle source.

A GPU a pod was given may look idle to NVML while the pod's process has not started yet, or while
it stages data or serves nothing; probing it then could take memory the job is about to need. So
a pod holds its GPUs until the kubelet's own pod list says it has finished.
"""

from __future__ import annotations

import http.client
import logging
import os
import ssl
import stat
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from netmon.gpu import idle, idle_policy
from netmon.gpu.podresources import (
    DecodeError,
    PodPhases,
    decode_list_response,
    decode_pod_list,
    gpu_allocations,
)

log = logging.getLogger("netmon.gpu.kubelet")

LIST_METHOD = "/v1.PodResourcesLister/List"
TIMEOUT_S = 2.0
# How long the pod list's phases are taken as read. They only ever release a held GPU (a pod
# Succeeded or Failed; a pod not in the list keeps its hold), so an older list holds a GPU a
# little longer, never frees one early.
PODS_TTL_S = 10.0
# What the kubelet's own client accepts (defaultPodResourcesMaxSize in kubernetes'
# test/e2e_node/util.go); gRPC's 4 MiB default could cut off a node with many pods.
MAX_RESPONSE_BYTES = 16 << 20
# A PodList of a few hundred pods with their specs and managed fields is a few MiB.
MAX_POD_LIST_BYTES = 64 << 20
# A projected service-account token is a JWT of about 1 KiB.
_MAX_TOKEN_BYTES = 64 << 10
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


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _token(path: Path) -> str:
    """The bearer token, read afresh: the kubelet rewrites a projected token before it expires."""
    try:
        with open(path, "rb") as file:
            data = file.read(_MAX_TOKEN_BYTES + 1)
    except FileNotFoundError:
        raise KubeletError(f"{path}: no such file (is a service-account token mounted?)") from None
    except OSError as exc:
        raise KubeletError(f"{path}: {exc.strerror or type(exc).__name__}") from None
    token = data.strip()
    # Printable ASCII without spaces, so that it cannot break the header it goes into.
    if not token or len(data) > _MAX_TOKEN_BYTES or not all(33 <= b < 127 for b in token):
        raise KubeletError(f"{path}: not a bearer token")
    return token.decode("ascii")


def _tls(source: idle_policy.KubeletPods) -> ssl.SSLContext:
    if source.insecure_skip_verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    try:
        return ssl.create_default_context(cafile=source.ca_file)
    except OSError as exc:  # ssl.SSLError included
        why = exc.strerror or str(exc) or type(exc).__name__
        raise KubeletError(f"{source.ca_file}: cannot be read as CA certificates: {why}") from None


def _body(
    response: http.client.HTTPResponse,
    connection: http.client.HTTPConnection,
    deadline: float,
    url: str,
) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        if connection.sock is not None:
            connection.sock.settimeout(_remaining(deadline))
        chunk = response.read(1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_POD_LIST_BYTES:
            raise KubeletError(f"{url}: an answer larger than {MAX_POD_LIST_BYTES >> 20} MiB")
        chunks.append(chunk)


def _refused(url: str, response: http.client.HTTPResponse) -> KubeletError:
    hints = {
        401: " (the token was not accepted)",
        403: " (netmon's service account may not get nodes/pods; docs/DEPLOY.md)",
    }
    said = " ".join(response.read(300).decode("utf-8", "replace").split())
    hint = hints.get(response.status, "")
    return KubeletError(f"{url}: HTTP {response.status} {response.reason}{hint}: {said}")


def _get(source: idle_policy.KubeletPods, deadline: float) -> bytes:
    url = urlsplit(source.url)
    host, port = url.hostname or "", url.port
    headers = {"Accept": "application/json"}
    connection: http.client.HTTPConnection
    if url.scheme == "https":
        if source.token_file is not None:
            headers["Authorization"] = f"Bearer {_token(source.token_file)}"
        connection = http.client.HTTPSConnection(
            host, port or 10250, timeout=_remaining(deadline), context=_tls(source)
        )
    else:
        # A read-only port: the token is never sent in the clear.
        connection = http.client.HTTPConnection(host, port or 80, timeout=_remaining(deadline))
    target = (url.path or "/") + (f"?{url.query}" if url.query else "")
    try:
        connection.request("GET", target, headers=headers)
        if connection.sock is not None:
            connection.sock.settimeout(_remaining(deadline))
        response = connection.getresponse()
        if response.status != 200:
            raise _refused(source.url, response)
        return _body(response, connection, deadline, source.url)
    finally:
        connection.close()


def list_pods(source: idle_policy.KubeletPods, timeout: float = TIMEOUT_S) -> bytes:
    """The kubelet's GET /pods answer (a v1 PodList in JSON); KubeletError if it cannot be had
    in `timeout`: each wait, from the TCP connect on, gets what is left of it.

    A connection per call, as for the pod-resources socket; the token goes only over HTTPS.
    """
    try:
        return _get(source, time.monotonic() + timeout)
    except TimeoutError:  # socket.timeout as well
        raise KubeletError(f"{source.url}: no answer within {timeout:g} s") from None
    except ssl.SSLCertVerificationError as exc:
        raise KubeletError(
            f"{source.url}: the kubelet's certificate cannot be verified "
            f"({exc.verify_message}); set idle.kubelet_pods.ca_file to the CA that signed it"
        ) from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        # ValueError: a host name IDNA refuses, a NUL in a file name.
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise KubeletError(f"{source.url}: {' '.join(why.split())}") from None


def own_pod(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """netmon's own pod (namespace, name) from the downward API, whose GPUs are not a job's."""
    name = environ.get("POD_NAME", "").strip()
    namespace = environ.get("POD_NAMESPACE", "").strip()
    return (namespace, name) if name and namespace else None


class KubeletGuard:
    """An idle source that adds to each reading which pod, if any, holds the GPU.

    A pod holds the GPUs the pod-resources answer lists for it until the kubelet's pod list
    (`idle.kubelet_pods`) says it is Succeeded or Failed: a Running pod with nothing on its GPU
    may be staging data or waiting for requests. A phase that cannot be read keeps the hold.

    `policy` is read at every reading, so a reload that sets or clears `idle.kubelet_socket`
    takes effect at once; with no socket this is the wrapped source unchanged. Thread-safe as
    long as the wrapped source is.
    """

    def __init__(
        self,
        source: idle.IdleSource,
        policy: Callable[[], idle_policy.IdlePolicy],
        own: tuple[str, str] | None = None,
        lister: Callable[[Path, float], bytes] = list_pod_resources,
        pod_lister: Callable[[idle_policy.KubeletPods, float], bytes] = list_pods,
    ) -> None:
        self.source = source
        self.policy = policy
        self.own = own
        self.lister = lister
        self.pod_lister = pod_lister
        self._lock = threading.Lock()
        # What was logged, so that each is said once: errors of the socket and of the pod list
        # (until each answers again), and finished pods (while they stay listed).
        self._logged: set[str] = set()
        self._pods_logged: set[str] = set()
        self._finished: set[str] = set()
        # The last pod list read, and when: the whole PodList over a new TLS connection is not
        # fetched again at every idle reading (several a second while probes run).
        self._phases_read: tuple[float, str, PodPhases] | None = None
        self.clock: Callable[[], float] = time.monotonic

    def read(self) -> list[idle.GpuReading]:
        readings = self.source.read()
        policy = self.policy()
        socket = policy.kubelet_socket
        if socket is None or not readings:
            return readings
        try:
            pods = decode_list_response(self.lister(socket, TIMEOUT_S))
        except KubeletError as exc:
            return self._failed(readings, str(exc))
        except DecodeError as exc:
            return self._failed(readings, f"{socket}: unreadable answer: {exc}")
        self._answered(socket)
        held = gpu_allocations(pods, self.own)
        if held:
            # Only then: a node whose GPUs no pod holds is not asked for its pods.
            held = gpu_allocations(pods, self.own, self._phases(policy.kubelet_pods))
        self._note_finished(held.finished)
        return idle.with_allocations(readings, held)

    def _phases(self, source: idle_policy.KubeletPods | None) -> PodPhases:
        if source is None:
            why = "idle.kubelet_pods is not set"
            if self._first(self._pods_logged, why):
                log.info(
                    "kubelet pods: %s: a pod keeps its GPUs for as long as the kubelet lists "
                    "them, finished or not",
                    why,
                )
            return PodPhases.unread(why)
        with self._lock:
            cached = self._phases_read
        now = self.clock()
        if cached is not None and cached[1] == source.url and now - cached[0] < PODS_TTL_S:
            return cached[2]
        try:
            phases = PodPhases.of(decode_pod_list(self.pod_lister(source, TIMEOUT_S)))
        except KubeletError as exc:
            return self._pods_failed(str(exc))
        except DecodeError as exc:
            return self._pods_failed(f"{source.url}: unreadable answer: {exc}")
        if self._forget(self._pods_logged):
            log.info("kubelet pods: %s answers", source.url)
        with self._lock:
            self._phases_read = (now, source.url, phases)
        return phases

    def _pods_failed(self, error: str) -> PodPhases:
        if self._first(self._pods_logged, error):
            log.warning(
                "kubelet pods: %s; every pod the kubelet lists with a GPU keeps it until the "
                "phases can be read (gpu_allocated)",
                error,
            )
        return PodPhases.unread(error)

    def _note_finished(self, finished: tuple[str, ...]) -> None:
        with self._lock:
            new = [pod for pod in finished if pod not in self._finished]
            self._finished = set(finished)
        for pod in new:
            log.info(
                "kubelet: pod %s has finished, though the pod-resources answer still lists its "
                "devices (kubernetes issue 119423): its GPUs may be probed",
                pod,
            )

    def _first(self, seen: set[str], error: str) -> bool:
        """Whether `error` is new to `seen`, which then remembers it (up to a bound)."""
        with self._lock:
            new = error not in seen and len(seen) < _REMEMBERED_ERRORS
            if new:
                seen.add(error)
        return new

    def _forget(self, seen: set[str]) -> bool:
        """Empties `seen`; whether it held anything."""
        with self._lock:
            held = bool(seen)
            seen.clear()
        return held

    def _failed(self, readings: list[idle.GpuReading], error: str) -> list[idle.GpuReading]:
        if self._first(self._logged, error):
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
        if self._forget(self._logged):
            log.info("kubelet pod-resources: %s answers again", socket)
