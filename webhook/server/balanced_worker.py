"""A gunicorn ``gthread`` worker that shares kept-alive connections evenly between processes.

Why: every worker accepts from the one listening socket the arbiter opened, and whichever
wakes first takes the connection. The apiserver (like the benchmark) opens its connections
in a burst and then keeps them alive for minutes, so an unlucky burst leaves one worker, one
core, serving every connection while the others idle: stock gthread split a burst of 8
connections 8/0, 0/8 and 5/3 in three runs of ``tests/server/test_balanced_worker.py``, and
an 8/0 split halves throughput for the life of those connections. (``reuse_port`` does not
help: the kernel hashes each connection to a socket at random, so uneven splits stay common.)

The rule is nginx's ``accept_mutex`` idea without a mutex: a worker that holds more open
connections than some other live worker leaves the next one in the backlog for a short head
start (``HEAD_START_SECONDS``), so the least-loaded worker takes it. If no one has taken it
by then (that worker is stuck or gone), the held-back worker accepts it after all, so the
rule can delay a new connection by at most the head start and never refuses one.

The count is the worker's own, not gthread's ``nr_conns``: that one drifted below zero in
benchmark runs (-19 after a few wrk runs; connections closed by the client seem to be
subtracted twice), so the worker counts the connections it accepted and the first close of
each.

Counts live in a small table in memory shared across ``fork`` (``ConnectionTable``): the
arbiter reserves a slot when it creates the worker object (before forking, single-threaded,
so no lock); the worker writes its pid there once its accept loop runs, then its count; the
config's ``child_exit`` hook frees the slot. Each slot has one writer; readers only compare
counts, so a momentarily stale value costs at most one uneven accept.
"""

from __future__ import annotations

import os
import selectors
import time
from multiprocessing.sharedctypes import RawArray
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

from webhook.server.json_logs import LineBatcher, enable_batching

HEAD_START_SECONDS = 0.05
# While holding back, look again this often: the counts that made us hold may have been
# stale (another worker's accept not yet published).
RECHECK_SECONDS = 0.001
TABLE_SLOTS = 64
_RESERVED = -1  # slot taken by a worker object whose process has not started yet


def should_hold_back(own: int, others: list[int]) -> bool:
    """Whether a worker holding ``own`` connections should leave the next to another worker.

    Only the least-loaded workers accept; with no other live worker, always accept.
    """
    return bool(others) and own > min(others)


class ConnectionTable:
    """Open connections per worker process, in memory shared with every forked worker."""

    def __init__(self, slots: int = TABLE_SLOTS) -> None:
        self._pids: Any = RawArray("q", slots)
        self._counts: Any = RawArray("q", slots)

    def reserve(self) -> int | None:
        """A free slot for a worker about to be forked (arbiter only), or None when full."""
        for slot, pid in enumerate(self._pids):
            if pid == 0 or (pid > 0 and not _alive(pid)):
                self._pids[slot] = _RESERVED
                self._counts[slot] = 0
                return slot
        return None

    def occupy(self, slot: int, pid: int) -> None:
        self._counts[slot] = 0
        self._pids[slot] = pid

    def free(self, slot: int) -> None:
        self._pids[slot] = 0
        self._counts[slot] = 0

    def publish(self, slot: int, connections: int) -> None:
        self._counts[slot] = connections

    def others(self, slot: int) -> list[int]:
        """Connection counts of the other running workers (reserved slots do not count)."""
        return [
            self._counts[index] for index, pid in enumerate(self._pids) if pid > 0 and index != slot
        ]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class BalancedThreadWorker(ThreadWorker):  # type: ignore[misc]
    """``gthread`` with connections spread evenly over the worker processes (see module)."""

    table: ConnectionTable | None = None  # created in the arbiter, inherited by every fork
    _log_lines: LineBatcher  # set when the accept loop starts

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Runs in the arbiter, before the fork.
        if BalancedThreadWorker.table is None:
            BalancedThreadWorker.table = ConnectionTable()
        self.slot = BalancedThreadWorker.table.reserve()
        self._open_connections = 0
        self._hold_until: float | None = None  # listeners are off the poller until then
        self._take_one_until = 0.0  # after a head start ran out: take one connection

    def run(self) -> None:
        # Counted only from here: a worker still importing the app must not be waited for.
        if self.table is not None and self.slot is not None:
            self.table.occupy(self.slot, os.getpid())
        self.log.info("Worker %s accepting connections (balance slot %s)", os.getpid(), self.slot)
        # This loop writes the batched admission log lines (see json_logs).
        self._log_lines = enable_batching()
        try:
            super().run()
        finally:
            self._log_lines.flush()

    def release_slot(self) -> None:
        """Free this worker's slot (arbiter, from the ``child_exit`` hook)."""
        if self.table is not None and self.slot is not None:
            self.table.free(self.slot)
            self.slot = None

    def _publish(self) -> None:
        if self.table is not None and self.slot is not None:
            self.table.publish(self.slot, self._open_connections)

    def _others_hold_fewer(self) -> bool:
        if self.table is None or self.slot is None:
            return False
        return should_hold_back(self._open_connections, self.table.others(self.slot))

    def accept(self, listener: Any) -> None:
        now = time.monotonic()
        take_anyway = now < self._take_one_until
        if not take_anyway and self._others_hold_fewer():
            self._hold_back(now)
            return
        self._take_one_until = 0.0
        super().accept(listener)
        self._publish()

    def enqueue_req(self, conn: Any) -> None:
        # New connections come here straight from ``accept``; kept-alive ones come back.
        if not getattr(conn, "gpushare_counted", False):
            conn.gpushare_counted = True
            self._open_connections += 1
            conn.close = self._counting_close(conn.close)
        super().enqueue_req(conn)

    def _counting_close(self, close: Any) -> Any:
        closed = False

        def close_once(graceful: bool = False) -> None:
            nonlocal closed
            if not closed:
                closed = True
                self._open_connections -= 1
            close(graceful)

        return close_once

    def _hold_back(self, now: float) -> None:
        for listener in self.sockets:
            self.poller.unregister(listener)
        self._hold_until = now + HEAD_START_SECONDS

    def _resume(self, now: float, *, head_start_over: bool) -> None:
        self._hold_until = None
        for listener in self.sockets:
            self.poller.register(listener, selectors.EVENT_READ, self.accept)
        if head_start_over:
            # A connection still waiting now was left alone by the others: take it (one;
            # the rule applies again to the next).
            self._take_one_until = now + HEAD_START_SECONDS

    def set_accept_enabled(self, enabled: bool) -> None:
        if self._hold_until is not None:
            # The listeners are already off the poller; the base class must not unregister
            # them again, and re-enabling registers them afresh.
            self._hold_until = None
            self._accepting = False
            if not enabled:
                return
        super().set_accept_enabled(enabled)

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        self._publish()  # connections closed since the last loop
        log_due = self._log_lines.flush_due()
        if log_due is not None:
            timeout = min(timeout, log_due)
        if self._hold_until is not None:
            now = time.monotonic()
            if now >= self._hold_until:
                self._resume(now, head_start_over=True)
            elif not self._others_hold_fewer():
                self._resume(now, head_start_over=False)
            else:
                timeout = min(timeout, self._hold_until - now, RECHECK_SECONDS)
        super().wait_for_and_dispatch_events(timeout)
