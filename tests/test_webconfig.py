"""--web-config for real: certificates made by openssl, a real TLS client that verifies them,
basic auth against bcrypt hashes, client certificates, the daemon end to end, one-line errors
for bad files, and changes to the files picked up while the server runs."""

from __future__ import annotations

import base64
import hashlib
import http.client
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml

from netmon.errors import UsageError
from netmon.exposition import webconfig, webschema
from netmon.exposition.collector import make_registry
from netmon.exposition.http import MetricsServer
from netmon.exposition.snapshot import Snapshot
from netmon.exposition.webconfig import BasicAuth, WebConfigReloader, WebSecurity
from tests.conftest import wait_for
from tests.daemon_harness import _SERVING, DaemonProcess, fast_config

PASSWORD = "correct horse"
# Cost 4, the lowest, keeps the tests fast; the cost changes nothing else.
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()


@dataclass(frozen=True)
class Pki:
    server_cert: Path
    server_key: Path
    ca_cert: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # self-signed, not issued by the CA
    rogue_key: Path


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def self_signed(folder: Path, name: str, *extra: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-days", "2", "-subj", f"/CN={name}", "-keyout", key, "-out", cert, *extra,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    server_cert, server_key = self_signed(
        folder, "server", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"
    )
    ca_cert, ca_key = self_signed(folder, "client-ca")
    client_key, request, client_cert = (folder / f"client.{e}" for e in ("key", "csr", "crt"))
    openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-subj", "/CN=prometheus", "-keyout", client_key, "-out", request,
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", request, "-CA", ca_cert, "-CAkey", ca_key, "-CAcreateserial",
        "-days", "2", "-out", client_cert,
    )  # fmt: skip
    rogue_cert, rogue_key = self_signed(folder, "rogue")
    return Pki(server_cert, server_key, ca_cert, client_cert, client_key, rogue_cert, rogue_key)


def write_config(folder: Path, document: dict[str, Any], name: str = "web.yml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(document))
    return path


def tls_section(pki: Pki, **extra: Any) -> dict[str, Any]:
    return {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key), **extra}


@pytest.fixture
def server() -> Iterator[Callable[..., MetricsServer]]:
    servers: list[MetricsServer] = []

    def start(security: WebSecurity, **options: Any) -> MetricsServer:
        server = MetricsServer(
            "127.0.0.1", 0, make_registry(lambda: Snapshot()), security=security, **options
        )
        server.serve_in_thread()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def serve(server: Callable[..., MetricsServer]) -> Callable[..., int]:
    def start(security: WebSecurity, **options: Any) -> int:
        return int(server(security, **options).server_address[1])

    return start


def client_context(pki: Pki, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.server_cert))  # verifies name and chain
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def get(
    port: int,
    context: ssl.SSLContext,
    path: str = "/metrics",
    headers: dict[str, str] | None = None,
) -> http.client.HTTPResponse:
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    connection.request("GET", path, headers=headers or {})
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


# --- TLS and basic auth on a real server


def test_tls_with_basic_auth(pki: Pki, tmp_path: Path, serve: Any) -> None:
    document = {
        "tls_server_config": tls_section(pki),
        "basic_auth_users": {"prometheus": HASH, "grafana": HASH},
        "http_server_config": {
            "headers": {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "deny"}
        },
    }
    security = webconfig.load(write_config(tmp_path, document))
    port = serve(security)
    context = client_context(pki)

    ok = get(port, context, headers=basic("prometheus", PASSWORD))
    assert ok.status == 200
    assert ok.getheader("X-Content-Type-Options") == "nosniff"
    assert ok.getheader("X-Frame-Options") == "deny"
    assert get(port, context, headers=basic("grafana", PASSWORD)).status == 200

    refusals = [
        {},
        basic("prometheus", "wrong"),
        basic("nobody", PASSWORD),
        basic("prometheus", PASSWORD + "x"),
        basic("prometheus", "x" * 100),  # over bcrypt's 72 bytes
        {"Authorization": "Basic not-base64!"},
        {"Authorization": "Basic " + base64.b64encode(b"no-colon").decode()},
        {"Authorization": "Bearer " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()},
    ]
    for headers in refusals:
        for path in ("/metrics", "/", "/nope"):
            refused = get(port, context, path, headers)
            assert refused.status == 401, (headers, path)
            assert refused.getheader("WWW-Authenticate") == 'Basic realm="netmon"'
            assert refused.getheader("X-Frame-Options") == "deny"
    # /healthz answers without credentials, for probes (docs/SECURITY.md).
    assert get(port, context, "/healthz").status == 200


def test_plain_http_against_the_tls_port_fails(pki: Pki, tmp_path: Path, serve: Any) -> None:
    port = serve(webconfig.load(write_config(tmp_path, {"tls_server_config": tls_section(pki)})))
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        connection.request("GET", "/metrics")
        connection.getresponse()
    connection.close()
    # A client that does not trust the certificate refuses the server.
    with pytest.raises(ssl.SSLCertVerificationError):
        get(port, ssl.create_default_context())
    assert get(port, client_context(pki)).status == 200


def test_min_version_tls13_refuses_a_tls12_client(pki: Pki, tmp_path: Path, serve: Any) -> None:
    document = {"tls_server_config": tls_section(pki, min_version="TLS13")}
    port = serve(webconfig.load(write_config(tmp_path, document)))
    old = client_context(pki)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(ssl.SSLError):
        get(port, old)
    assert get(port, client_context(pki)).status == 200


def refused(port: int, context: ssl.SSLContext) -> bool:
    # With TLS 1.3 the client learns of a refused certificate on its first read.
    try:
        return get(port, context).status != 200
    except (ssl.SSLError, ConnectionError, http.client.HTTPException):
        return True


def test_require_and_verify_client_cert(pki: Pki, tmp_path: Path, serve: Any) -> None:
    section = tls_section(
        pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca_cert)
    )
    port = serve(webconfig.load(write_config(tmp_path, {"tls_server_config": section})))
    assert get(port, client_context(pki, pki.client_cert, pki.client_key)).status == 200
    assert refused(port, client_context(pki))
    assert refused(port, client_context(pki, pki.rogue_cert, pki.rogue_key))


def test_verify_client_cert_if_given(pki: Pki, tmp_path: Path, serve: Any) -> None:
    section = tls_section(
        pki, client_auth_type="VerifyClientCertIfGiven", client_ca_file=str(pki.ca_cert)
    )
    port = serve(webconfig.load(write_config(tmp_path, {"tls_server_config": section})))
    assert get(port, client_context(pki, pki.client_cert, pki.client_key)).status == 200
    assert get(port, client_context(pki)).status == 200
    assert refused(port, client_context(pki, pki.rogue_cert, pki.rogue_key))


def test_a_silent_client_does_not_stall_other_handshakes(
    pki: Pki, tmp_path: Path, serve: Any
) -> None:
    security = webconfig.load(write_config(tmp_path, {"tls_server_config": tls_section(pki)}))
    port = serve(security, request_timeout=2.0)
    silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(5)]
    try:
        started = time.monotonic()
        assert get(port, client_context(pki)).status == 200
        assert time.monotonic() - started < 1.5  # not after the silent ones' 2 s timeout
        # The server gives up on a client that never starts its handshake.
        silent[0].settimeout(10)
        assert silent[0].recv(1) == b""
    finally:
        for sock in silent:
            sock.close()


def test_relative_paths_are_taken_from_the_config_folder(pki: Pki, tmp_path: Path) -> None:
    folder = tmp_path / "etc"
    folder.mkdir()
    (folder / "tls.crt").write_bytes(pki.server_cert.read_bytes())
    (folder / "tls.key").write_bytes(pki.server_key.read_bytes())
    document = {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}}
    assert webconfig.load(write_config(folder, document)).tls is not None


# --- the credential cache


def test_successful_checks_are_cached_and_failures_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    auth = BasicAuth({"prometheus": HASH})
    header = basic("prometheus", PASSWORD)["Authorization"]
    assert all(auth.check(header) for _ in range(50))
    assert len(calls) == 1  # a scrape a second costs one bcrypt check, once
    wrong = basic("prometheus", "guess")["Authorization"]
    assert not any(auth.check(wrong) for _ in range(3))
    assert len(calls) == 4  # every guess pays bcrypt
    assert not auth.check(basic("nobody", PASSWORD)["Authorization"])
    assert len(calls) == 5  # an unknown user costs a check too: timing does not tell

    many = BasicAuth({f"user{i}": HASH for i in range(BasicAuth.CACHE_SIZE + 10)})
    for i in range(BasicAuth.CACHE_SIZE + 10):
        assert many.check(basic(f"user{i}", PASSWORD)["Authorization"])
    assert len(many._cache) == BasicAuth.CACHE_SIZE


def test_htpasswd_2y_hashes_are_accepted() -> None:
    hashed = HASH.replace("$2b$", "$2y$", 1)
    auth = webconfig.build(webschema.parse({"basic_auth_users": {"a": hashed}}), Path("."))
    assert auth.auth is not None
    assert auth.auth.check(basic("a", PASSWORD)["Authorization"])


# --- bad files: one line naming the field


def bad_documents(pki: Pki, tmp_path: Path) -> list[tuple[dict[str, Any] | str, str]]:
    missing = str(tmp_path / "missing.crt")
    cert, key, rogue = str(pki.server_cert), str(pki.server_key), str(pki.rogue_key)
    return [
        ({"tls_server_config": {"cert_file": missing, "key_file": key}}, "cert_file"),
        ({"tls_server_config": tls_section(pki, ciphers=["x"])}, "tls_server_config.ciphers"),
        ({"tls_config": {}}, "tls_config: unknown setting"),
        ({"basic_auth_users": {"alice": "plaintext"}}, "basic_auth_users.alice: not a bcrypt"),
        ({"basic_auth_users": {"a:b": HASH}}, "basic_auth_users.a:b"),
        ({"basic_auth_users": ["alice"]}, "basic_auth_users"),
        ({"tls_server_config": tls_section(pki, cert="PEM")}, "tls_server_config.cert: inline"),
        ({"tls_server_config": {"key_file": key}}, "tls_server_config.cert_file: Field required"),
        (
            {"tls_server_config": tls_section(pki, client_auth_type="RequireAnyClientCert")},
            "tls_server_config.client_auth_type: RequireAnyClientCert does not verify",
        ),
        (
            {"tls_server_config": tls_section(pki, client_auth_type="RequireAndVerifyClientCert")},
            "tls_server_config.client_ca_file: required",
        ),
        (
            {"tls_server_config": tls_section(pki, client_ca_file=str(pki.ca_cert))},
            "tls_server_config.client_ca_file: set, but client_auth_type is NoClientCert",
        ),
        ({"tls_server_config": tls_section(pki, min_version="TLS11")}, "min_version: TLS 1.0"),
        ({"tls_server_config": tls_section(pki, max_version="TLS14")}, "max_version"),
        (
            {"tls_server_config": tls_section(pki, min_version="TLS13", max_version="TLS12")},
            "min_version: TLS13 is above max_version",
        ),
        (
            {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": rogue}},
            "tls_server_config.key_file: " + rogue + ": does not match the certificate",
        ),
        (
            {"tls_server_config": {"cert_file": key, "key_file": key}},
            "tls_server_config.cert_file: " + key + ": no PEM certificate in it",
        ),
        (
            {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": cert}},
            "tls_server_config.key_file: " + cert + ": no PEM private key in it",
        ),
        ({"http_server_config": {"http2": True}}, "http_server_config.http2: netmon serves"),
        ({"http_server_config": {"headers": {"Set-Cookie": "a"}}}, "'Set-Cookie' cannot be set"),
        (
            {"http_server_config": {"headers": {"X-Frame-Options": "allow"}}},
            "http_server_config.headers: header X-Frame-Options: use one of deny, sameorigin",
        ),
        ({"rate_limit": {"interval": "1s", "burst": 2}}, "rate_limit: not supported"),
        ("tls_server_config: [unclosed", "not valid YAML"),
        ("- a list", "the top level must be a mapping"),
        ("a: !!int x", "not valid YAML"),
    ]


def test_bad_files_give_one_line_naming_the_field(pki: Pki, tmp_path: Path) -> None:
    for number, (document, expected) in enumerate(bad_documents(pki, tmp_path)):
        path = tmp_path / f"bad{number}.yml"
        path.write_text(document if isinstance(document, str) else yaml.safe_dump(document))
        with pytest.raises(UsageError) as caught:
            webconfig.load(path)
        message = str(caught.value)
        assert message.startswith(f"--web-config {path}: "), message
        assert expected in message, (expected, message)
        assert "\n" not in message
    missing = tmp_path / "absent.yml"
    with pytest.raises(UsageError, match=r"--web-config .*absent\.yml: cannot read"):
        webconfig.load(missing)
    # An empty file is valid and changes nothing, as with exporter-toolkit.
    empty = tmp_path / "empty.yml"
    empty.write_text("")
    assert webconfig.load(empty) == WebSecurity()


def test_an_encrypted_key_is_refused_without_a_prompt(pki: Pki, tmp_path: Path) -> None:
    key = tmp_path / "encrypted.key"
    openssl(
        "pkey", "-in", pki.server_key, "-aes256", "-passout", "pass:secret", "-out", key
    )  # fmt: skip
    document = {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(key)}}
    with pytest.raises(UsageError, match=r"key_file: .*encrypted private keys are not supported"):
        webconfig.load(write_config(tmp_path, document))


def test_secrets_are_not_echoed_in_errors(pki: Pki, tmp_path: Path) -> None:
    document = {"tls_server_config": tls_section(pki, key="-----BEGIN PRIVATE KEY-----SECRET")}
    with pytest.raises(UsageError) as caught:
        webconfig.load(write_config(tmp_path, document))
    assert "SECRET" not in str(caught.value)
    with pytest.raises(UsageError) as caught:
        webconfig.load(write_config(tmp_path, {"basic_auth_users": {"a": "hunter2"}}))
    assert "hunter2" not in str(caught.value)


def test_serve_exits_2_with_one_line_for_a_bad_web_config(pki: Pki, tmp_path: Path) -> None:
    config = write_config(tmp_path, fast_config(tmp_path), "netmon.yml")
    cases = {
        "cert_file": {"tls_server_config": tls_section(pki, cert_file=str(tmp_path / "none"))},
        "basic_auth_users.alice": {"basic_auth_users": {"alice": "$2b$10$short"}},
        "tls_server_config.client_authtype": {"tls_server_config": tls_section(
            pki, client_authtype="RequireAndVerifyClientCert")},
    }  # fmt: skip
    for field, document in cases.items():
        web = write_config(tmp_path, document, f"{field}.yml")
        done = subprocess.run(
            [sys.executable, "-m", "netmon", "serve", "--config", config, "--web-config", web],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        lines = done.stderr.split("\n")[:-1]
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("netmon: --web-config ") and field in lines[0], lines
        assert "Traceback" not in done.stderr


# --- the daemon end to end


def test_daemon_serves_metrics_over_tls_with_basic_auth(pki: Pki, tmp_path: Path) -> None:
    config = write_config(tmp_path, fast_config(tmp_path), "netmon.yml")
    web = write_config(
        tmp_path, {"tls_server_config": tls_section(pki), "basic_auth_users": {"prom": HASH}}
    )
    log_path = tmp_path / "daemon.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "netmon", "serve", "--config", config, "--web-config", web],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def listening() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(f"daemon exited {proc.returncode}: {log_path.read_text()}")
            match = _SERVING.search(log_path.read_text())
            return match.group(1) if match else None

        port = int(wait_for(listening, 60, "the daemon to listen"))
        assert f"listen=https://127.0.0.1:{port}/metrics" in log_path.read_text()
        context = client_context(pki)
        assert get(port, context).status == 401
        assert get(port, context, "/healthz").status == 200

        def scraped_runs() -> bool:
            connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
            connection.request("GET", "/metrics", headers=basic("prom", PASSWORD))
            response = connection.getresponse()
            text = response.read().decode()
            connection.close()
            assert response.status == 200
            return "netmon_probe_runs_total{probe=" in text and "netmon_build_info" in text

        wait_for(scraped_runs, 30, "an authenticated scrape over TLS", poll=0.2)

        # SIGHUP reads the web-config again, even a change its file states do not show (same
        # size, inode and mtime), which only the signal can pick up.
        before = web.stat()
        document = {"tls_server_config": tls_section(pki), "basic_auth_users": {"prom": NEW_HASH}}
        web.write_text(yaml.safe_dump(document))
        os.utime(web, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert (web.stat().st_size, web.stat().st_ino) == (before.st_size, before.st_ino)
        proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: get(port, context, headers=basic("prom", NEW_PASSWORD)).status == 200,
            30,
            "the new password after SIGHUP",
            poll=0.2,
        )
        assert get(port, context, headers=basic("prom", PASSWORD)).status == 401
        assert "web config reloaded" in log_path.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_concurrent_authenticated_scrapes(pki: Pki, tmp_path: Path, serve: Any) -> None:
    document = {"tls_server_config": tls_section(pki), "basic_auth_users": {"p": HASH}}
    port = serve(webconfig.load(write_config(tmp_path, document)))
    context = client_context(pki)
    statuses: list[int] = []
    lock = threading.Lock()

    def scrape() -> None:
        status = get(port, context, headers=basic("p", PASSWORD)).status
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=scrape) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert statuses == [200] * 20


# --- changes to the files, picked up while the server runs

SAN = "subjectAltName=IP:127.0.0.1,DNS:localhost"
NEW_PASSWORD = "battery staple"
NEW_HASH = bcrypt.hashpw(NEW_PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()


def rewrite(path: Path, data: bytes | str) -> None:
    """Writes over `path` in place (same inode) and moves its mtime on, so that the change shows
    even where the file system's timestamps are coarser than the test."""
    before = path.stat().st_mtime_ns
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    after = path.stat()
    if after.st_mtime_ns <= before:
        os.utime(path, ns=(after.st_atime_ns, before + 1_000_000_000))


def fingerprint(cert: Path) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert.read_text())).hexdigest()


def served_fingerprint(port: int, context: ssl.SSLContext) -> str:
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


def reload_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.getMessage().startswith("web config reload failed")
    ]


def test_a_rotated_certificate_reaches_new_connections(
    pki: Pki, tmp_path: Path, server: Callable[..., MetricsServer]
) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pki.server_cert.read_bytes())
    key.write_bytes(pki.server_key.read_bytes())
    web = write_config(
        tmp_path, {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}}
    )
    metrics = server(webconfig.load(web), request_timeout=30.0)
    port = int(metrics.server_address[1])
    renewed = self_signed(tmp_path, "renewed", "-addext", SAN)
    moved = self_signed(tmp_path, "moved", "-addext", SAN)
    context = client_context(pki)
    for trusted, _ in (renewed, moved):
        context.load_verify_locations(cafile=str(trusted))
    assert served_fingerprint(port, context) == fingerprint(pki.server_cert)
    kept = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    kept.request("GET", "/metrics")
    assert kept.getresponse().read() and kept.sock is not None

    # Renewed in place (cert-manager, certbot): for a moment the key does not match the cert.
    rewrite(cert, renewed[0].read_bytes())
    rewrite(key, renewed[1].read_bytes())
    wanted = fingerprint(renewed[0])
    wait_for(lambda: served_fingerprint(port, context) == wanted, 20, "the renewed certificate")
    # A connection opened before keeps its session, as with exporter-toolkit.
    kept.request("GET", "/metrics")
    assert kept.getresponse().status == 200
    assert hashlib.sha256(kept.sock.getpeercert(True) or b"").hexdigest() == fingerprint(
        pki.server_cert
    )
    kept.close()

    # The web-config names other files.
    rewrite(
        web,
        yaml.safe_dump({"tls_server_config": {"cert_file": "moved.crt", "key_file": "moved.key"}}),
    )
    wanted = fingerprint(moved[0])
    wait_for(lambda: served_fingerprint(port, context) == wanted, 20, "the certificate moved to")
    assert metrics.web_config is not None and metrics.web_config.failures <= 1  # the moment above
    assert metrics.web_config.last_reload_ok


def test_a_changed_password_applies_to_open_and_new_connections(
    pki: Pki, tmp_path: Path, serve: Callable[..., int]
) -> None:
    document: dict[str, Any] = {
        "tls_server_config": tls_section(pki),
        "basic_auth_users": {"prometheus": HASH},
    }
    web = write_config(tmp_path, document)
    port = serve(webconfig.load(web), request_timeout=30.0)
    context = client_context(pki)
    assert get(port, context, headers=basic("prometheus", PASSWORD)).status == 200
    kept = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    kept.request("GET", "/metrics", headers=basic("prometheus", PASSWORD))
    assert kept.getresponse().read()

    rewrite(web, yaml.safe_dump({**document, "basic_auth_users": {"prometheus": NEW_HASH}}))
    wait_for(
        lambda: get(port, context, headers=basic("prometheus", NEW_PASSWORD)).status == 200,
        20,
        "the new password to be accepted",
    )
    assert get(port, context, headers=basic("prometheus", PASSWORD)).status == 401
    # Checked on every request, as exporter-toolkit does: a kept-alive connection does not keep a
    # revoked password working.
    kept.request("GET", "/metrics", headers=basic("prometheus", PASSWORD))
    response = kept.getresponse()
    response.read()
    assert response.status == 401
    kept.close()


def test_an_invalid_file_keeps_the_last_good_one_and_warns_once_per_change(
    pki: Pki,
    tmp_path: Path,
    server: Callable[..., MetricsServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="netmon.exposition.webconfig")
    good: dict[str, Any] = {
        "tls_server_config": tls_section(pki),
        "basic_auth_users": {"prometheus": HASH},
        "http_server_config": {"headers": {"X-Frame-Options": "deny"}},
    }
    web = write_config(tmp_path, good)
    # Every connection checks the files, so each scrape below is a chance to warn again.
    metrics = server(webconfig.load(web), web_config_check_s=0.0)
    reloader = metrics.web_config
    assert reloader is not None
    port, context = int(metrics.server_address[1]), client_context(pki)
    tls = good["tls_server_config"]
    later = tmp_path / "later.crt"
    cases: list[tuple[dict[str, Any] | str, str]] = [
        ("tls_server_config: [unclosed", "not valid YAML"),
        ({**good, "tls_server_config": {**tls, "key_file": str(pki.rogue_key)}}, "does not match"),
        ({**good, "basic_auth_users": {"prometheus": "$2b$10$short"}}, "not a bcrypt hash"),
        ({**good, "tls_server_config": {**tls, "cert_file": str(later)}}, "No such file"),
        ({**good, "tls_server_config": None}, "switching between HTTP and HTTPS needs a restart"),
    ]
    for number, (document, expected) in enumerate(cases, 1):
        rewrite(web, document if isinstance(document, str) else yaml.safe_dump(document))
        for _ in range(5):
            response = get(port, context, headers=basic("prometheus", PASSWORD))
            assert response.status == 200 and response.getheader("X-Frame-Options") == "deny"
        warnings = reload_warnings(caplog)
        assert len(warnings) == number, warnings
        assert expected in warnings[-1] and str(web) in warnings[-1], warnings[-1]
        assert reloader.failures == number and not reloader.last_reload_ok
    assert "$2b$10$short" not in caplog.text  # a refused hash is not echoed

    # The files a refused configuration names are followed too: the missing certificate appears.
    rewrite(web, yaml.safe_dump({**good, "tls_server_config": {**tls, "cert_file": str(later)}}))
    assert get(port, context, headers=basic("prometheus", PASSWORD)).status == 200
    later.write_bytes(pki.server_cert.read_bytes())
    assert get(port, context, headers=basic("prometheus", PASSWORD)).status == 200
    assert reloader.last_reload_ok
    # Fixed: the new file applies at the next connection, without a warning.
    rewrite(web, yaml.safe_dump({**good, "basic_auth_users": {"prometheus": NEW_HASH}}))
    assert get(port, context, headers=basic("prometheus", NEW_PASSWORD)).status == 200
    assert get(port, context, headers=basic("prometheus", PASSWORD)).status == 401
    assert len(reload_warnings(caplog)) == len(cases) + 1  # + the refusal of the missing cert
    assert reloader.last_reload_ok
    assert caplog.text.count("web config reloaded") == 2


def test_a_reload_keeps_the_checked_passwords_when_the_users_are_unchanged(
    pki: Pki, tmp_path: Path
) -> None:
    document: dict[str, Any] = {"basic_auth_users": {"prometheus": HASH}}
    web = write_config(tmp_path, document)
    reloader = WebConfigReloader(webconfig.load(web), interval=0.0)
    first = reloader.current()
    header = {"X-Content-Type-Options": "nosniff"}
    rewrite(web, yaml.safe_dump({**document, "http_server_config": {"headers": header}}))
    second = reloader.current()
    assert second.headers == (("X-Content-Type-Options", "nosniff"),)
    assert second.auth is first.auth  # its cache of checked passwords with it
    rewrite(web, yaml.safe_dump({"basic_auth_users": {"prometheus": NEW_HASH}}))
    assert reloader.current().auth is not first.auth


def test_a_change_that_keeps_size_inode_and_mtime_is_seen_by_its_contents(tmp_path: Path) -> None:
    web = write_config(tmp_path, {"basic_auth_users": {"prometheus": HASH}})
    reloader = WebConfigReloader(webconfig.load(web), interval=0.0)
    old, new = (basic("prometheus", p)["Authorization"] for p in (PASSWORD, NEW_PASSWORD))
    assert reloader.current().auth is not None
    before = web.stat()
    web.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": NEW_HASH}}))
    os.utime(web, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = web.stat()
    assert (after.st_size, after.st_ino) == (before.st_size, before.st_ino)  # same length hashes
    # Stamped by contents: the poll sees it, no signal needed (it used to keep the old password).
    auth = reloader.current().auth
    assert auth is not None and auth.check(new) and not auth.check(old)
    # SIGHUP loads the file again whatever its stamp says.
    assert reloader.reload() and reloader.current().auth is not None


def test_a_second_empty_basic_auth_users_is_refused_not_read_as_no_auth(
    pki: Pki, tmp_path: Path
) -> None:
    config = write_config(tmp_path, fast_config(tmp_path), "netmon.yml")
    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        f"basic_auth_users:\n  prometheus: {HASH}\nbasic_auth_users:\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "netmon", "serve", "--config", config, "--web-config", web],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"netmon: --web-config {web}: not valid YAML: duplicate key 'basic_auth_users' at lines "
        "4 and 6; keep one of them"
    ]


def padded(pem: bytes, size: int) -> bytes:
    """`pem` with a trailing comment to `size` bytes: OpenSSL reads only between the markers."""
    assert len(pem) < size
    return pem + b"#" * (size - len(pem) - 1) + b"\n"


def test_a_key_rotated_in_place_is_served_by_the_daemon_with_and_without_sighup(
    pki: Pki, tmp_path: Path
) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    size = 4096  # every file this size: a rewrite keeps size, inode and (restored) mtime
    cert.write_bytes(padded(pki.server_cert.read_bytes(), size))
    key.write_bytes(padded(pki.server_key.read_bytes(), size))
    web = write_config(
        tmp_path, {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}}
    )
    daemon = DaemonProcess(
        tmp_path, fast_config(tmp_path), args=("--web-config", str(web)), name="rotating"
    )
    try:
        renewed = self_signed(tmp_path, "renewed", "-addext", SAN)
        third = self_signed(tmp_path, "third", "-addext", SAN)
        context = client_context(pki)
        for trusted, _ in (renewed, third):
            context.load_verify_locations(cafile=str(trusted))
        assert served_fingerprint(daemon.port, context) == fingerprint(pki.server_cert)

        def rotate(new: tuple[Path, Path]) -> None:
            for path, source in ((key, new[1]), (cert, new[0])):
                before = path.stat()
                path.write_bytes(padded(source.read_bytes(), size))
                os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
                after = path.stat()
                assert (after.st_size, after.st_ino, after.st_mtime_ns) == (
                    before.st_size, before.st_ino, before.st_mtime_ns
                )  # fmt: skip

        # No signal: the files are stamped by contents, so the poll sees what stat cannot.
        rotate(renewed)
        wanted = fingerprint(renewed[0])
        wait_for(lambda: served_fingerprint(daemon.port, context) == wanted, 20, "the renewed cert")
        # SIGHUP: read at once, and the daemon says so.
        rotate(third)
        daemon.proc.send_signal(signal.SIGHUP)
        wanted = fingerprint(third[0])
        wait_for(lambda: served_fingerprint(daemon.port, context) == wanted, 20, "the third cert")
        wait_for(lambda: "configuration reloaded" in daemon.log(), 20, "the reload's log line")
        assert daemon.stop() == 0
    finally:
        daemon.kill_all()
