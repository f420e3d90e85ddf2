"""gunicorn's threaded worker, changed so that no thread ever waits on a client.

The stock ``gthread`` worker gives a new connection to a thread at once: the thread does
the TLS handshake and reads the request, blocking while the client sends nothing or sends
slowly. With 2 workers x 4 threads, eight idle or trickling connections (or a partial
ClientHello) stopped every answer, /healthz included, for as long as they stayed open.

``ReadAheadWorker`` does the handshake and reads each request in the worker's event loop,
without blocking, and acts only when a whole request is buffered (``request_framing``):

- a request of up to ``loop_answer_max_bytes`` (every admission review of an ordinary pod)
  is answered right there in the loop: gunicorn parses bytes already in memory, the app
  runs (a fraction of a millisecond) and the answer is sent without blocking, the rest of
  it when the client reads. This spares the hand-off to a thread and back, which cost a
  quarter of the CPU per admission (bench/README.md);
- a larger one goes to a thread, as in gthread, so that decoding a multi-MiB review does
  not hold up the loop.

What a client can still hold is bounded:

- an unfinished handshake or request is closed ``request_read_timeout`` after it started;
- so is an answer made in the loop that the client has not taken in whole by then;
- at ``worker_connections`` open connections, a new one pushes out the oldest connection
  that is still reading (else the oldest idle kept-alive one), so a flood of idle sockets
  cannot lock out the apiserver's next connection;
- a thread that has spent ``request_read_timeout`` on one request (a client that stops
  reading its answers) has its socket shut down, which ends the blocked write; a request
  still queued for a thread is not timed.

Kept-alive connections wait in the event loop as in gthread and come back through the
same read-ahead. This module relies on gunicorn's ``ThreadWorker`` internals (the version
range is pinned in pyproject.toml); tests/server/test_slow_clients.py exercises each path.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import ssl
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gunicorn import http
from gunicorn import sock as gunicorn_sock
from gunicorn.workers.gthread import TConn, ThreadWorker

from webhook.server.request_framing import Framing, frame, without_expect_continue
from webhook.server.settings import ServeSettings

RECV_BYTES = 256 * 1024
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@dataclass
class _Writing:
    """An answer made in the loop that the client has not taken in whole yet."""

    deadline: float
    data: memoryview
    keepalive: bool
    registered: bool = False  # with the poller, waiting for room to send


class _Outgoing:
    """Stands in for a client's socket while the app answers in the loop: what gunicorn
    writes is kept, for the loop to send without blocking; the rest goes to the socket."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.data = bytearray()

    def sendall(self, data: bytes) -> None:
        self.data += data

    def send(self, data: bytes) -> int:
        self.data += data
        return len(data)

    def setblocking(self, _flag: bool) -> None:
        """The socket stays non-blocking: nothing here may wait on the client."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


@dataclass
class _Reading:
    """A connection whose request is being read in the event loop."""

    deadline: float
    handshaken: bool
    buffer: bytearray = field(default_factory=bytearray)
    continue_sent: bool = False
    registered: bool = False  # with the poller, waiting for more


class ReadAheadWorker(ThreadWorker):  # type: ignore[misc]
    """``gthread`` with handshakes and request reading moved into the event loop."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = ServeSettings.from_environ()
        self.read_timeout = settings.request_read_timeout_seconds
        self.max_body_bytes = settings.max_body_bytes
        self.loop_answer_max_bytes = settings.loop_answer_max_bytes
        # Insertion order is deadline order: every entry gets the same timeout when added.
        self.reading: dict[TConn, _Reading] = {}
        self.busy: dict[TConn, float] = {}
        self.writing: dict[TConn, _Writing] = {}

    # -- connections coming in -------------------------------------------------------

    def accept(self, listener: socket.socket) -> None:
        try:
            client, address = listener.accept()
        except OSError as error:
            if isinstance(error, BlockingIOError | ConnectionAbortedError):
                return
            raise
        self.nr_conns += 1
        self._make_room()
        client.setblocking(False)
        conn = TConn(self.cfg, client, address, listener.getsockname())
        conn.initialized = True  # gthread's init() would handshake in the thread
        handshaken = True
        if self.cfg.is_ssl:
            try:
                conn.sock = gunicorn_sock.ssl_context(self.cfg).wrap_socket(
                    client,
                    server_side=True,
                    do_handshake_on_connect=False,
                    suppress_ragged_eofs=self.cfg.suppress_ragged_eofs,
                )
            except (OSError, ValueError) as error:
                self.log.debug("could not start TLS: %s", error)
                self._drop(conn)
                return
            handshaken = False
        self._start_reading(conn, _Reading(time.monotonic() + self.read_timeout, handshaken))

    def on_client_socket_readable(self, conn: TConn, client: socket.socket) -> None:
        """A kept-alive connection has data: read its next request here, not in a thread."""
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._start_reading(conn, _Reading(time.monotonic() + self.read_timeout, True))

    def finish_request(self, conn: TConn, future: Future[Any]) -> None:
        self.busy.pop(conn, None)
        pipelined = b""
        if (
            self.alive
            and not future.cancelled()
            and future.exception() is None
            and future.result() is True
            and conn.parser is not None
        ):
            pipelined = conn.parser.unreader.take_buffered()
        if not pipelined:
            super().finish_request(conn, future)
            return
        # The client sent (part of) its next request behind this one: read the rest in
        # the loop too, instead of gthread's handing it straight back to a thread.
        conn.sock.setblocking(False)
        reading = _Reading(time.monotonic() + self.read_timeout, True, bytearray(pipelined))
        self._start_reading(conn, reading)

    def handle(self, conn: TConn) -> Any:
        # The thread deadline starts when a thread takes the request, not when it is
        # queued: a request waiting behind a client that stopped reading is not that client
        # (one dict store: atomic, and murder_pending reads a snapshot in the loop).
        self.busy[conn] = time.monotonic() + self.read_timeout
        return super().handle(conn)

    # -- reading in the loop -----------------------------------------------------------

    def _start_reading(self, conn: TConn, reading: _Reading) -> None:
        """Read what has arrived now (usually the whole request); wait for the rest."""
        self.reading[conn] = reading
        self._on_readable(conn, None)

    def _on_readable(self, conn: TConn, _sock: Any) -> None:
        reading = self.reading.get(conn)
        if reading is None:
            return
        framing: Framing | None = None
        try:
            if not reading.handshaken:
                conn.sock.do_handshake()
                reading.handshaken = True
            while len(reading.buffer) <= self.max_body_bytes + 65536:
                data = conn.sock.recv(RECV_BYTES)
                if not data:
                    self._forget(conn)
                    return
                reading.buffer += data
                # Usually one recv brings the whole request: stop there rather than pay
                # for another recv that only says "nothing more" (bytes TLS already
                # decrypted are taken too, or the poller would never report them).
                framing = frame(reading.buffer, self.max_body_bytes)
                if framing.complete:
                    pending = getattr(conn.sock, "pending", lambda: 0)()
                    if pending:
                        reading.buffer += conn.sock.recv(pending)
                        framing = None  # more than the request: frame it again
                    break
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            pass
        except (OSError, ValueError) as error:
            self.log.debug("connection dropped while reading: %s", error)
            self._forget(conn)
            return
        self._advance(conn, reading, framing)

    def _advance(self, conn: TConn, reading: _Reading, framing: Framing | None = None) -> None:
        """Hand the connection to a thread if its request is whole; else keep reading."""
        if framing is None:
            framing = frame(reading.buffer, self.max_body_bytes)
        if framing.expects_continue and not reading.continue_sent:
            try:
                conn.sock.send(_CONTINUE)
            except (OSError, ValueError):
                self._forget(conn)
                return
            reading.continue_sent = True
        if not framing.complete:
            if not reading.registered:
                self.poller.register(
                    conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn)
                )
                reading.registered = True
            return
        self.reading.pop(conn)
        if reading.registered:
            self.poller.unregister(conn.sock)
        data: bytes | bytearray = reading.buffer
        if reading.continue_sent:
            data = without_expect_continue(data)
        if conn.parser is None:
            conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
        conn.parser.unreader.unread(data)
        reading.buffer = bytearray()
        conn.data_ready = True
        if len(data) <= self.loop_answer_max_bytes:
            self._answer_in_loop(conn)
        else:
            self.enqueue_req(conn)

    # -- answering in the loop -----------------------------------------------------------

    def _answer_in_loop(self, conn: TConn) -> None:
        """Run gthread's request handling here, its answer kept rather than written."""
        sock = conn.sock
        outgoing = _Outgoing(sock)
        conn.sock = outgoing
        try:
            keepalive = ThreadWorker.handle(self, conn) is True
        finally:
            conn.sock = sock
        deadline = time.monotonic() + self.read_timeout
        self._send(conn, _Writing(deadline, memoryview(bytes(outgoing.data)), keepalive))

    def _send(self, conn: TConn, writing: _Writing) -> None:
        """Send what the client takes now; wait for room for the rest."""
        try:
            while writing.data:
                sent = conn.sock.send(writing.data)
                writing.data = writing.data[sent:]
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            self.writing[conn] = writing
            if not writing.registered:
                self.poller.register(
                    conn.sock, selectors.EVENT_WRITE, partial(self._on_writable, conn)
                )
                writing.registered = True
            return
        except (OSError, ValueError) as error:
            self.log.debug("connection dropped while answering: %s", error)
            self.writing[conn] = writing
            self._forget(conn)
            return
        if self.writing.pop(conn, None) is not None and writing.registered:
            self.poller.unregister(conn.sock)
        future: Future[Any] = Future()
        future.set_result(writing.keepalive)
        if writing.keepalive and conn.parser is not None and conn.parser.unreader.buf.getvalue():
            # The client sent its next request behind this one: take it on the next turn
            # of the loop rather than deeper in this call (pipelining must not recurse).
            self.method_queue.defer(self.finish_request, conn, future)
        else:
            self.finish_request(conn, future)

    def _on_writable(self, conn: TConn, _sock: Any) -> None:
        writing = self.writing.get(conn)
        if writing is not None:
            self._send(conn, writing)

    # -- bounds --------------------------------------------------------------------------

    def murder_pending(self) -> None:
        """Runs on every loop turn: enforce the read deadline and the thread deadline."""
        super().murder_pending()
        now = time.monotonic()
        while self.reading:
            conn, reading = next(iter(self.reading.items()))
            if reading.deadline > now:
                break
            self._forget(conn)
        for conn in [c for c, writing in self.writing.items() if writing.deadline <= now]:
            self._forget(conn)
        for conn, deadline in list(self.busy.items()):
            if deadline <= now:
                # Unblocks the thread's send/recv; the SSL object sees a closed socket.
                # The base class's shutdown, not SSLSocket's, which drops its SSL state
                # under the thread's feet.
                with contextlib.suppress(OSError):
                    socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)
                del self.busy[conn]

    def _make_room(self) -> None:
        """At the connection cap, close the oldest reading (else idle) connection."""
        while self.nr_conns >= self.worker_connections:
            if self.reading:
                self._forget(next(iter(self.reading)))
            elif self.keepalived_conns:
                conn = self.keepalived_conns.popleft()
                self.poller.unregister(conn.sock)
                self._drop(conn)
            else:
                return

    def _forget(self, conn: TConn) -> None:
        waiting = self.reading.pop(conn, None) or self.writing.pop(conn, None)
        if waiting is not None and waiting.registered:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.poller.unregister(conn.sock)
        self._drop(conn)

    def _drop(self, conn: TConn) -> None:
        self.nr_conns -= 1
        conn.close()
