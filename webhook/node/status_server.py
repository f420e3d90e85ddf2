"""The node side's small HTTP server: /healthz, /readyz and /metrics, for the MPS launcher
and the node agent (each with its own metrics, ``MetricsPage``).

/healthz answers 200 while the supervision loop keeps ticking (a liveness probe: a stuck
loop should get the container restarted); it deliberately does not fail when the MPS daemon
is down, because the supervisor restarts the daemon itself with backoff and a kubelet restart
on top would only reset that backoff. /readyz answers 200 only while the node advertises MPS
(daemon up, defaults applied, no server in FAULT). /metrics is Prometheus text from a
registry of its own, so tests can run several launchers in one process.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class MetricsPage(Protocol):
    """What /metrics serves: Prometheus text of one registry."""

    def render(self) -> bytes: ...


class LauncherMetrics:
    """The launcher's Prometheus metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.daemon_up = Gauge(
            "gpushare_mps_daemon_up",
            "1 while the MPS control daemon runs and answers on its pipe.",
            registry=self.registry,
        )
        self.restarts = Counter(
            "gpushare_mps_daemon_restarts",
            "Times the MPS control daemon was restarted after dying or hanging.",
            registry=self.registry,
        )
        self.clients = Gauge(
            "gpushare_mps_clients",
            "MPS client processes connected to the node's MPS servers.",
            registry=self.registry,
        )
        self.servers = Gauge(
            "gpushare_mps_servers", "MPS server processes running.", registry=self.registry
        )
        self.faulted_servers = Gauge(
            "gpushare_mps_servers_faulted",
            "MPS servers in FAULT state (refusing new clients until theirs exit).",
            registry=self.registry,
        )
        self.gpus = Gauge(
            "gpushare_mps_gpus", "GPUs the MPS daemon serves.", registry=self.registry
        )
        self.node_ready = Gauge(
            "gpushare_mps_node_ready",
            "1 while this node carries the MPS ready label.",
            registry=self.registry,
        )
        self.exclusive_process = Gauge(
            "gpushare_mps_exclusive_process",
            "1 when the GPUs were put in EXCLUSIVE_PROCESS compute mode, 0 when degraded.",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass(frozen=True)
class Health:
    """What the probes report: liveness of the loop and readiness of the node."""

    alive: bool
    ready: bool
    detail: dict[str, object]


class StatusServer:
    """A ThreadingHTTPServer on ``host:port`` serving the probes and the metrics."""

    def __init__(
        self, host: str, port: int, metrics: MetricsPage, health: Callable[[], Health]
    ) -> None:
        handler = _handler(metrics, health)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="gpushare-status", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _handler(metrics: MetricsPage, health: Callable[[], Health]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpushare-node"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, metrics.render(), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                state = health()
                ok = state.alive if path == "/healthz" else state.ready
                body = json.dumps({"ok": ok, **state.detail}, default=str).encode()
                self._reply(200 if ok else 503, body, "application/json")
            else:
                self._reply(404, b'{"error": "not found"}', "application/json")

        def _reply(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            # Probes every few seconds would drown the event log.
            del format, args

    return Handler


def loop_alive(last_tick: float, interval_s: float, now: float | None = None) -> bool:
    """Whether the supervision loop ticked recently enough (three intervals, at least 30s)."""
    current = time.monotonic() if now is None else now
    return current - last_tick <= max(3 * interval_s, 30.0)
