"""The HTTP server of /metrics, /healthz and /, and of POST /sweep where the daemon takes sweep
reports, bounded against hostile or broken clients (request heads and bodies under size limits
and one deadline, connections capped, TLS handshakes off the accept loop; docs/SECURITY.md gives
the reasons). What a POSTed body means is the `on_sweep` callback's business, not the server's.
"""

from __future__ import annotations

import http.client
import io
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from netmon.exposition.formats import Page, negotiate

if TYPE_CHECKING:
    from netmon.exposition.webconfig import WebConfigReloader, WebSecurity

log = logging.getLogger(__name__)

# What a client may send before it is answered. Prometheus sends a request line of a few dozen
# bytes and well under 1 KiB of headers; Apache's defaults are of the same order.
MAX_REQUEST_LINE = 8192
MAX_HEADER_BYTES = 16384
# A body (never expected) up to this size is read and dropped; a larger one closes the connection.
MAX_DISCARDED_BODY = 65536
# POST /sweep: a larger body is refused (413) unread, and the connection closed.
MAX_POST_BODY = 65536
# The request line and headers must arrive within this many seconds of the server starting to wait
# for them, however slowly the bytes trickle in; each response write is bounded by it too.
REQUEST_TIMEOUT_S = 10.0
# Connections served at once, one thread each; past that, new ones wait in the listen backlog.
# Prometheus' own --web.max-connections default; measured: 500 idle connections cost 13 MB and
# left a scrape at 1.8 ms (1.4 ms without them). It also keeps a flood short of the fd limit.
MAX_CONNECTIONS = 512
# How often, at most, a server started with --web-config compares the contents of its files: up
# to four small files read a second, whatever the rate of connections (see WebConfigReloader).
WEB_CONFIG_CHECK_S = 1.0
TEXT = "text/plain; charset=utf-8"

# What POST /sweep does with a body: the HTTP status and a one-line answer.
BodyHandler = Callable[[bytes], tuple[int, str]]


class _DeadlineReader(io.RawIOBase):
    """Socket reads under one deadline for the whole request head, so trickling is cut off."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.deadline = float("inf")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        if left != float("inf"):
            self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _HeadLimit:
    """The request's rfile while its headers are parsed: at most `budget` bytes in all."""

    def __init__(self, rfile: Any, budget: int) -> None:
        self._rfile = rfile
        self._budget = budget

    def readline(self, limit: int = -1) -> bytes:
        size = self._budget + 1 if limit < 0 else min(limit, self._budget + 1)
        line: bytes = self._rfile.readline(size)
        self._budget -= len(line)
        if self._budget < 0:
            # parse_request answers 431 to this.
            raise http.client.HTTPException(f"headers over {MAX_HEADER_BYTES} bytes")
        return line


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    protocol_version = "HTTP/1.1"
    server_version = "netmon"

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.request_timeout)
        self.rfile.close()
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        """BaseHTTPRequestHandler's, with bounds on the time and size of the request head."""
        self._reader.deadline = time.monotonic() + self.server.request_timeout
        try:
            self.raw_requestline = self.rfile.readline(MAX_REQUEST_LINE + 1)
            if not self.raw_requestline:
                self.close_connection = True
                return
            if len(self.raw_requestline) > MAX_REQUEST_LINE:
                self.requestline = self.request_version = self.command = ""
                self.send_error(414)  # and closes the connection
                return
            rfile, self.rfile = self.rfile, _HeadLimit(self.rfile, MAX_HEADER_BYTES)  # type: ignore[assignment]
            try:
                if not self.parse_request():
                    return  # parse_request has answered 400, 431 or 505
            finally:
                self.rfile = rfile
            if self.command == "POST" and self._route() == "/sweep":
                self.do_POST()  # reads the body it takes, under the same deadline
            else:
                self._skip_body()
                self._reader.deadline = float("inf")
                self._dispatch()
            self.wfile.flush()
        except TimeoutError as exc:
            self.log_error("request timed out: %r", exc)
            self.close_connection = True

    def _dispatch(self) -> None:
        if self.command == "GET":
            self.do_GET()
        elif self.command == "HEAD":
            self.do_HEAD()
        else:
            self._not_allowed()

    def _route(self) -> str:
        return self.path.split("?", 1)[0]

    def _authorized(self, before_refusal: Callable[[], None] | None = None) -> bool:
        """True to serve; else the refusal is sent (after `before_refusal`): 401, or 429 and close
        when bcrypt is busy or this client has failed too often (webconfig.BasicAuth)."""
        auth = self.server.security.auth if self.server.security else None
        if auth is None:
            return True
        verdict = auth.verify(self.headers["Authorization"], str(self.client_address[0]))
        if verdict.name == "OK":
            return True
        if before_refusal is not None:
            before_refusal()
        if verdict.name == "DENIED":
            self._unauthorized()
        else:
            # Closed: a guesser must connect again, and the slot and thread are free at once.
            self.close_connection = True
            self._send(429, b"too many attempts, retry later\n", TEXT, {"Retry-After": "1"})
        return False

    def _drop_body(self) -> None:
        self._skip_body()
        self._reader.deadline = float("inf")

    def _skip_body(self) -> None:
        """Reads a small body (none is expected) to keep the connection; else closes it after."""
        length = self.headers.get("Content-Length")
        if "Transfer-Encoding" in self.headers or length is None:
            self.close_connection |= "Transfer-Encoding" in self.headers
            return
        try:
            size = int(length)
        except ValueError:
            size = -1
        if 0 <= size <= MAX_DISCARDED_BODY:
            self.rfile.read(size)  # under the request deadline
        else:
            self.close_connection = True

    def do_GET(self) -> None:
        path = self._route()
        # /healthz says only "ok", so probes (kubelet) need no credentials; see docs/SECURITY.md.
        if path != "/healthz" and not self._authorized():
            return  # refused, and answered
        if path == "/metrics":
            self._metrics()
        elif path == "/healthz":
            self._send(200, b"ok\n", TEXT)
        elif path == "/":
            body = b"<html><body><h1>netmon</h1><a href='/metrics'>/metrics</a></body></html>\n"
            self._send(200, body, "text/html; charset=utf-8")
        elif path == "/sweep" and self.server.on_sweep is not None:
            self._send(405, b"method not allowed\n", TEXT, {"Allow": "POST"})
        else:
            self._send(404, b"not found\n", TEXT)

    def do_HEAD(self) -> None:
        self.do_GET()  # the same headers as GET, Content-Length included; _send drops the body

    def _metrics(self) -> None:
        """The page in the format and encoding the request accepts: OpenMetrics for Prometheus,
        which asks for it first, and gzipped when it may be (Prometheus always says it may)."""
        chosen = negotiate(self.headers["Accept"], self.headers["Accept-Encoding"])
        # The body depends on both headers: a cache between must key on them too (RFC 9110 12.5.5).
        headers = {"Vary": "Accept, Accept-Encoding"}
        if chosen.gzip:
            headers["Content-Encoding"] = "gzip"
        self._send(200, self.server.page(chosen), chosen.content_type, headers)

    def do_POST(self) -> None:
        """/sweep: the body to the server's on_sweep, its answer to the client; 404 without one."""
        on_sweep = self.server.on_sweep
        if on_sweep is None:
            self._drop_body()
            self._send(404, b"not found\n", TEXT)
            return
        if not self._authorized(before_refusal=self._drop_body):
            return
        body = self._read_body()
        self._reader.deadline = float("inf")
        if body is None:
            return  # refused, and answered
        try:
            status, text = on_sweep(body)
        except Exception:
            log.error("http: POST /sweep failed", exc_info=True)
            status, text = 500, "internal error"
        self._send(status, f"{text}\n".encode(), TEXT)

    def _read_body(self) -> bytes | None:
        """The body, at most MAX_POST_BODY bytes, read under the request's deadline; None once a
        refusal is sent (411, 413, 400)."""
        length = self.headers.get("Content-Length")
        if length is None or "Transfer-Encoding" in self.headers:
            self._skip_body()  # closes the connection after a chunked body
            self._send(411, b"Content-Length required\n", TEXT)
            return None
        size = int(length) if length.isascii() and length.strip().isdigit() else -1
        if not 0 <= size <= MAX_POST_BODY:
            self.close_connection = True  # the body stays unread
            if size < 0:
                self._send(400, b"bad Content-Length\n", TEXT)
            else:
                self._send(413, f"body over {MAX_POST_BODY} bytes\n".encode(), TEXT)
            return None
        body: bytes = self.rfile.read(size)
        if len(body) < size:
            self.close_connection = True
            self._send(400, b"body shorter than its Content-Length\n", TEXT)
            return None
        return body

    def _unauthorized(self) -> None:
        headers = {"WWW-Authenticate": 'Basic realm="netmon"'}
        self._send(401, b"unauthorized\n", TEXT, headers)

    def _not_allowed(self) -> None:
        self.close_connection = True  # the body was not necessarily read
        self._send(405, b"method not allowed\n", TEXT, {"Allow": "GET, HEAD"})

    def _send(
        self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None
    ) -> None:
        # send_response, with the representation sent in the request's log line.
        encoding = (headers or {}).get("Content-Encoding", "identity")
        self.log_message(
            '"%s" %d, %d bytes, %s, %s', self.requestline, status, len(body), content_type, encoding
        )
        self.send_response_only(status)
        self.send_header("Server", self.version_string())
        self.send_header("Date", self.date_time_string())
        if status == 204:
            body = b""  # No Content: neither a body nor its headers (RFC 9110, 8.6)
        else:
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def end_headers(self) -> None:
        for name, value in self.server.security.headers if self.server.security else ():
            self.send_header(name, value)
        self.connection.settimeout(self.server.request_timeout)  # bounds the response's writes
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


class MetricsServer(ThreadingHTTPServer):
    """/metrics, /healthz and / (and POST /sweep with `on_sweep`) over HTTP, or HTTPS and basic
    auth with a web-config."""

    daemon_threads = True
    # The listen backlog: a burst of connections waits here rather than in SYN retries. Past it
    # the kernel drops a SYN, and the client retries 1 s, then 3 s, then 7 s later: with 128,
    # 700 guessing clients made a scrape take 1.8 and 3.1 s. A queued connection costs the
    # kernel a few hundred bytes; net.core.somaxconn (4096 by default) caps the value.
    request_queue_size = 1024

    def __init__(
        self,
        host: str,
        port: int,
        page: CollectorRegistry | Page,
        *,
        security: WebSecurity | None = None,
        request_timeout: float = REQUEST_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        web_config_check_s: float = WEB_CONFIG_CHECK_S,
        on_sweep: BodyHandler | None = None,
    ) -> None:
        # What /metrics serves, in the representation asked for: a SnapshotPage (its renders
        # cached), or any registry, rendered on every scrape.
        self.page: Page = (
            (lambda chosen: chosen.render(page)) if isinstance(page, CollectorRegistry) else page
        )
        # POST /sweep takes a body to this (the daemon's sweep inbox); None: 404.
        self.on_sweep = on_sweep
        self._security = security
        self.web_config = _follow(security, web_config_check_s)
        self.request_timeout = request_timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        self._closing = threading.Event()
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)

    @property
    def security(self) -> WebSecurity | None:
        """What to enforce now; the handshake and every request ask, so a reload applies at once."""
        return self.web_config.current() if self.web_config is not None else self._security

    def reload_web_config(self) -> None:
        """SIGHUP: read the web-config file now, even if its files look unchanged."""
        if self.web_config is not None:
            self.web_config.reload()

    @property
    def scheme(self) -> str:
        return "https" if self.security is not None and self.security.tls is not None else "http"

    def process_request(self, request: Any, client_address: Any) -> None:
        # One thread per connection, at most max_connections: past that the accept loop waits for
        # a connection to end (an idle one ends within request_timeout).
        while not self._slots.acquire(timeout=0.1):
            if self._closing.is_set():
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        tls = self.security.tls if self.security is not None else None
        if tls is None:
            super().finish_request(request, client_address)
            return
        # The handshake runs in the connection's own thread, bounded by request_timeout: in the
        # accept loop, one silent client would stall every other scrape.
        request.settimeout(self.request_timeout)
        with tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False) as conn:
            try:
                conn.do_handshake()
            except OSError as exc:  # ssl.SSLError, a timeout, a reset
                log.debug("http: TLS handshake with %s failed: %s", client_address[0], exc)
                return
            super().finish_request(conn, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that resets or stalls mid-response is a network event, not a traceback.
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            log.debug("http: connection from %s ended: %s", client_address[0], error)
        else:
            log.error("http: error serving %s", client_address[0], exc_info=True)

    def shutdown(self) -> None:
        self._closing.set()
        super().shutdown()

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="metrics-http", daemon=True)
        thread.start()
        return thread


def _follow(security: WebSecurity | None, interval: float) -> WebConfigReloader | None:
    if security is None or security.source is None:
        return None  # no file, or one built in code: nothing to follow
    # Imported here: a server without --web-config needs neither bcrypt nor the TLS code.
    from netmon.exposition.webconfig import WebConfigReloader

    return WebConfigReloader(security, interval)
