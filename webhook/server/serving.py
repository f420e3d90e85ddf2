"""What the connections of one worker share: the application, the limits they are read
under, the registry that bounds them (``connections``), the thread pool for large requests
and where each new connection gets its TLS context."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from webhook.server.connections import Connections, Evictable
from webhook.server.wsgi_call import WsgiApp


@dataclass(frozen=True)
class Limits:
    read_timeout: float
    keepalive: float
    max_body_bytes: int
    loop_answer_max_bytes: int


@dataclass
class Service:
    """What a worker's connections share."""

    app: WsgiApp
    limits: Limits
    connections: Connections
    executor: Executor
    # A context per new connection: the serving certificate as it is on disk now.
    tls_context: Callable[[], ssl.SSLContext] | None
    stopping: bool = False
    # Every open connection, for a stopping worker to close.
    live: set[Evictable] = field(default_factory=set)
