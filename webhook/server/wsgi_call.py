"""One whole HTTP request in, one whole answer out, through a WSGI application (PEP 3333).

The transport (``http_protocol``) hands over a request only once its head and body are all
in memory, so the application's ``wsgi.input`` is a ``BytesIO`` that can never block on a
client, and the answer is collected whole before a byte of it is sent.

Besides PEP 3333's keys the environ carries ``SSL_CLIENT_VERIFY`` (``SUCCESS`` when the
client presented a certificate that chains to the client CA, else ``NONE``), the name
mod_ssl and nginx give the same fact.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass(frozen=True, slots=True)
class Peer:
    """What the connection knows of its client, the same for each of its requests."""

    server_name: str
    server_port: str
    remote_addr: str
    remote_port: str
    url_scheme: str
    client_certificate: bool


@dataclass(frozen=True, slots=True)
class WholeRequest:
    method: str
    target: str
    headers: list[tuple[bytes, bytes]]
    body: bytes
    # False when the body was cut off at the cap (its declared or received length is over
    # it): the application sees the declared length, or an over-long chunked body, and
    # refuses it.
    body_within_cap: bool = True
    declared_length: int | None = None
    # The client keeps the connection after the answer, and another request can follow.
    keep_alive: bool = True


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    reason: bytes = b""


def environ_for(request: WholeRequest, peer: Peer) -> dict[str, Any]:
    path, _, query = request.target.partition("?")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": request.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "SERVER_NAME": peer.server_name,
        "SERVER_PORT": peer.server_port,
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": peer.remote_addr,
        "REMOTE_PORT": peer.remote_port,
        "SSL_CLIENT_VERIFY": "SUCCESS" if peer.client_certificate else "NONE",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": peer.url_scheme,
        "wsgi.input": io.BytesIO(request.body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if request.declared_length is not None:
        environ["CONTENT_LENGTH"] = str(request.declared_length)
    else:
        # A chunked body: it ends where the input ends (the request is whole, or cut off
        # one byte past the cap, which the application reads as too large).
        environ["wsgi.input_terminated"] = True
    for name, value in request.headers:
        key = name.decode("latin-1").upper().replace("-", "_")
        if key in ("CONTENT_LENGTH", "TRANSFER_ENCODING"):
            continue
        text = value.decode("latin-1")
        if key != "CONTENT_TYPE":
            key = "HTTP_" + key
        environ[key] = f"{environ[key]},{text}" if key in environ else text
    return environ


def call(app: WsgiApp, request: WholeRequest, peer: Peer) -> Answer:
    """Run ``app`` on ``request`` and collect its whole answer."""
    started: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(
        status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Callable[[bytes], None]:
        if exc_info is not None and started:
            raise exc_info[1].with_traceback(exc_info[2])
        started[:] = [(status, headers)]
        return written.append

    written: list[bytes] = []
    result = app(environ_for(request, peer), start_response)
    try:
        written.extend(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    status, headers = started[0]
    code, _, reason = status.partition(" ")
    return Answer(int(code), headers, b"".join(written), reason.encode("latin-1"))
