"""The daemon's configuration: the settings' models (`models`) and netmon.yaml read into them
(`loading`). Importers take these names from `netmon.config`."""

from netmon.config.loading import dump, load_config, load_document, parse_config
from netmon.config.models import (
    LinkTelemetryConfig,
    LoggingConfig,
    NetmonConfig,
    ProbeConfig,
    default_probes,
    json_schema,
    resolve,
)

__all__ = [
    "LinkTelemetryConfig",
    "LoggingConfig",
    "NetmonConfig",
    "ProbeConfig",
    "default_probes",
    "dump",
    "json_schema",
    "load_config",
    "load_document",
    "parse_config",
    "resolve",
]
