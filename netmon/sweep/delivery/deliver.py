"""Each node's share of a sweep, delivered to its own daemon (POST /sweep, signed by the sweep
host's key or sealed with the sweep secret), which exports it on /metrics: results reach
Prometheus the way every other netmon figure does, scraped, with no Pushgateway. A daemon that
cannot be reached misses one sweep's figures; the sweep's verdict does not depend on it."""

from __future__ import annotations

import base64
import logging
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from netmon.group.auth import Sealer
from netmon.sweep.delivery.node_report import SEAL_GROUP, NodeReport, seal_key
from netmon.sweep.delivery.signing import Seals

log = logging.getLogger(__name__)
TIMEOUT_S = 5.0
MAX_PARALLEL = 32


def _url(scheme: str, address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{port}/sweep"


def _post(url: str, body: bytes, context: ssl.SSLContext | None, authorization: str | None) -> str:
    headers = {"Content-Type": "text/plain; charset=utf-8"}
    if authorization:
        headers["Authorization"] = authorization
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context) as answer:
            return "ok" if answer.status in (200, 204) else f"HTTP {answer.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}: {exc.read(200).decode(errors='replace').strip()}"
    except (OSError, ValueError) as exc:
        return f"unreachable: {exc}"


def deliver(
    reports: Sequence[NodeReport],
    addresses: Mapping[str, str],
    secret: bytes | Seals,
    *,
    scheme: str = "http",
    port: int = 19464,
    ca_file: Path | None = None,
    basic_auth: tuple[str, str] | None = None,
) -> dict[str, str]:
    """{node: "ok" or why not} for every report. Each is stamped when it is sealed: the
    daemons take it only while it is fresh (netmon.group.auth.MAX_AGE_S). `secret`: the sweep
    host's signer (netmon.sweep.delivery.signing), or the shared sweep secret."""
    sealer = Sealer(SEAL_GROUP, secret) if isinstance(secret, bytes) else secret
    context = ssl.create_default_context(cafile=str(ca_file)) if scheme == "https" else None

    authorization = None
    if basic_auth is not None:
        token = base64.b64encode(":".join(basic_auth).encode()).decode()
        authorization = f"Basic {token}"

    def one(report: NodeReport) -> tuple[str, str]:
        stamped = report.model_copy(update={"at": time.time()})
        body = sealer.seal(seal_key(report.node), stamped.model_dump(mode="json")).encode()
        url = _url(scheme, addresses.get(report.node, report.node), port)
        outcome = _post(url, body, context, authorization)
        if outcome != "ok":
            log.warning("sweep: report for %s not delivered to %s: %s", report.node, url, outcome)
        return report.node, outcome

    if not reports:
        return {}
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(reports))) as pool:
        return dict(pool.map(one, reports))
