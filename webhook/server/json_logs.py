"""Structured logs: one JSON object per line, for the webhook's own records and gunicorn's.

Fields given with ``extra=`` become top-level keys, so a log pipeline can filter on
``uid``, ``namespace``, ``decision`` and so on without parsing the message.

The one line per admission goes through ``AdmissionLog`` instead of a logging handler: the
``logging`` module costs ~25 us a record plus a handler lock that gthread workers contend
for, several times what the rest of the webhook adds to a request. ``AdmissionLog`` still
asks the ``gpushare.admission`` logger whether INFO is enabled (so the configured level
rules) and writes the same JSON shape with one ``write`` call, which is atomic on a pipe for
lines under PIPE_BUF (4 KiB), so lines from several threads and workers never interleave.

Under gunicorn the worker turns on batching (``enable_batching``): lines are collected and
written together, up to PIPE_BUF bytes per ``write``, and the worker's loop writes whatever
is older than ``BATCH_MAX_AGE_SECONDS``. A ``write`` per admission cost about 35 us of
worker CPU in the benchmark (a syscall that hands the GIL to another thread each time),
against 3 us for the line itself. What a batch costs: a line reaches stderr up to
``BATCH_MAX_AGE_SECONDS`` late, and a worker killed with SIGKILL loses its unwritten lines
(at most one batch); a graceful stop writes them.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import select
import threading
import time
from typing import IO, Any, ClassVar

import orjson

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRIBUTES and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def logging_config(level: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for gunicorn's ``logconfig_dict``: JSON to stderr."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {
            "gunicorn.error": {"level": level.upper(), "handlers": ["stderr"], "propagate": False},
            # Admissions are logged by the webhook itself, one line each with the decision;
            # gunicorn's access lines would only repeat them without it.
            "gunicorn.access": {"level": "WARNING", "handlers": ["stderr"], "propagate": False},
        },
    }


ADMISSION_LOGGER = "gpushare.admission"
STDERR_FD = 2
_LEVEL_NAMES = {
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warning",
    logging.ERROR: "error",
    logging.CRITICAL: "critical",
}


# ".000+00:00" to ".999+00:00": the end of every timestamp, looked up rather than formatted.
_MILLISECONDS = tuple(f".{millis:03d}+00:00" for millis in range(1000))


class _UtcClock:
    """``datetime.now(UTC).isoformat(timespec="milliseconds")`` for a fraction of its cost.

    The date and time of day are formatted once per second; each call adds milliseconds.
    """

    def __init__(self) -> None:
        self._second: tuple[int, str] = (-1, "")

    def now(self) -> str:
        now = time.time()
        second = int(now)
        cached = self._second
        if cached[0] != second:
            # One tuple swapped in whole: threads racing here all store a correct value.
            cached = self._second = (
                second,
                time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)),
            )
        return cached[1] + _MILLISECONDS[int((now - second) * 1000)]


PIPE_BUF = getattr(select, "PIPE_BUF", 4096)
BATCH_MAX_AGE_SECONDS = 0.2


class LineBatcher:
    """Lines collected for one file descriptor, written in order, PIPE_BUF bytes at most per
    ``write`` so batches from several workers never interleave mid-line on a pipe."""

    def __init__(self, fd: int, max_age: float = BATCH_MAX_AGE_SECONDS) -> None:
        self._fd = fd
        self.max_age = max_age
        self._lines: list[bytes] = []
        self._size = 0
        self._oldest = 0.0
        # Held across the write so batches leave in the order their lines came.
        self._lock = threading.Lock()

    def add(self, line: bytes) -> None:
        with self._lock:
            if self._size + len(line) > PIPE_BUF:
                self._write_locked()
            if len(line) >= PIPE_BUF:
                os.write(self._fd, line)
                return
            if not self._lines:
                self._oldest = time.monotonic()
            self._lines.append(line)
            self._size += len(line)

    def seconds_until_due(self) -> float | None:
        """How long the oldest pending line may still wait; None when nothing is pending."""
        if not self._lines:
            return None
        return max(0.0, self._oldest + self.max_age - time.monotonic())

    def flush(self) -> None:
        """Write all pending lines now."""
        if self._lines:
            with self._lock:
                self._write_locked()

    def flush_due(self) -> float | None:
        """Write the pending lines once the oldest is ``max_age`` old; then how long until
        the next write is due (None when nothing is pending), for the caller's next wait."""
        wait = self.seconds_until_due()
        if wait == 0.0:
            self.flush()
            return None
        return wait

    def _write_locked(self) -> None:
        if self._lines:
            batch = b"".join(self._lines)
            self._lines, self._size = [], 0
            os.write(self._fd, batch)


def enable_batching(max_age: float = BATCH_MAX_AGE_SECONDS) -> LineBatcher:
    """Batch this process's admission lines to stderr; the caller must ``flush`` them."""
    if AdmissionLog.stderr_batcher is None:
        AdmissionLog.stderr_batcher = LineBatcher(STDERR_FD, max_age)
    return AdmissionLog.stderr_batcher


class AdmissionLog:
    """Writes the admission lines; to stderr unless given a binary stream (tests)."""

    # Set once per worker process by ``enable_batching``.
    stderr_batcher: ClassVar[LineBatcher | None] = None

    def __init__(self, stream: IO[bytes] | None = None) -> None:
        self._logger = logging.getLogger(ADMISSION_LOGGER)
        self._stream = stream
        self._clock = _UtcClock()

    def enabled_for(self, level: int) -> bool:
        return self._logger.isEnabledFor(level)

    def entry(self, level: int, message: str) -> dict[str, Any] | None:
        """A new line's time, level, logger and message, to add fields to and ``emit``.

        None when the ``gpushare.admission`` logger is not enabled for ``level``.
        """
        if not self._logger.isEnabledFor(level):
            return None
        return {
            "time": self._clock.now(),
            "level": _LEVEL_NAMES.get(level) or logging.getLevelName(level).lower(),
            "logger": ADMISSION_LOGGER,
            "message": message,
        }

    def emit(self, entry: dict[str, Any]) -> None:
        """Write ``entry`` (from ``entry``) as one JSON line, with a single write."""
        line = orjson.dumps(entry, default=str, option=orjson.OPT_APPEND_NEWLINE)
        if self._stream is not None:
            self._stream.write(line)
        elif self.stderr_batcher is not None:
            self.stderr_batcher.add(line)
        else:
            os.write(STDERR_FD, line)

    def write(self, level: int, message: str, fields: dict[str, Any]) -> None:
        entry = self.entry(level, message)
        if entry is not None:
            entry.update(fields)
            self.emit(entry)
