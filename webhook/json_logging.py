"""The project's one log format: a JSON object per line, the same for the server and the node.

Every line has ``time`` (UTC, milliseconds), ``level``, ``logger`` and ``message`` (a full
sentence); fields passed with ``extra=`` become top-level keys, so a log pipeline can filter
on ``uid``, ``namespace``, ``event`` and so on without parsing the message.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import sys
from typing import IO, Any

import orjson

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


def utc_timestamp(seconds: float) -> str:
    """``2026-01-02T03:04:05.678+00:00``; the date and time of day are formatted once a second."""
    whole = int(seconds)
    return f"{_second(whole)}.{int((seconds - whole) * 1000):03d}+00:00"


@functools.lru_cache(maxsize=4)
def _second(whole_seconds: int) -> str:
    return dt.datetime.fromtimestamp(whole_seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, then the ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": utc_timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(
            (key, value)
            for key, value in record.__dict__.items()
            if key not in _STANDARD_ATTRIBUTES and key[0] != "_"
        )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def json_handler(stream: IO[str] | None = None) -> logging.Handler:
    """A handler writing JSON lines to ``stream`` (stderr by default)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    return handler
