"""Clients that connect and send nothing, or send slowly, cost the server no thread.

Each test runs a real ``gpushare serve`` with one worker of two threads, so a handful of
held connections would stop it if any held a thread (the stock gthread worker did: eight
idle connections stopped 2 x 4 threads). Normal requests must then answer well before the
read deadline, i.e. without waiting for the held connections to be dropped.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.long_runs import scaled

from .support import RunningServer, annotated_pod, review, running_server

pytestmark = pytest.mark.server

READ_TIMEOUT = 3.0
# A normal request must be answered within this, well before any held connection is dropped.
PATIENCE = READ_TIMEOUT - 0.5
HELD_PER_KIND = scaled(12, 60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(
        tmp_path_factory.mktemp("slow"),
        "--workers",
        "1",
        "--threads",
        "2",
        "--request-read-timeout",
        str(READ_TIMEOUT),
        "--max-connections",
        "400",
    ) as running:
        yield running


def _tcp(server: RunningServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _tls(server: RunningServer) -> ssl.SSLSocket:
    return server.context().wrap_socket(_tcp(server), server_hostname="127.0.0.1")


def _client_hello(server: RunningServer) -> bytes:
    outgoing = ssl.MemoryBIO()
    connection = server.context().wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="x")
    with contextlib.suppress(ssl.SSLWantReadError):
        connection.do_handshake()
    return outgoing.read()


def _held_connections(server: RunningServer) -> list[socket.socket]:
    """Every way to hold a connection open without finishing a request."""
    held: list[socket.socket] = []
    hello = _client_hello(server)
    head = b"POST /mutate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
    for _ in range(HELD_PER_KIND):
        held.append(_tcp(server))  # bare TCP connect
        partial = _tcp(server)
        partial.sendall(hello[:20])  # a ClientHello cut short
        held.append(partial)
        held.append(_tls(server))  # handshake done, nothing sent
        trickle = _tls(server)
        trickle.sendall(head[:30])  # headers cut short
        held.append(trickle)
        body = _tls(server)
        body.sendall(head + b'Content-Length: 5000\r\n\r\n{"apiVersion"')  # body cut short
        held.append(body)
    return held


def _answer_time(server: RunningServer, path: str, payload: object = None) -> float:
    started = time.monotonic()
    connection = server.connection(timeout=PATIENCE)
    try:
        if payload is None:
            connection.request("GET", path)
        else:
            body = json.dumps(payload).encode()
            connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        assert response.status == 200
    finally:
        connection.close()
    return time.monotonic() - started


def test_held_connections_do_not_stop_answers(server: RunningServer) -> None:
    held = _held_connections(server)
    try:
        for _ in range(scaled(10, 100)):
            _answer_time(server, "/healthz")
            _answer_time(server, "/mutate", review(annotated_pod()))
    finally:
        for connection in held:
            connection.close()


def _closed_by_server(connection: socket.socket, within: float) -> bool:
    connection.settimeout(within)
    try:
        return connection.recv(1) == b""
    except ssl.SSLError:
        return True  # the TLS layer saw the close first
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_an_unfinished_request_is_closed_at_the_read_deadline(server: RunningServer) -> None:
    idle = _tls(server)
    started = time.monotonic()
    with idle:
        assert _closed_by_server(idle, READ_TIMEOUT + 3)
    assert time.monotonic() - started >= READ_TIMEOUT - 1.5


def test_a_flood_past_the_connection_cap_pushes_out_the_oldest(tmp_path: Path) -> None:
    with running_server(
        tmp_path, "--workers", "1", "--threads", "2", "--max-connections", "16"
    ) as capped:
        flood = [_tcp(capped) for _ in range(40)]
        try:
            _answer_time(capped, "/healthz")
            assert _closed_by_server(flood[0], 2.0), "the oldest idle connection is still open"
            assert not _closed_by_server(flood[-1], 0.2), "the newest was closed instead"
        finally:
            for connection in flood:
                connection.close()


def test_a_client_that_stops_reading_answers_loses_its_thread(tmp_path: Path) -> None:
    with running_server(
        tmp_path,
        "--workers",
        "1",
        "--threads",
        "1",
        "--request-read-timeout",
        str(READ_TIMEOUT),
    ) as single:
        greedy = _tls(single)
        # Pipelined requests whose answers (several MiB in all) fill both socket buffers:
        # the one thread blocks writing until the server gives up on this client.
        greedy.sendall(b"GET /metrics HTTP/1.1\r\nHost: webhook\r\n\r\n" * 6000)
        try:
            time.sleep(1.5)  # the buffers fill and the thread blocks
            started = time.monotonic()
            connection = single.connection(timeout=READ_TIMEOUT + 5)
            try:
                connection.request("GET", "/healthz")
                assert connection.getresponse().status == 200
            finally:
                connection.close()
            assert time.monotonic() - started < READ_TIMEOUT + 5
        finally:
            greedy.close()
