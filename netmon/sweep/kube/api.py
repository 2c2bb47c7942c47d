"""The Kubernetes API server, over its REST API with the standard library: a sweep lists nodes,
pods and Kueue Workloads (page by page), creates and deletes JobSets, reads the end of pod
logs, and needs no more. Whatever goes wrong on the way is a SchedulerError.

In a pod it uses the pod's service account (its token and the cluster's CA under
/var/run/secrets/kubernetes.io/serviceaccount) and KUBERNETES_SERVICE_HOST/PORT; elsewhere (and
in tests) an explicit server, token and CA. The token is read again for every request, since
the kubelet rotates a projected token while a sweep runs.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netmon.errors import UsageError
from netmon.sweep.kube.settings import KubernetesSweep
from netmon.sweep.scheduler import SchedulerError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
REQUEST_TIMEOUT_S = 10.0
# Every list is read in pages, as kubectl reads them: a page of a large cluster's pods stays
# far under MAX_ANSWER_BYTES, and a list of more than MAX_PAGES pages is refused, not read
# forever.
PAGE_SIZE = 500
MAX_PAGES = 1000
MAX_ANSWER_BYTES = 64 << 20
# A pod's log: its last lines, where the ranks' reports and the pod's own last line are, however
# much NCCL_DEBUG wrote before them; of those, at most MAX_LOG_BYTES, the last.
LOG_TAIL_LINES = 5000
MAX_LOG_BYTES = 2 << 20
READ_CHUNK = 1 << 16


class NotFound(SchedulerError):
    """The API server has no such object (HTTP 404)."""


@dataclass(frozen=True)
class ApiTarget:
    server: str  # https://host:port
    token_file: Path | None
    ca_file: Path | None


def api_target(settings: KubernetesSweep, environ: Mapping[str, str]) -> ApiTarget:
    if settings.api_server:
        return ApiTarget(settings.api_server, settings.token_file, settings.ca_file)
    host = environ.get("KUBERNETES_SERVICE_HOST")
    if not host:
        raise UsageError(
            "sweep.kubernetes.api_server: not in a pod (no KUBERNETES_SERVICE_HOST): "
            "set the API server's URL, token_file and ca_file"
        )
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    host = f"[{host}]" if ":" in host else host
    return ApiTarget(
        f"https://{host}:{port}",
        settings.token_file or SERVICE_ACCOUNT / "token",
        settings.ca_file or SERVICE_ACCOUNT / "ca.crt",
    )


def _status_message(body: bytes) -> str:
    """The message of the API server's Status answer, else the body's first line."""
    try:
        return str(json.loads(body)["message"])
    except (ValueError, KeyError, TypeError, RecursionError):
        text = body.decode(errors="replace").strip()
        return (text.splitlines() or ["no message"])[0][:200]


class KubeApi:
    def __init__(self, target: ApiTarget, timeout: float = REQUEST_TIMEOUT_S) -> None:
        self.target = target
        self.timeout = timeout
        self._context: ssl.SSLContext | None = None
        if target.server.startswith("https://"):
            try:
                cafile = str(target.ca_file) if target.ca_file else None
                self._context = ssl.create_default_context(cafile=cafile)
            except (OSError, ssl.SSLError) as exc:
                reason = getattr(exc, "strerror", None) or exc
                raise UsageError(f"sweep.kubernetes.ca_file: {target.ca_file}: {reason}") from None
        self.max_answer = MAX_ANSWER_BYTES
        self._token(UsageError)  # a token that cannot be read at the start is a usage error

    def _token(self, error: type[Exception] = SchedulerError) -> str | None:
        """The token, read again each time; unreadable mid-sweep, the API cannot be asked."""
        path = self.target.token_file
        if path is None:
            return None
        try:
            return path.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            raise error(f"sweep.kubernetes.token_file: {path}: {reason}") from None

    def _request(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        timeout: float | None = None,
        tail: int | None = None,
    ) -> bytes:
        """The answer's body: whole up to max_answer bytes (more is an error), or only its
        last `tail` bytes. Every failure is a SchedulerError (NotFound for a 404)."""
        url = self.target.server + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        wait = self.timeout if timeout is None else max(1.0, timeout)
        try:
            with urllib.request.urlopen(request, timeout=wait, context=self._context) as answer:
                return _read_tail(answer, tail) if tail else self._read_whole(answer, method, path)
        except urllib.error.HTTPError as exc:
            message = f"{method} {path}: HTTP {exc.code}: {_status_message(_error_body(exc))}"
            raise (NotFound if exc.code == 404 else SchedulerError)(message) from None
        except (OSError, ValueError, http.client.HTTPException) as exc:
            # Refused, timed out, TLS, a bad URL, an answer cut short or not HTTP.
            reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
            raise SchedulerError(f"the API server {self.target.server}: {reason}") from None

    def _read_whole(self, answer: Any, method: str, path: str) -> bytes:
        data = bytes(answer.read(self.max_answer + 1))
        if len(data) > self.max_answer:
            raise SchedulerError(
                f"{method} {path}: the answer passes {self.max_answer} bytes; not read"
            )
        return data

    def get(
        self, path: str, query: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        data = self._request("GET", path, query, timeout=timeout)
        try:
            answer = json.loads(data)
        except (ValueError, RecursionError):
            start = data[:80].decode(errors="replace").strip() or "empty"
            raise SchedulerError(f"GET {path}: the answer is not JSON: {start!r}") from None
        if not isinstance(answer, dict):
            raise SchedulerError(f"GET {path}: the answer is not a JSON object")
        return answer

    def items(
        self, path: str, query: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """Every item of a list, page by page (`limit` and `continue`)."""
        asked = {**(query or {}), "limit": str(PAGE_SIZE)}
        found: list[dict[str, Any]] = []
        for _ in range(MAX_PAGES):
            answer = self.get(path, asked, timeout)
            page = answer.get("items") or []
            if not isinstance(page, list) or not all(isinstance(item, dict) for item in page):
                raise SchedulerError(f"GET {path}: the answer's items are not a list of objects")
            found += page
            meta = answer.get("metadata") or {}
            token = meta.get("continue") if isinstance(meta, dict) else None
            if not token:
                return found
            if not isinstance(token, str):
                raise SchedulerError(f"GET {path}: the answer's continue token is not a string")
            asked["continue"] = token
        raise SchedulerError(f"GET {path}: more than {MAX_PAGES} pages of {PAGE_SIZE}; not read")

    def log(self, path: str, container: str, timeout: float | None = None) -> str:
        """The end of a container's log: its last LOG_TAIL_LINES lines, at most MAX_LOG_BYTES."""
        query = {"container": container, "tailLines": str(LOG_TAIL_LINES)}
        data = self._request("GET", path, query, timeout=timeout, tail=MAX_LOG_BYTES)
        return data.decode(errors="replace")

    def create(self, path: str, body: Mapping[str, Any], timeout: float | None = None) -> None:
        """Create, refused (422) with a field the API server does not know, as kubectl
        --validate=strict is: by default it would drop the field with a warning."""
        query = {"fieldValidation": "Strict"}
        self._request("POST", path, query, body=body, timeout=timeout)

    def delete(self, path: str, timeout: float | None = None) -> None:
        """Delete, the dependents in the background; already gone is fine."""
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        with contextlib.suppress(NotFound):
            self._request("DELETE", path, body=options, timeout=timeout)


def _read_tail(answer: Any, keep: int) -> bytes:
    """The last `keep` bytes of the answer, read to its end in chunks."""
    kept = bytearray()
    while chunk := answer.read(READ_CHUNK):
        kept += chunk
        if len(kept) > keep:
            del kept[:-keep]
    return bytes(kept)


def _error_body(exc: urllib.error.HTTPError) -> bytes:
    try:
        return bytes(exc.read(4096))
    except (OSError, http.client.HTTPException):
        return b""
