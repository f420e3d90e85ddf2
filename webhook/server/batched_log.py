"""A logging handler that writes the admission lines in batches, not one write per line.

Why: a ``write`` per admission line made the earlier thread-based workers spend a large
share of their CPU per admission on the syscall and the GIL hand-offs around it
(bench/README.md, "Why the server is built the way it is"). This handler collects
formatted lines and writes them together: whole lines only, at most ``PIPE_BUF`` bytes per
``write`` (atomic on a pipe, so lines of several workers sharing stderr never interleave),
and never later than ``max_delay`` seconds after a line was logged.

What that costs: a line reaches the log up to ``max_delay`` late, and a worker killed with
SIGKILL loses what it had not written (at most ``max_delay`` worth); a graceful stop writes
it (``logging.shutdown`` closes handlers at exit).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

# The logger of the one line per admission (``admission_log``), which this handler serves.
ADMISSION_LOGGER = "gpushare.admission"
PIPE_BUF = 4096
STDERR_FD = 2
DEFAULT_MAX_DELAY_SECONDS = 0.2


class BatchedLineHandler(logging.Handler):
    """Formats each record into one line and writes lines in batches to a file descriptor."""

    def __init__(self, fd: int = STDERR_FD, max_delay: float = DEFAULT_MAX_DELAY_SECONDS) -> None:
        super().__init__()
        self.fd = fd
        self.max_delay = max_delay
        self._lines: list[bytes] = []
        self._size = 0
        self._batch_lock = threading.Lock()
        self._flusher_pid: int | None = None
        self._wake = threading.Event()

    def handle(self, record: logging.LogRecord) -> bool:
        """Format outside any lock, then take the batch lock only to add the line.

        ``logging.Handler.handle`` would hold the handler's lock while formatting, which the
        worker's threads then contend for on every admission.
        """
        if not self.filter(record):
            return False
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = (self.format(record) + "\n").encode()
        except Exception:
            self.handleError(record)
            return
        self._start_flusher()
        with self._batch_lock:
            if self._size + len(line) > PIPE_BUF:
                self._write_locked()
            self._lines.append(line)
            self._size += len(line)

    def flush(self) -> None:
        with self._batch_lock:
            self._write_locked()

    def close(self) -> None:
        self.flush()
        self._wake.set()
        super().close()

    def _write_locked(self) -> None:
        if not self._lines:
            return
        data = b"".join(self._lines)
        self._lines.clear()
        self._size = 0
        with contextlib.suppress(OSError):  # stderr gone: nowhere else to put a log line
            os.write(self.fd, data)

    def _start_flusher(self) -> None:
        # One flusher thread per process, started on first use: gunicorn forks workers
        # after configuring logging, and threads do not survive a fork.
        pid = os.getpid()
        if self._flusher_pid == pid:
            return
        with self._batch_lock:
            if self._flusher_pid == pid:
                return
            self._flusher_pid = pid
            self._wake = threading.Event()
            threading.Thread(
                target=self._flush_periodically, name="log-flusher", daemon=True
            ).start()

    def _flush_periodically(self) -> None:
        while not self._wake.wait(self.max_delay):
            self.flush()
