"""The node side's event log: every transition the launcher reports, one JSON line each.

Every event (daemon started, died, restarted, fault, label published, compute mode
degraded...) goes through ``emit``, so each line carries a stable ``event`` name that log
pipelines can match, a full-sentence ``message``, and the fields that explain it, all as
top-level keys of the project's one log format (``webhook.json_logging``).
"""

from __future__ import annotations

import logging
from typing import IO

from webhook.json_logging import json_handler

LOGGER_NAME = "gpushare.node"
_LOGGER = logging.getLogger(LOGGER_NAME)

FieldValue = str | int | float | bool | None | list[int] | list[str]

# Keys the log format writes itself; an event field of the same name would overwrite them.
_FORMAT_KEYS = frozenset({"time", "level", "logger", "message", "exception"})


def emit(event: str, message: str, *, level: int = logging.INFO, **fields: FieldValue) -> None:
    """Log ``event`` with a human sentence and machine-readable fields."""
    clashes = _FORMAT_KEYS & fields.keys()
    if clashes:
        raise ValueError(f"Event {event!r} has fields {sorted(clashes)} the log format owns.")
    _LOGGER.log(level, message, extra={"event": event, **fields})


def configure(stream: IO[str] | None = None, level: int = logging.INFO) -> None:
    """Send the node side's events to ``stream`` (stderr by default) as JSON lines."""
    _LOGGER.handlers[:] = [json_handler(stream)]
    _LOGGER.setLevel(level)
    _LOGGER.propagate = False
