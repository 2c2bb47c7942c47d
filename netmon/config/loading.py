"""netmon.yaml read and validated: YAML, NETMON_ overrides, the models; every error one line.

Precedence: NETMON_-prefixed environment variables (nested with "__", list items by index:
NETMON_PROBES__0__INTERVAL=30s) override the YAML file, which overrides the models' defaults.
Every error is one line naming the field path, what was wrong and what is accepted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from netmon import documents, envvars
from netmon.config.models import NetmonConfig
from netmon.errors import ConfigError, describe_one_error, describe_yaml_error, field_path

# Only settings users set from the environment; anything else NETMON_* is left alone (e.g.
# NETMON_CONFIG, read by the CLI).
_ENV_ROOTS = {name for name in NetmonConfig.model_fields} | {"group"}


def load_document(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.start}); YAML must be UTF-8"
        ) from None
    try:
        document = documents.load(text)
    except Exception as exc:  # YAMLError (a key twice), PyYAML's constructors: 2001-13-01, !!int x
        raise ConfigError(f"{path}: {describe_yaml_error(exc)}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of settings, like listen: ...")
    return document


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside an annotation such as tuple[ProbeConfig, ...] | None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        model = _model_in(arg)
        if model is not None:
            return model
    return None


def _accepted_fields(location: tuple[Any, ...]) -> str:
    model: Any = NetmonConfig
    for part in location[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field is not None else None
        if model is None:
            return ""
    return ", ".join(model.model_fields)


def parse_config(document: Mapping[str, Any], source: str = "config") -> NetmonConfig:
    try:
        return NetmonConfig.model_validate(document)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        lines = [f"{source}: {_describe(error)}" for error in errors]
        tail = f" [and {len(lines) - 1} more]" if len(lines) > 1 else ""
        raise ConfigError(lines[0] + tail, lines[1:]) from None
    except ValueError as exc:  # raised by our parsers outside pydantic's wrapping
        raise ConfigError(f"{source}: {exc}") from None
    except (TypeError, ArithmeticError, RecursionError) as exc:
        # pydantic passes these through from a validator without the field's name, e.g.
        # OverflowError from bandwidth.parse_size("<400 digits>K") in idle.max_memory_used.
        raise ConfigError(f"{source}: a value is out of range: {_one_line(exc)}") from None


def _describe(error: Mapping[str, Any]) -> str:
    """One error of the configuration, as one line naming its field; a key that is no setting
    with the settings its place accepts."""
    if error["type"] == "extra_forbidden":
        accepted = _accepted_fields(tuple(error["loc"]))
        where = field_path(tuple(error["loc"])).replace("\n", " ")  # the key as written
        return f"{where}: unknown setting; accepted: {accepted}"
    return describe_one_error(error)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def load_config(
    path: Path | None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> NetmonConfig:
    """The file (or the defaults), with NETMON_ overrides and then the command line's `flags`
    (settings by name; a mapping's keys merged into the file's mapping) applied, validated once:
    the file's own text is judged, never numbers it parsed to (`min_busbw: 1K` is 1000 bytes/s,
    which unit-less reads as a mistake)."""
    document = load_document(path)
    source = str(path) if path else "defaults"
    for keys, value in envvars.overrides(os.environ if environ is None else environ):
        env_name = envvars.name_of(keys)
        if keys[0] in _ENV_ROOTS:
            envvars.apply(document, keys, value, env_name)
            source = f"{source} + environment"
        else:
            envvars.warn_if_misspelt(env_name, keys[0], _ENV_ROOTS)
    for name, value in (flags or {}).items():
        given = document.get(name)
        if isinstance(value, Mapping) and isinstance(given, Mapping):
            value = {**given, **value}
        document[name] = value
    if flags:
        source = f"{source} + command line"
    return parse_config(document, source)


def dump(config: NetmonConfig) -> str:
    """The effective configuration as YAML, for `netmon check-config`."""
    data = config.model_dump(mode="json")
    return yaml.safe_dump(data, sort_keys=False)
