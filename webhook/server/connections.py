"""What one worker's open connections may hold, and who makes room when they hold too much.

Every connection is in one phase: reading a request (its TLS handshake included), answering
it, idle between requests (kept alive), or closing. Two bounds hold for the worker as a
whole, whatever its clients do:

- at most ``max_connections`` open connections: a new one first pushes out the oldest
  closing connection, else the oldest one still reading, else the oldest idle one, so a
  flood of idle or trickling sockets cannot lock out the apiserver's next connection;
- at most ``max_buffered_bytes`` of request bodies reserved at once. A request reserves its
  declared Content-Length (a chunked one the cap) when its head is read, before a byte of
  its body is taken in, and keeps it until its answer is sent. A request that does not fit
  waits, unread (TCP pushes back on its client), for reservations to end, in arrival
  order; meanwhile holders that have sent nothing for ``STALLED_SECONDS`` are closed,
  longest silent first. Reserving whole bodies up front means uploads that are all half
  done can never wait on each other, and a client that sends its review at once, as the
  apiserver does, is never closed for it: it waits a moment at worst. One request may
  always proceed when nothing is reserved;
- at most ``max_loose_bytes`` held outside reservations (input not yet framed, heads, small
  bodies): past it, the readers that have held them longest are closed.

Phases are ordered dicts: insertion order is the order in which connections entered the
phase, so the oldest is the first key.
"""

from __future__ import annotations

import enum
import time
from typing import Protocol

# A reader that has sent nothing for this long while others need room is closed.
STALLED_SECONDS = 1.0


class Phase(enum.Enum):
    READING = "reading"
    ANSWERING = "answering"
    IDLE = "idle"
    CLOSING = "closing"


# The order in which phases give up a connection to make room.
EVICTION_ORDER = (Phase.CLOSING, Phase.READING, Phase.IDLE)


class Evictable(Protocol):
    def evict(self, reason: str) -> None:
        """Close the connection now; ``forget`` follows."""

    def room_granted(self) -> None:
        """The reservation it waited for is now held: read its body."""


class Connections:
    def __init__(
        self, max_connections: int, max_buffered_bytes: int, max_loose_bytes: int = 16 << 20
    ) -> None:
        self.max_connections = max_connections
        self.max_buffered_bytes = max_buffered_bytes
        self.phases: dict[Phase, dict[Evictable, None]] = {phase: {} for phase in Phase}
        self.phase_of: dict[Evictable, Phase] = {}
        self.max_loose_bytes = max_loose_bytes
        self.loose: dict[Evictable, int] = {}
        self.loose_bytes = 0
        self.reserved: dict[Evictable, int] = {}
        self.reserved_bytes = 0
        self.last_data: dict[Evictable, float] = {}
        self.waiting: dict[Evictable, int] = {}

    def __len__(self) -> int:
        return len(self.phase_of)

    def admit(self, connection: Evictable) -> None:
        """Register a new connection as reading, making room at the cap first."""
        while len(self.phase_of) >= self.max_connections:
            if not self._evict_oldest(EVICTION_ORDER, "connection cap"):
                break
        self.phase_of[connection] = Phase.READING
        self.phases[Phase.READING][connection] = None

    def enter(self, connection: Evictable, phase: Phase) -> None:
        """Move ``connection`` to ``phase``, as its newest member."""
        current = self.phase_of.get(connection)
        if current is None:
            return
        del self.phases[current][connection]
        self.phase_of[connection] = phase
        self.phases[phase][connection] = None

    def heard_from(self, connection: Evictable, loose: int) -> None:
        """Bytes arrived for ``connection``, which now holds ``loose`` bytes outside any
        reservation."""
        if connection in self.reserved:
            self.last_data[connection] = time.monotonic()
        self.hold_loose(connection, loose)

    def hold_loose(self, connection: Evictable, size: int) -> None:
        """``connection`` holds ``size`` bytes outside a reservation (unframed input, a small
        body); past ``max_loose_bytes`` in all, the oldest readers holding some are closed."""
        if connection not in self.phase_of:
            return
        self.loose_bytes += size - self.loose.get(connection, 0)
        self.loose[connection] = size
        if self.loose_bytes <= self.max_loose_bytes:
            return
        for victim in list(self.phases[Phase.READING]):
            if self.loose_bytes <= self.max_loose_bytes:
                return
            if victim is not connection and self.loose.get(victim):
                self.evict_one(victim, "buffered bytes")

    def reserve(self, connection: Evictable, size: int) -> bool:
        """Reserve ``size`` body bytes for ``connection``'s request; False when it must wait
        (it is queued, and ``room_granted`` is called once the reservation is held)."""
        if connection not in self.phase_of:
            return False
        if not self.waiting and (self.fits(size) or self.close_stalled(size)):
            self.take(connection, size)
            return True
        self.waiting[connection] = size
        return False

    def fits(self, size: int) -> bool:
        return self.reserved_bytes == 0 or self.reserved_bytes + size <= self.max_buffered_bytes

    def take(self, connection: Evictable, size: int) -> None:
        self.reserved[connection] = size
        self.reserved_bytes += size
        self.last_data[connection] = time.monotonic()

    def release(self, connection: Evictable) -> None:
        """``connection``'s request is answered (or gone): its reservation ends."""
        self.reserved_bytes -= self.reserved.pop(connection, 0)
        self.last_data.pop(connection, None)
        self.grant()

    def grant(self) -> None:
        """Give waiters their reservations, in arrival order, while they fit."""
        while self.waiting:
            waiter, size = next(iter(self.waiting.items()))
            if not self.fits(size):
                return
            del self.waiting[waiter]
            self.take(waiter, size)
            waiter.room_granted()

    def close_stalled(self, size: int) -> bool:
        """Close readers holding a reservation that sent nothing for ``STALLED_SECONDS``,
        longest silent first, until ``size`` fits; True when it does."""
        cutoff = time.monotonic() - STALLED_SECONDS
        stalled = sorted(
            (self.last_data[c], id(c), c)
            for c in self.phases[Phase.READING]
            if c in self.reserved and self.last_data.get(c, 0.0) <= cutoff
        )
        # Choose first, then close: closing one grants its room to waiters at once.
        needed = self.reserved_bytes + size - self.max_buffered_bytes
        victims = []
        for _, _, victim in stalled:
            if needed <= 0:
                break
            victims.append(victim)
            needed -= self.reserved.get(victim, 0)
        for victim in victims:
            self.evict_one(victim, "stalled upload")
        return self.fits(size)

    def retry_waiting(self) -> None:
        """Make room for the first waiter by closing stalled uploads, if any have stalled."""
        if self.waiting:
            self.close_stalled(next(iter(self.waiting.values())))
            self.grant()

    def forget(self, connection: Evictable) -> None:
        phase = self.phase_of.pop(connection, None)
        if phase is not None:
            del self.phases[phase][connection]
        self.waiting.pop(connection, None)
        self.loose_bytes -= self.loose.pop(connection, 0)
        self.release(connection)

    def oldest(self, phase: Phase) -> Evictable | None:
        return next(iter(self.phases[phase]), None)

    def members(self, phase: Phase) -> list[Evictable]:
        return list(self.phases[phase])

    def _evict_oldest(self, phases: tuple[Phase, ...], reason: str) -> bool:
        for phase in phases:
            victim = self.oldest(phase)
            if victim is not None:
                self.evict_one(victim, reason)
                return True
        return False

    def evict_one(self, victim: Evictable, reason: str) -> None:
        self.forget(victim)
        victim.evict(reason)
