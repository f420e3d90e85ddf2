"""A tiny TLS admission webhook inside the test process, answering as a test tells it.

The reinvocation tests register it as a second mutator next to gpushare; it records every
AdmissionReview request it gets, so a test can see what the apiserver sent and in which order.
"""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from harness.processes import LOOPBACK

Responder = Callable[[dict[str, Any]], dict[str, Any]]


class _AdmissionHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # an idle keep-alive connection ends its thread
    server: _TlsHttpServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        review = json.loads(self.rfile.read(length))
        request = review["request"]
        owner = self.server.owner
        owner.record(request)
        response = {"uid": request["uid"], **owner.respond(request)}
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep pytest's output clean; requests are recorded instead


class _TlsHttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, owner: AdmissionServer, context: ssl.SSLContext) -> None:
        self.owner = owner
        self.context = context
        super().__init__((LOOPBACK, 0), _AdmissionHandler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The handshake runs in the connection's own thread, not in the accept loop.
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)  # type: ignore[arg-type]
        except (ssl.SSLError, OSError):
            pass
        finally:
            tls.close()


@dataclass
class AdmissionServer:
    """An AdmissionReview v1 server over TLS in this process, answering with `respond`.

    `respond(request)` returns the response fields besides `uid` (allowed, patch, ...);
    every request it got is kept in `requests`, in order.
    """

    cert_dir: Path
    respond: Responder
    requests: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _server: _TlsHttpServer | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def record(self, request: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(request)

    def seen(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.requests)

    @property
    def ca_file(self) -> Path:
        return self.cert_dir / "ca.crt"

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    def __enter__(self) -> AdmissionServer:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.cert_dir / "tls.crt"), str(self.cert_dir / "tls.key"))
        context.set_alpn_protocols(["http/1.1"])
        self._server = _TlsHttpServer(self, context)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
