"""The bounds one worker keeps on its connections, on the registry alone (no sockets)."""

from __future__ import annotations

import pytest

from webhook.server import connections as registry
from webhook.server.connections import Connections, Phase

MiB = 1 << 20


class Fake:
    def __init__(self, name: str) -> None:
        self.name = name
        self.evicted: str | None = None
        self.granted = False

    def evict(self, reason: str) -> None:
        self.evicted = reason

    def room_granted(self) -> None:
        self.granted = True


def admitted(table: Connections, count: int) -> list[Fake]:
    fakes = [Fake(f"c{index}") for index in range(count)]
    for fake in fakes:
        table.admit(fake)
    return fakes


def test_the_cap_pushes_out_closing_then_reading_then_idle() -> None:
    table = Connections(max_connections=3, max_buffered_bytes=10 * MiB)
    idle, reading, closing = admitted(table, 3)
    table.enter(idle, Phase.IDLE)
    table.enter(closing, Phase.CLOSING)
    table.admit(Fake("new"))
    assert closing.evicted == "connection cap" and reading.evicted is None
    table.admit(Fake("newer"))
    assert reading.evicted == "connection cap" and idle.evicted is None
    assert len(table) == 3


def test_reservations_wait_in_order_and_are_granted_on_release() -> None:
    table = Connections(max_connections=10, max_buffered_bytes=6 * MiB)
    first, second, third = admitted(table, 3)
    assert table.reserve(first, 4 * MiB)
    assert not table.reserve(second, 4 * MiB)
    assert not table.reserve(third, 1 * MiB)  # queued behind the second, though it fits
    table.release(first)
    assert second.granted and third.granted
    assert table.reserved_bytes == 5 * MiB


def test_one_request_may_always_proceed() -> None:
    table = Connections(max_connections=10, max_buffered_bytes=1 * MiB)
    (alone,) = admitted(table, 1)
    assert table.reserve(alone, 3 * MiB)


def test_a_stalled_upload_makes_room(monkeypatch: pytest.MonkeyPatch) -> None:
    table = Connections(max_connections=10, max_buffered_bytes=4 * MiB)
    stalled, moving, waiting = admitted(table, 3)
    now = [100.0]
    monkeypatch.setattr(registry.time, "monotonic", lambda: now[0])
    assert table.reserve(stalled, 2 * MiB)
    assert table.reserve(moving, 2 * MiB)
    now[0] += registry.STALLED_SECONDS / 2
    table.heard_from(moving, 0)
    assert not table.reserve(waiting, 2 * MiB)
    now[0] += registry.STALLED_SECONDS
    table.retry_waiting()  # the stalled upload has sent nothing for longer than the bound
    assert stalled.evicted == "stalled upload" and moving.evicted is None
    assert waiting.granted


def test_loose_bytes_past_the_bound_close_the_oldest_holders() -> None:
    table = Connections(max_connections=100, max_buffered_bytes=8 * MiB, max_loose_bytes=MiB)
    fakes = admitted(table, 20)
    for fake in fakes:
        table.heard_from(fake, 100_000)
    closed = [fake for fake in fakes if fake.evicted]
    assert closed == fakes[: len(closed)] and 0 < len(closed) < len(fakes)
    assert table.loose_bytes <= MiB
