"""Structured event log of the node side: one JSON line per event, with a full sentence.

Every event the launcher reports (daemon started, died, restarted, fault, label published,
compute mode degraded...) goes through ``emit`` so each is one line with a stable ``event``
name that log pipelines can match, plus the fields that explain it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO

LOGGER_NAME = "gpushare.node"
_LOGGER = logging.getLogger(LOGGER_NAME)

FieldValue = str | int | float | bool | None | list[int] | list[str]


def emit(event: str, message: str, *, level: int = logging.INFO, **fields: FieldValue) -> None:
    """Log ``event`` with a human sentence and machine-readable fields."""
    _LOGGER.log(level, message, extra={"gpushare_event": event, "gpushare_fields": fields})


class JsonLineFormatter(logging.Formatter):
    """Formats a record as one JSON object: time, level, event, msg, then the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": getattr(record, "gpushare_event", record.name),
            "msg": record.getMessage(),
        }
        fields = getattr(record, "gpushare_fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(stream: IO[str] | None = None, level: int = logging.INFO) -> None:
    """Send the node side's events to ``stream`` (stderr by default) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    _LOGGER.handlers[:] = [handler]
    _LOGGER.setLevel(level)
    _LOGGER.propagate = False
