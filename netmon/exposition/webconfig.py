"""TLS and basic authentication for /metrics, built from a web-config file (its format is in
netmon.exposition.webschema). The file, and the certificates it names, are followed while the
server runs (WebConfigReloader).
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import logging
import os
import secrets
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeAlias

import bcrypt

from netmon import documents
from netmon.errors import UsageError, describe_yaml_error
from netmon.exposition.webschema import TLSServerConfig, WebConfig, parse
from netmon.logs import event

log = logging.getLogger(__name__)

_VERIFY_MODES = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


class Verdict(enum.Enum):
    """What BasicAuth says of a request: let it in, 401, or 429 (BUSY, LIMITED) and close."""

    OK = "ok"
    DENIED = "denied"  # wrong or missing credentials: 401
    BUSY = "busy"  # no bcrypt slot within the wait: 429, the password left unchecked
    LIMITED = "limited"  # this client's failed attempts are over its rate: 429, unchecked


class BasicAuth:
    """Checks `Authorization: Basic` headers against bcrypt hashes, and cannot be starved.

    Every user is compared (digests, constant time), and an unknown user still costs one bcrypt
    check, so timing does not tell which user names exist. Successful checks are cached
    (bounded), so a scrape every second costs a dictionary lookup, never a bcrypt check nor a
    wait behind one: a cache hit takes no bcrypt slot at all.

    A bcrypt check at cost 12 takes a core for 0.5 to 2 s (docs/SECURITY.md), so an uncached
    request is bounded three ways: at most `checks` run at once (a flood of guesses burns that
    many cores of the node, not all of them); a request waits at most `wait_s` for a slot, then
    gets BUSY (429) instead of holding its connection and thread behind the queue; and each client
    address may fail `burst` times, then once every `interval_s` seconds (a token bucket, like
    exporter-toolkit's rate_limit, but counting failures only, so an attacker cannot spend the
    budget of the Prometheus beside it). Refusals are logged, at most one warning a minute.
    """

    CACHE_SIZE = 64
    CHECKS = max(1, min(2, os.cpu_count() or 1))
    WAIT_S = 1.0
    BURST = 20
    INTERVAL_S = 0.5
    CLIENTS = 4096  # failure buckets kept; past that the oldest is forgotten
    WARN_EVERY_S = 60.0

    def __init__(
        self,
        users: Mapping[str, str],
        *,
        checks: int = CHECKS,
        wait_s: float = WAIT_S,
        burst: int = BURST,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not users:
            raise ValueError("no users")
        self._users = [
            (hashlib.sha256(name.encode()).digest(), hashed.encode())
            for name, hashed in users.items()
        ]
        self._given = dict(users)  # for a reload to tell whether the users changed
        # An unknown user is checked against the costliest real hash, so it takes as long.
        self._decoy = max((hashed for _, hashed in self._users), key=lambda h: int(h[4:6]))
        self._key = secrets.token_bytes(32)  # cache keys are keyed digests, never passwords
        self._cache: dict[bytes, None] = {}
        self._lock = threading.Lock()  # the cache and the buckets; never held across bcrypt
        self._slots = threading.BoundedSemaphore(checks)
        self._wait_s = wait_s
        self._failures = _FailureBuckets(burst, interval_s, self.CLIENTS, clock)
        self.refused = {Verdict.BUSY: 0, Verdict.LIMITED: 0}  # since start, for the warning
        self._clock = clock
        self._warned = -self.WARN_EVERY_S

    def same_users(self, users: Mapping[str, str]) -> bool:
        return self._given == dict(users)

    def check(self, header: str | None, client: str = "") -> bool:
        return self.verify(header, client) is Verdict.OK

    def verify(self, header: str | None, client: str = "") -> Verdict:
        """The verdict on one request's Authorization header, from the client address `client`."""
        credentials = _credentials(header)
        if credentials is None:
            return Verdict.DENIED  # nothing to check: costs nothing
        user, password = credentials
        digest = hashlib.sha256(user).digest()
        found: bytes | None = None
        for name, hashed in self._users:
            if hmac.compare_digest(name, digest):
                found = hashed
        hashed = found if found is not None else self._decoy
        # Fixed-length parts (a bcrypt hash is 60 bytes): no two triples make the same message.
        message = digest + hashed + hashlib.sha256(password).digest()
        key = hmac.new(self._key, message, "sha256").digest()
        with self._lock:
            if found is not None and key in self._cache:
                return Verdict.OK
            # The token is taken before the check, so a thousand guesses at once cannot all pass.
            allowed = self._failures.take(client)
        if not allowed:
            return self._refuse(Verdict.LIMITED)
        if not self._slots.acquire(timeout=self._wait_s):
            with self._lock:
                self._failures.give_back(client)  # nothing was checked
            return self._refuse(Verdict.BUSY)
        try:
            ok = bcrypt.checkpw(password, hashed)
        except ValueError:  # a password over bcrypt's 72 bytes
            ok = False
        finally:
            self._slots.release()
        if not (ok and found is not None):
            return Verdict.DENIED
        with self._lock:
            self._failures.give_back(client)  # a success is not a failed attempt
            if len(self._cache) >= self.CACHE_SIZE:
                del self._cache[next(iter(self._cache))]  # the oldest
            self._cache[key] = None
        return Verdict.OK

    def _refuse(self, verdict: Verdict) -> Verdict:
        with self._lock:
            self.refused[verdict] += 1
            now = self._clock()
            due = now - self._warned >= self.WARN_EVERY_S
            if due:
                self._warned = now
        if due:
            log.warning(
                "basic auth: refusing unchecked guesses with 429 (since start: %d with bcrypt "
                "busy, %d over a client's rate of failures)",
                self.refused[Verdict.BUSY],
                self.refused[Verdict.LIMITED],
            )
        return verdict


class _FailureBuckets:
    """A token bucket of failed attempts per client address: `burst` at once, then one every
    `interval_s` seconds; at most `size` clients remembered (the least recently seen go first)."""

    def __init__(
        self, burst: int, interval_s: float, size: int, clock: Callable[[], float]
    ) -> None:
        self._burst = burst
        self._interval = interval_s
        self._size = size
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # client: (tokens, when counted)

    def _tokens(self, client: str) -> float:
        tokens, then = self._buckets.pop(client, (float(self._burst), self._clock()))
        refill = (self._clock() - then) / self._interval if self._interval > 0 else self._burst
        return min(float(self._burst), tokens + refill)

    def take(self, client: str) -> bool:
        tokens = self._tokens(client)
        taken = tokens >= 1
        self._store(client, tokens - 1 if taken else tokens)
        return taken

    def give_back(self, client: str) -> None:
        self._store(client, min(float(self._burst), self._tokens(client) + 1))

    def _store(self, client: str, tokens: float) -> None:
        self._buckets[client] = (tokens, self._clock())  # re-inserted: the newest at the end
        if len(self._buckets) > self._size:
            del self._buckets[next(iter(self._buckets))]


def _credentials(header: str | None) -> tuple[bytes, bytes] | None:
    scheme, _, encoded = (header or "").strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    return (user, password) if sep else None


# A file's version: a digest of its contents, or None when it cannot be read. Contents, not
# (mtime, size, inode): a key rewritten in place within one timestamp tick, or restored with its
# old mtime, keeps all three, and a Kubernetes Secret swap (a symlink) keeps the path.
FileState: TypeAlias = bytes | None
# What a stamp reads of a file: certificates, keys and the web-config are a few KiB; a larger file
# is still told apart by its size, which is hashed too.
_STAMP_BYTES = 1 << 20
Stamp: TypeAlias = tuple[tuple[Path, FileState], ...]


@dataclass(frozen=True)
class WebSecurity:
    """What the HTTP server enforces: a TLS context, basic auth, and headers on every response."""

    tls: ssl.SSLContext | None = None
    auth: BasicAuth | None = None
    headers: tuple[tuple[str, str], ...] = ()
    # Set by `load`, so that a server can follow the file: where it came from, and the state of
    # every file it was built from.
    source: Path | None = field(default=None, compare=False)
    stamp: Stamp = field(default=(), compare=False, repr=False)


class WebConfigError(UsageError):
    """A web-config file that cannot be used, with the state of the files that were read."""

    def __init__(self, message: str, stamp: Stamp) -> None:
        super().__init__(message)
        self.stamp = stamp


def build(config: WebConfig, base: Path, *, reuse: BasicAuth | None = None) -> WebSecurity:
    """The runtime objects; relative paths are taken from `base`, the web-config file's folder.

    `reuse` is kept if it has the same users: its cache of checked passwords stays valid, so a
    certificate rotation does not cost every Prometheus a bcrypt check.
    """
    tls = _tls_context(config.tls_server_config, base) if config.tls_server_config else None
    users = config.basic_auth_users or {}
    auth = None
    if users:
        auth = reuse if reuse is not None and reuse.same_users(users) else BasicAuth(users)
    extra = config.http_server_config.headers if config.http_server_config else None
    headers = tuple((name, value) for name, value in (extra or {}).items() if value)
    return WebSecurity(tls=tls, auth=auth, headers=headers)


def load(path: Path, previous: WebSecurity | None = None) -> WebSecurity:
    """Reads, validates and builds a web-config file; WebConfigError names the field.

    `previous` lends its BasicAuth if the users did not change (see `build`).
    """
    # Each state is taken before its file is read: a change during the read shows at the next check.
    stamp = _stamp((path,))
    try:
        config = parse(_read(path))
        stamp += _stamp(_named_files(config, path.parent))
        security = build(config, path.parent, reuse=previous.auth if previous else None)
    except UsageError as exc:
        raise WebConfigError(f"--web-config {path}: {exc}", stamp) from None
    return replace(security, source=path, stamp=stamp)


def _named_files(config: WebConfig, base: Path) -> tuple[Path, ...]:
    tls = config.tls_server_config
    if tls is None:
        return ()
    names = (tls.cert_file, tls.key_file, tls.client_ca_file)
    return tuple(base / name for name in names if name is not None)


def _file_state(path: Path) -> FileState:
    try:
        with path.open("rb") as file:  # follows symlinks: a swapped target reads differently
            head = file.read(_STAMP_BYTES)
            size = file.seek(0, 2)
    except OSError:
        return None
    return hashlib.sha256(size.to_bytes(8, "big") + head).digest()


def _stamp(paths: Iterable[Path]) -> Stamp:
    return tuple((path, _file_state(path)) for path in paths)


def _read(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"not UTF-8 text (byte {exc.start})") from None
    try:
        document = documents.load(text)  # a second, empty basic_auth_users: is refused
    except Exception as exc:  # YAMLError, and what PyYAML's constructors raise (!!int x)
        # Not quoted: a constructor's message can hold a value, and values here can be secrets.
        raise UsageError(describe_yaml_error(exc, quote=False)) from None
    if document is None:
        return {}  # an empty file: plain HTTP, no auth, as with exporter-toolkit
    if not isinstance(document, dict):
        raise UsageError("the top level must be a mapping, like tls_server_config: ...")
    return document


def _pem_problem(cert: Path, key: Path, exc: ssl.SSLError) -> str:
    """Which file is wrong: OpenSSL says only "PEM lib" for most mistakes."""
    if b"-----BEGIN CERTIFICATE-----" not in cert.read_bytes():
        return f"tls_server_config.cert_file: {cert}: no PEM certificate in it"
    text = key.read_bytes()
    if b"ENCRYPTED" in text:
        return f"tls_server_config.key_file: {key}: encrypted private keys are not supported"
    if b"PRIVATE KEY-----" not in text:
        return f"tls_server_config.key_file: {key}: no PEM private key in it"
    if exc.reason == "KEY_VALUES_MISMATCH":
        return f"tls_server_config.key_file: {key}: does not match the certificate in cert_file"
    return f"tls_server_config.cert_file: cannot load it with key_file ({exc.reason or exc})"


def _no_password() -> bytes:
    # Without this, OpenSSL would prompt on the terminal for an encrypted key's passphrase.
    return b""


def _tls_context(tls: TLSServerConfig, base: Path) -> ssl.SSLContext:
    def readable(field: str, name: Path) -> Path:
        path = base / name
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            raise UsageError(f"tls_server_config.{field}: {path}: {exc.strerror}") from None
        return path

    cert, key = readable("cert_file", tls.cert_file), readable("key_file", tls.key_file)
    if _TLS_VERSIONS[tls.min_version] > _TLS_VERSIONS[tls.max_version]:
        raise UsageError(f"tls_server_config.min_version: {tls.min_version} is above max_version")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _TLS_VERSIONS[tls.min_version]
    context.maximum_version = _TLS_VERSIONS[tls.max_version]
    try:
        context.load_cert_chain(cert, key, password=_no_password)
    except ssl.SSLError as exc:
        raise UsageError(_pem_problem(cert, key, exc)) from None
    verify = _VERIFY_MODES[tls.client_auth_type]
    if verify == ssl.CERT_NONE:
        if tls.client_ca_file is not None:
            raise UsageError(
                "tls_server_config.client_ca_file: set, but client_auth_type is NoClientCert; "
                "use RequireAndVerifyClientCert"
            )
        return context
    if tls.client_ca_file is None:
        raise UsageError(
            f"tls_server_config.client_ca_file: required with client_auth_type "
            f"{tls.client_auth_type}"
        )
    try:
        context.load_verify_locations(cafile=readable("client_ca_file", tls.client_ca_file))
    except ssl.SSLError as exc:
        raise UsageError(
            f"tls_server_config.client_ca_file: not PEM CA certificates ({exc.reason})"
        ) from None
    context.verify_mode = verify
    return context


class WebConfigReloader:
    """The web-config a server enforces now, built again when its files change.

    exporter-toolkit applies a renewed certificate or a changed password without a restart: its
    documentation (docs/web-configuration.md) says the file is read on every HTTP request, and its
    web/tls_config.go sets the TLS config's GetConfigForClient hook to read the file and the
    certificates again for every new TLS connection. netmon follows it, more cheaply: `current()`
    runs on every new connection and request, and at most once per `interval` seconds it compares
    a digest of the contents of the web-config file and of the files it names (a few KiB). Only a
    change costs a parse and a new TLS context, and a reload runs in the connection's thread, so
    there is no thread of its own to leak.

    Where exporter-toolkit fails the handshake (or answers 500) while the file is broken, netmon
    keeps the last good configuration and logs one warning per change, not one per connection.
    """

    def __init__(self, security: WebSecurity, interval: float) -> None:
        if security.source is None:
            raise ValueError("this WebSecurity was not loaded from a file")
        self._path = security.source
        self._current = security
        self._seen = security.stamp  # the files as last acted on, whether loaded or refused
        self._interval = interval
        self._due = time.monotonic() + interval
        self._lock = threading.Lock()
        self.failures = 0
        self.last_reload_ok = True

    def current(self) -> WebSecurity:
        now = time.monotonic()
        if now >= self._due:
            with self._lock:
                if now >= self._due:  # else another thread checked meanwhile
                    self._due = now + self._interval
                    if _stamp(path for path, _ in self._seen) != self._seen:
                        self._reload(forced=False)
        return self._current

    def reload(self) -> bool:
        """Loads the file now, changed or not (SIGHUP); False if the running configuration stays."""
        with self._lock:
            return self._reload(forced=True)

    def _reload(self, forced: bool) -> bool:
        try:
            new = self._load()
        except WebConfigError as exc:
            self._refuse(exc, forced)
            return False
        self._current, self._seen, self.last_reload_ok = new, new.stamp, True
        event(log, "web config reloaded", file=str(self._path))
        if new.auth is not None and new.tls is None:
            log.warning(
                "--web-config: basic_auth_users without tls_server_config: passwords cross the "
                "network in clear text"
            )
        return True

    def _load(self) -> WebSecurity:
        try:
            new = load(self._path, self._current)
        except WebConfigError:
            raise
        except Exception as exc:
            # A race with a writer (a file gone between two reads) or a bug: this runs before a
            # handshake, so it must cost a warning, never the connection.
            seen = _stamp(path for path, _ in self._seen)
            raise WebConfigError(f"--web-config {self._path}: {exc!r}", seen) from exc
        # The listening socket and the URLs Prometheus scrapes are either HTTP or HTTPS.
        if (new.tls is None) != (self._current.tls is None):
            change = "removes" if new.tls is None else "adds"
            raise WebConfigError(
                f"--web-config {self._path}: the file {change} tls_server_config; switching "
                "between HTTP and HTTPS needs a restart",
                new.stamp,
            )
        return new

    def _refuse(self, exc: WebConfigError, forced: bool) -> None:
        # Remembering the refused files' state is what keeps this to one warning per change.
        if forced or exc.stamp != self._seen:
            log.warning("web config reload failed, keeping the running one: %s", exc)
            self.failures += 1
        self._seen, self.last_reload_ok = exc.stamp, False
