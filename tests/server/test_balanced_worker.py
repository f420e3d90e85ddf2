"""Kept-alive connections are shared evenly between gunicorn workers (``balanced_worker``)."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from webhook.server.balanced_worker import ConnectionTable, should_hold_back

from .support import RunningServer, running_server, wait_until

# -- the rule and the shared table -----------------------------------------------------------


@pytest.mark.parametrize(
    ("own", "others", "hold"),
    [
        (0, [], False),  # alone: always accept
        (5, [], False),
        (0, [0], False),  # tie: both may take it
        (3, [3, 3], False),
        (1, [0], True),  # someone holds fewer: leave it to them
        (4, [7, 2], True),
        (2, [3, 5], False),
    ],
)
def test_only_the_least_loaded_workers_accept(own: int, others: list[int], hold: bool) -> None:
    assert should_hold_back(own, others) is hold


def test_table_counts_running_workers_only() -> None:
    table = ConnectionTable(slots=4)
    first, second, third = table.reserve(), table.reserve(), table.reserve()
    assert (first, second, third) == (0, 1, 2)
    table.occupy(0, os.getpid())
    table.occupy(1, os.getppid())
    table.publish(0, 3)
    table.publish(1, 5)
    # Slot 2 is reserved but its process has not started: not a worker to defer to.
    assert table.others(0) == [5]
    assert table.others(1) == [3]
    assert table.others(2) == [3, 5]


def test_table_frees_and_reclaims_slots() -> None:
    table = ConnectionTable(slots=2)
    assert table.reserve() == 0
    assert table.reserve() == 1
    assert table.reserve() is None  # full: the worker runs unbalanced, as stock gthread
    table.free(0)
    assert table.reserve() == 0
    # A slot whose process is gone (no child_exit hook ran) is taken back.
    table.occupy(1, _dead_pid())
    table.publish(1, 9)
    assert table.reserve() == 1
    assert table.others(0) == []


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


# -- the real server ---------------------------------------------------------------------------

BURST = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("balanced")) as running:  # 2 workers
        yield running


def established_inodes(port: int) -> set[str]:
    """Socket inodes of ESTABLISHED connections whose local port is ``port`` (server side)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01":
                inodes.add(fields[9])
    return inodes


def connections_per_worker(server: RunningServer) -> dict[int, int]:
    inodes = established_inodes(server.port)
    counts = {}
    for pid in server.worker_pids():
        held = 0
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                held += 1
        counts[pid] = held
    return counts


@contextmanager
def burst_of_connections(server: RunningServer, count: int) -> Iterator[list[ssl.SSLSocket]]:
    """``count`` TCP connections opened at once (as wrk or the apiserver do), then each used.

    All connects are sent before any is accepted, so the workers race for them; then each
    connection completes its TLS handshake and one keep-alive request.
    """
    context = server.context()
    with ExitStack() as stack:
        raw = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in raw:
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", server.port))
        _, writable, _ = select.select([], raw, [], 10)
        assert len(writable) == count, "connections were not established"
        used = []
        for sock in raw:
            sock.setblocking(True)
            sock.settimeout(10)
            tls = stack.enter_context(context.wrap_socket(sock, server_hostname="127.0.0.1"))
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: gpushare\r\n\r\n")
            assert tls.recv(4096).startswith(b"HTTP/1.1 200")
            used.append(tls)
        yield used


def settled(server: RunningServer, total: int) -> dict[int, int]:
    wait_until(lambda: sum(connections_per_worker(server).values()) == total, timeout=10)
    return connections_per_worker(server)


def accepting(server: RunningServer, workers: int) -> bool:
    """Whether ``workers`` of the current worker processes have started their accept loop."""
    started = re.findall(r"Worker (\d+) accepting connections", server.log())
    return len({int(pid) for pid in started} & set(server.worker_pids())) == workers


@pytest.mark.server
def test_a_burst_of_connections_is_split_evenly(server: RunningServer) -> None:
    # Stock gthread gave splits such as 8/0 and 7/1 here; every burst must come out 4/4.
    assert wait_until(lambda: accepting(server, 2), 30), server.log()
    for _ in range(4):
        assert settled(server, 0)
        with burst_of_connections(server, BURST):
            counts = settled(server, BURST)
            assert sorted(counts.values()) == [BURST // 2, BURST // 2], counts


@pytest.mark.server
def test_a_stuck_worker_only_delays_new_connections(server: RunningServer) -> None:
    """A worker holding more than a stopped one still takes each connection after its head
    start; holding back must never leave a connection waiting for a worker that is gone."""
    assert settled(server, 0)
    stuck, running = server.worker_pids()
    os.kill(stuck, signal.SIGSTOP)
    try:
        started = time.monotonic()
        context = server.context()
        with ExitStack() as stack:
            for _ in range(6):  # each kept open: the running worker holds ever more
                raw = stack.enter_context(
                    socket.create_connection(("127.0.0.1", server.port), timeout=10)
                )
                tls = stack.enter_context(context.wrap_socket(raw, server_hostname="127.0.0.1"))
                tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: gpushare\r\n\r\n")
                assert tls.recv(4096).startswith(b"HTTP/1.1 200")
            elapsed = time.monotonic() - started
            assert connections_per_worker(server) == {stuck: 0, running: 6}
    finally:
        os.kill(stuck, signal.SIGCONT)
    assert elapsed < 5, f"6 connections took {elapsed:.1f}s with one worker stopped"


@pytest.mark.server
def test_balance_survives_a_worker_being_killed(server: RunningServer) -> None:
    assert settled(server, 0)
    victim = server.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    assert wait_until(
        lambda: len(server.worker_pids()) == 2 and victim not in server.worker_pids(), 20
    )
    assert wait_until(lambda: accepting(server, 2), 30), server.log()
    assert settled(server, 0)
    with burst_of_connections(server, BURST):
        counts = settled(server, BURST)
        assert sorted(counts.values()) == [BURST // 2, BURST // 2], counts
