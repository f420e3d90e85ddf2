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


def _tcp(server: RunningServer, receive_buffer: int | None = None) -> socket.socket:
    connection = socket.socket()
    if receive_buffer is not None:
        # Set before connecting: a fixed buffer, not one the kernel grows (up to 32 MiB on
        # some kernels, which would take in every answer a test means to leave unread).
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    connection.settimeout(10)
    connection.connect(("127.0.0.1", server.port))
    return connection


def _tls(server: RunningServer, receive_buffer: int | None = None) -> ssl.SSLSocket:
    return server.context().wrap_socket(_tcp(server, receive_buffer), server_hostname="127.0.0.1")


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


@pytest.mark.parametrize("loop_answer_max_bytes", ["0", "65536"], ids=["threads", "loop"])
def test_a_client_that_stops_reading_answers_is_cut_off(
    tmp_path: Path, loop_answer_max_bytes: str
) -> None:
    """Answered by a thread, the write blocks that thread until its deadline shuts the
    socket; answered in the loop, the rest of the answer waits in the loop, which goes on
    serving others, until the same deadline closes the connection."""
    with running_server(
        tmp_path,
        "--workers",
        "1",
        "--threads",
        "1",
        "--request-read-timeout",
        str(READ_TIMEOUT),
        "--loop-answer-max-bytes",
        loop_answer_max_bytes,
    ) as single:
        greedy = _tls(single, receive_buffer=64 * 1024)
        # Pipelined requests whose answers (about 30 MiB in all) fill both socket buffers:
        # the one thread (or the loop's answer) waits until the server gives up on this client.
        greedy.sendall(b"GET /metrics HTTP/1.1\r\nHost: webhook\r\n\r\n" * PIPELINED)
        try:
            time.sleep(1.5)  # the buffers fill and the writer waits
            started = time.monotonic()
            connection = single.connection(timeout=READ_TIMEOUT + 5)
            try:
                connection.request("GET", "/healthz")
                assert connection.getresponse().status == 200
            finally:
                connection.close()
            assert time.monotonic() - started < READ_TIMEOUT + 5
            # Past the deadline of the answer that cannot be sent: the server makes answers
            # for a few seconds (about 4 MiB fit in the buffers) and then waits READ_TIMEOUT.
            time.sleep(READ_TIMEOUT + 9.0)
            answers = _answers_until_closed(greedy, within=30.0)
            assert 0 < answers < PIPELINED, "the server never gave up on the greedy client"
        finally:
            greedy.close()


PIPELINED = 6000


def _answers_until_closed(connection: ssl.SSLSocket, within: float) -> int:
    """How many answers arrive before the server closes ``connection``."""
    connection.settimeout(within)
    received = bytearray()
    with contextlib.suppress(ssl.SSLError, ConnectionResetError):
        while chunk := connection.recv(1 << 20):
            received += chunk
    return received.count(b"HTTP/1.1 200 ")


def test_pipelined_requests_answered_in_the_loop_come_back_in_order(
    server: RunningServer,
) -> None:
    count = 2000
    client = _tls(server)
    with client:
        requests = b"".join(
            b"GET /healthz?n=%d HTTP/1.1\r\nHost: webhook\r\n\r\n" % n for n in range(count)
        )
        client.sendall(
            requests + b"GET /healthz HTTP/1.1\r\nHost: webhook\r\nConnection: close\r\n\r\n"
        )
        answers = _answers_until_closed(client, within=30.0)
    assert answers == count + 1


def test_small_and_large_reviews_are_answered_alike_on_one_connection(
    server: RunningServer,
) -> None:
    """A review under loop_answer_max_bytes is answered in the loop, a larger one by a
    thread; both give the same patch, in turn on one kept-alive connection."""
    small = annotated_pod()
    large = annotated_pod()
    large["metadata"]["labels"]["padding"] = "x" * 63
    large["metadata"]["annotations"]["notes"] = "n" * 200_000
    connection = server.connection()
    try:
        patches = []
        for pod in (small, large, small):
            body = json.dumps(review(pod)).encode()
            connection.request("POST", "/mutate", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = json.loads(response.read())
            assert response.status == 200 and answer["response"]["allowed"]
            patches.append(answer["response"]["patch"])
    finally:
        connection.close()
    assert len(json.dumps(review(large))) > 65536 > len(json.dumps(review(small)))
    assert patches[0] == patches[1] == patches[2]
