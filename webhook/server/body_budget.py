"""How many request-body bytes one worker decodes at once.

A decoded AdmissionReview takes about 20 times its size in memory (measured in
docs/reliability.md: 2.3-3.7 MiB bodies peaked at 42-72 MiB). With several threads per worker,
a few maximum-size bodies at once would take a worker past the Deployment's memory limit, so
large bodies take turns: a body joins the ones being decoded only while their sizes sum to
at most the budget (one body always may). Small bodies, which every real pod is, never wait.
When the last large body is done, the freed memory goes back to the system.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# Bodies this small cost at most a few MiB decoded even on every thread at once.
SMALL_BODY_BYTES = 64 * 1024
# Under the apiserver's default webhook timeout (10 s), so a busy answer arrives in time.
DEFAULT_WAIT_SECONDS = 8.0


def _heap_trimmer() -> Callable[[], None]:
    """glibc's ``malloc_trim(0)``: hands the heap's free memory back to the system.

    Without it a worker keeps the peak of its largest request for good (a 3 MiB body left
    workers about 100 MiB larger). A no-op where the C library has no such call.
    """
    try:
        malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    malloc_trim.argtypes = [ctypes.c_size_t]

    def trim() -> None:
        malloc_trim(0)

    return trim


trim_heap = _heap_trimmer()


class BodyBudget:
    def __init__(self, limit_bytes: int, wait_seconds: float = DEFAULT_WAIT_SECONDS) -> None:
        self.limit_bytes = limit_bytes
        self.wait_seconds = wait_seconds
        self._in_flight = 0
        self._condition = threading.Condition()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @contextmanager
    def hold(self, size: int) -> Iterator[bool]:
        """Yields True once ``size`` bytes fit in the budget, False if they did not in time."""
        if size <= SMALL_BODY_BYTES:
            yield True
            return
        with self._condition:
            admitted = self._condition.wait_for(
                lambda: self._in_flight == 0 or self._in_flight + size <= self.limit_bytes,
                timeout=self.wait_seconds,
            )
            if admitted:
                self._in_flight += size
        if not admitted:
            yield False
            return
        try:
            yield True
        finally:
            with self._condition:
                self._in_flight -= size
                idle = self._in_flight == 0
                self._condition.notify_all()
            if idle:
                trim_heap()
