"""Logging setup: plain text or one JSON object per line, with structured fields per event."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_FIELDS = "netmon_fields"


def event(logger: logging.Logger, message: str, level: int = logging.INFO, **fields: Any) -> None:
    """One log line carrying `fields` (key=value in plain text, keys in JSON)."""
    logger.log(level, message, extra={_FIELDS: fields})


class PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
        fields = getattr(record, _FIELDS, {})
        extra = "".join(f" {key}={_plain(value)}" for key, value in fields.items())
        line = f"{stamp} {record.levelname.lower()} {record.name}: {record.getMessage()}{extra}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _plain(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (" " in text or not text or '"' in text) else text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **getattr(record, _FIELDS, {}),
        }
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


def setup(level: str = "info", fmt: str = "plain") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else PlainFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # APScheduler logs every job start, and every overrun as a warning; netmon's own probe lines
    # and skip counters say more.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
