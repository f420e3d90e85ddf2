"""Clients probing the front door: none of them may stall other answers or grow the server.

Each case was found by probing the earlier gthread-based worker as a hostile client (issue
25); each test runs the real ``gpushare serve`` (gunicorn arbiter, asyncio workers, TLS)
and checks the bound that now holds, with an ordinary admission answered alongside.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from .support import (
    REPO,
    RunningServer,
    annotated_pod,
    clean_environment,
    review,
    running_server,
    wait_until,
)

pytestmark = pytest.mark.server

READ_TIMEOUT = 4.0
# An ordinary admission must be answered within this while hostile clients are at work.
PATIENCE = 1.5
HEAD = b"POST /mutate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # As shipped: 2 workers x 4 threads.
    with running_server(
        tmp_path_factory.mktemp("hostile"),
        "--threads",
        "4",
        "--request-read-timeout",
        str(READ_TIMEOUT),
    ) as running:
        yield running


def tls(server: RunningServer, receive_buffer: int | None = None) -> ssl.SSLSocket:
    raw = socket.socket()
    if receive_buffer is not None:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    raw.settimeout(10)
    raw.connect(("127.0.0.1", server.port))
    return server.context().wrap_socket(raw, server_hostname="127.0.0.1")


def status_of(connection: ssl.SSLSocket, within: float) -> int:
    """The status code of the next answer on ``connection`` (0: none within the time)."""
    connection.settimeout(within)
    received = b""
    with contextlib.suppress(TimeoutError, ssl.SSLError, ConnectionResetError):
        while b"\r\n" not in received:
            chunk = connection.recv(4096)
            if not chunk:
                break
            received += chunk
    if not received.startswith(b"HTTP/1.1 "):
        return 0
    return int(received.split(b" ", 2)[1])


def admission_seconds(server: RunningServer) -> float:
    """How long an ordinary admission on a fresh connection takes (it must be allowed)."""
    started = time.monotonic()
    connection = server.connection(timeout=10)
    try:
        body = json.dumps(review(annotated_pod())).encode()
        connection.request("POST", "/mutate", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read())
        assert response.status == 200 and answer["response"]["allowed"]
    finally:
        connection.close()
    return time.monotonic() - started


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def worker_cpu_seconds(server: RunningServer) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in server.worker_pids():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


@pytest.mark.parametrize("expect", [False, True], ids=["plain", "expect-100-continue"])
def test_a_huge_declared_body_is_refused_at_once(server: RunningServer, expect: bool) -> None:
    head = HEAD + b"Content-Length: 99999999999\r\n"
    if expect:
        head += b"Expect: 100-continue\r\n"
    clients = [tls(server) for _ in range(4)]
    try:
        for _ in range(3):  # the clients send it again and again, as in the probe
            started = time.monotonic()
            for client in clients:
                client.sendall(head + b"\r\n")
            for client in clients:
                assert status_of(client, within=PATIENCE) == 413  # no "100 Continue" first
            assert time.monotonic() - started < PATIENCE
            assert admission_seconds(server) < PATIENCE
            for client in clients:
                client.close()
            clients = [tls(server) for _ in range(4)]
    finally:
        for client in clients:
            client.close()


def test_a_review_sent_a_byte_at_a_time_costs_linear_work(server: RunningServer) -> None:
    """Every byte in a TLS record of its own: framing must not start over at each one."""
    pod = annotated_pod()
    pod["metadata"]["annotations"]["notes"] = "n" * 60_000
    body = json.dumps(review(pod)).encode()
    request = HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body
    client = tls(server)
    cpu_before = worker_cpu_seconds(server)
    done = threading.Event()

    def trickle() -> None:
        with contextlib.suppress(OSError):
            for index in range(len(request)):
                client.send(request[index : index + 1])
        done.set()

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    try:
        while not done.wait(0.2):
            assert admission_seconds(server) < PATIENCE
        sender.join()
        assert status_of(client, within=READ_TIMEOUT) == 200
    finally:
        client.close()
    # About 60,000 records; framing the buffer again from the start after each one made the
    # old worker's cost grow with the square of the size.
    spent = worker_cpu_seconds(server) - cpu_before
    print(f"worker CPU for a review of {len(request)} one-byte records: {spent:.2f} s")
    assert spent < 5.0


@pytest.mark.parametrize(
    "ending",
    [b"Connection: close\r\n", b"HTTP/1.0"],
    ids=["connection-close", "http-1.0"],
)
def test_a_client_that_asks_to_close_and_stays_holds_nothing(
    server: RunningServer, ending: bytes
) -> None:
    body = json.dumps(review(annotated_pod())).encode()
    head = HEAD.replace(b"HTTP/1.1", b"HTTP/1.0") if ending == b"HTTP/1.0" else HEAD + ending
    stayers = [tls(server) for _ in range(16)]
    try:
        for client in stayers:
            client.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        for client in stayers:
            assert status_of(client, within=PATIENCE) == 200
        # They keep their sockets open without reading on: others are answered at once.
        for _ in range(5):
            assert admission_seconds(server) < PATIENCE
    finally:
        for client in stayers:
            client.close()


def test_garbage_and_bare_line_feeds_are_answered_at_once(server: RunningServer) -> None:
    body = json.dumps(review(annotated_pod())).encode()
    bare = b"POST /mutate HTTP/1.1\nHost: webhook\nContent-Type: application/json\n"
    cases = {
        "bare LF": (bare + b"Content-Length: %d\n\n" % len(body) + body, (200, 400)),
        "garbage": (b"\x16\x03 this is not HTTP\r\n\r\n", (400,)),
        "bad length": (HEAD + b"Content-Length: -5\r\n\r\n", (400,)),
    }
    for name, (request, statuses) in cases.items():
        client = tls(server)
        with client:
            started = time.monotonic()
            client.sendall(request)
            status = status_of(client, within=READ_TIMEOUT + 2)
            assert status in statuses, f"{name}: {status}"
            assert time.monotonic() - started < PATIENCE, name


def test_unfinished_bodies_do_not_grow_the_server(server: RunningServer) -> None:
    """120 connections each send all but the last byte of a body at the cap, at once."""
    cap = 3 * 1024 * 1024
    pids = server.worker_pids()
    before = rss_bytes(pids)
    request = HEAD + b"Content-Length: %d\r\n\r\n" % cap + b"x" * (cap - 1)
    clients: list[ssl.SSLSocket] = []
    peak = before

    def upload() -> None:
        client = tls(server)
        clients.append(client)
        with contextlib.suppress(OSError):  # closed by the server, or pushed back
            client.sendall(request)

    senders = [threading.Thread(target=upload, daemon=True) for _ in range(120)]
    try:
        for sender in senders:
            sender.start()
        deadline = time.monotonic() + 30
        while any(sender.is_alive() for sender in senders) and time.monotonic() < deadline:
            peak = max(peak, rss_bytes(pids))
            time.sleep(0.05)
        assert admission_seconds(server) < PATIENCE
    finally:
        for client in list(clients):
            client.close()
    grown = peak - before
    print(f"120 unfinished bodies at the cap: workers grew by {grown / 2**20:.0f} MiB at most")
    # Two workers, each holding about four bodies at the cap (connections.Connections).
    assert grown < 80 * 1024 * 1024, f"workers grew by {grown / 2**20:.0f} MiB"


def test_sigterm_answers_requests_being_uploaded(tmp_path: Path) -> None:
    with running_server(tmp_path, "--threads", "4") as stopping:
        body = json.dumps(review(annotated_pod())).encode()
        request = HEAD + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        uploading = [tls(stopping) for _ in range(40)]
        for client in uploading:
            client.sendall(request[:-10])
        time.sleep(0.5)
        stopping.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        for client in uploading:
            client.sendall(request[-10:])
        statuses = [status_of(client, within=10) for client in uploading]
        for client in uploading:
            client.close()
        assert stopping.process.wait(timeout=30) == 0
    assert statuses == [200] * 40


def test_a_second_server_on_a_taken_port_refuses_to_start(
    server: RunningServer, tmp_path: Path
) -> None:
    second = subprocess.run(
        [
            *(sys.executable, "-m", "webhook.cli", "serve"),
            *("--port", str(server.port), "--state-dir", str(tmp_path / "state")),
        ],
        cwd=REPO,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert second.returncode != 0
    assert f"Another server already listens on 127.0.0.1:{server.port}" in second.stderr
    assert wait_until(lambda: admission_seconds(server) < PATIENCE, 5)


def test_reviews_of_huge_argument_lists_are_refused_within_the_memory_limit(
    server: RunningServer,
) -> None:
    """Eight at once of a review within the cap holding 800,000 one-character args: each is
    refused with what to change, and the workers stay within the Deployment's limit."""
    pod = annotated_pod()
    pod["spec"]["containers"][0]["args"] = ["a"] * 800_000
    body = json.dumps(review(pod), separators=(",", ":")).encode()
    assert len(body) < 3 * 1024 * 1024 + 64 * 1024
    pids = [server.process.pid, *server.worker_pids()]
    peak = rss_bytes(pids)
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            with contextlib.suppress(OSError):
                peak = max(peak, rss_bytes(pids))
            time.sleep(0.01)

    def send(_: int) -> tuple[int, dict[str, object]]:
        status, answer = server.request("POST", "/mutate", body)
        return status, json.loads(answer)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(send, range(8)))
    finally:
        stop.set()
        sampler.join()
    print(f"8 reviews of 800,000 args at once: peak RSS {peak / 2**20:.0f} MiB")
    for status, answer in answers:
        response = answer["response"]
        assert status == 200 and response["allowed"] is False  # type: ignore[index]
        message = response["status"]["message"]  # type: ignore[index]
        assert "800002 command and args items" in message
    assert peak < 384 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB"
