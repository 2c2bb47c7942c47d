"""The web-config file's format, that of the Prometheus exporter-toolkit (`--web-config`), as
pydantic models: settings netmon does not implement are refused with what to do instead, never
ignored, and an error names the setting without echoing a secret.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from netmon.errors import UsageError, field_path

ClientAuth = Literal["NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"]
TLSVersion = Literal["TLS12", "TLS13"]

# exporter-toolkit settings that netmon does not implement, and what to do instead.
_UNSUPPORTED = {
    "cert": "inline certificates are not supported; use cert_file",
    "key": "inline keys are not supported; use key_file",
    "client_ca": "inline CA certificates are not supported; use client_ca_file",
    "client_allowed_sans": "not supported; issue client certificates from a dedicated CA",
    "cipher_suites": "not supported; OpenSSL's defaults apply (min_version TLS13 narrows them)",
    "prefer_server_cipher_suites": "not supported; OpenSSL's defaults apply",
    "curve_preferences": "not supported; OpenSSL's defaults apply",
    "rate_limit": (
        "not supported: one limit on every request lets a guesser use up Prometheus' share; "
        "netmon limits each client's failed logins and concurrent bcrypt checks instead"
    ),
}
_WEAK_CLIENT_AUTH = {
    "RequestClientCert": "does not verify the certificate",
    "RequireAnyClientCert": "does not verify the certificate",
}

# The headers exporter-toolkit lets a web-config set, with their allowed values where it fixes them.
_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}

# $2a$, $2b$ and $2y$ (htpasswd) hashes; the cost is two digits, 04 to 31.
_BCRYPT = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")


def _bcrypt_hash(value: str) -> str:
    match = _BCRYPT.fullmatch(value)
    if match is None or not 4 <= int(match.group(1)) <= 31:
        raise ValueError(
            "not a bcrypt hash like $2b$10$ and 53 characters (docs/SECURITY.md shows how to "
            "make one)"
        )
    return value


def _user_name(value: str) -> str:
    if not value or ":" in value:
        raise ValueError("a user name must be non-empty and without ':' (RFC 7617)")
    return value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TLSServerConfig(_Section):
    cert_file: Path
    key_file: Path
    client_auth_type: ClientAuth = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: TLSVersion = "TLS12"
    max_version: TLSVersion = "TLS13"
    cert: object = None
    key: object = None
    client_ca: object = None
    client_allowed_sans: object = None
    cipher_suites: object = None
    prefer_server_cipher_suites: object = None
    curve_preferences: object = None

    @field_validator(
        "cert",
        "key",
        "client_ca",
        "client_allowed_sans",
        "cipher_suites",
        "prefer_server_cipher_suites",
        "curve_preferences",
        mode="before",
    )
    @classmethod
    def _unsupported(cls, value: object, info: ValidationInfo) -> object:
        raise ValueError(_UNSUPPORTED[str(info.field_name)])

    @field_validator("client_auth_type", mode="before")
    @classmethod
    def _client_auth(cls, value: object) -> object:
        if isinstance(value, str) and value in _WEAK_CLIENT_AUTH:
            raise ValueError(
                f"{value} {_WEAK_CLIENT_AUTH[value]}, so netmon does not offer it; "
                "use RequireAndVerifyClientCert"
            )
        return value

    @field_validator("min_version", "max_version", mode="before")
    @classmethod
    def _version(cls, value: object) -> object:
        if value in ("TLS10", "TLS11"):
            raise ValueError("TLS 1.0 and 1.1 are not supported (RFC 8996); use TLS12 or TLS13")
        return value


class HTTPServerConfig(_Section):
    headers: dict[str, str] | None = None
    http2: bool = False

    @field_validator("http2")
    @classmethod
    def _http1_only(cls, value: bool) -> bool:
        if value:
            raise ValueError("netmon serves HTTP/1.1 only; remove the setting or set it to false")
        return value

    @field_validator("headers")
    @classmethod
    def _known_headers(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for name, text in (value or {}).items():
            if name not in _HEADERS:
                raise ValueError(f"header {name!r} cannot be set; allowed: {', '.join(_HEADERS)}")
            if "\r" in text or "\n" in text:
                raise ValueError(f"header {name}: the value must be one line")
            allowed = _HEADERS[name]
            if text and allowed and text not in allowed:
                raise ValueError(f"header {name}: use one of {', '.join(allowed)} (got {text!r})")
        return value


class WebConfig(_Section):
    """The web-config file: TLS, basic authentication and extra response headers."""

    tls_server_config: TLSServerConfig | None = None
    http_server_config: HTTPServerConfig | None = None
    basic_auth_users: (
        dict[
            Annotated[str, AfterValidator(_user_name)], Annotated[str, AfterValidator(_bcrypt_hash)]
        ]
        | None
    ) = None
    rate_limit: object = None

    @field_validator("rate_limit", mode="before")
    @classmethod
    def _unsupported(cls, value: object, info: ValidationInfo) -> object:
        raise ValueError(_UNSUPPORTED[str(info.field_name)])


def parse(document: Mapping[str, Any]) -> WebConfig:
    try:
        return WebConfig.model_validate(document)
    except ValidationError as exc:
        raise UsageError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    """The first error, preferring a setting that is wrong over one that is missing."""
    errors = exc.errors(include_url=False)
    first = next((e for e in errors if e["type"] != "missing"), errors[0])
    location = tuple(
        part for part in first["loc"] if part != "[key]" and not str(part).startswith("function-")
    )
    path = field_path(location)
    if first["type"] == "extra_forbidden":
        message = "unknown setting"
    else:
        message = str(first["msg"]).removeprefix("Value error, ")
    # Show the value only where it cannot be a secret (never keys or password hashes).
    got = first.get("input")
    secret = location[:1] == ("basic_auth_users",) or "key" in location
    simple = isinstance(got, (str, int, float, bool)) and not secret
    shown = f" (got {got!r})" if simple and first["type"] != "extra_forbidden" else ""
    return f"{path}: {message}{shown}".replace("\n", " ")
