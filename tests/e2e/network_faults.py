"""A webhook that is slow or down, without changing the webhook.

`DelayingProxy` relays TCP to a real server but holds each connection back, which makes the
webhook slower than its `timeoutSeconds`; `closed_port()` is a port nothing listens on.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.processes import LOOPBACK, ControlPlaneError, free_ports


@dataclass
class DelayingProxy:
    """A TCP relay to 127.0.0.1:`upstream_port` that waits `delay` seconds per connection.

    TLS passes through untouched (the upstream's certificate is what the client sees), so
    registering `https://127.0.0.1:<proxy port>` with the upstream's CA makes a webhook as
    slow as `delay` without changing it. Set `delay` to 0 to make it transparent.
    """

    upstream_port: int
    delay: float
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _listener: socket.socket | None = field(default=None, repr=False)
    _threads: list[threading.Thread] = field(default_factory=list, repr=False)
    _sockets: list[socket.socket] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def port(self) -> int:
        assert self._listener is not None, "start() first"
        return int(self._listener.getsockname()[1])

    def __enter__(self) -> DelayingProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((LOOPBACK, 0))
        listener.listen(64)
        listener.settimeout(0.1)
        self._listener = listener
        self._spawn(self._accept_loop)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=10)
        with self._lock:
            for sock in self._sockets:
                sock.close()
        if self._listener is not None:
            self._listener.close()

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.append(sock)
        return sock

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._spawn(self._serve, self._track(client))

    def _serve(self, client: socket.socket) -> None:
        # The client's bytes (its TLS ClientHello first) wait here; the apiserver's own
        # timeout is what ends the request.
        if self._stop.wait(self.delay):
            return
        try:
            upstream = self._track(socket.create_connection((LOOPBACK, self.upstream_port), 5))
        except OSError:
            return
        self._relay(client, upstream)

    def _relay(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        with selectors.DefaultSelector() as selector:
            for sock in peers:
                selector.register(sock, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in selector.select(timeout=0.1):
                    ready = typing.cast(socket.socket, key.fileobj)
                    try:
                        data = ready.recv(65536)
                        if not data:
                            return
                        peers[ready].sendall(data)
                    except OSError:
                        return


def closed_port() -> int:
    """A loopback port nothing listens on (a webhook that is down: connection refused)."""
    (port,) = free_ports(1)
    with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=1):
        raise ControlPlaneError(f"port {port} unexpectedly accepts connections")
    return port
