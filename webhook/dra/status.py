"""The reconciler's probes and metrics: /healthz, /readyz and /metrics on a small port.

``ReconcilerStatus`` is what ``run`` reports to: every pass and what it did (Prometheus
counters in a registry of its own, so tests can run several reconcilers in one process), and
when the loop last made progress. ``StatusServer`` serves it over plain HTTP
(``gpushare dra-templates --apply --watch --listen 0.0.0.0:9402``; the Deployments point their
probes and the PodMonitor at it):

- ``/healthz`` (liveness) answers 200 while the loop makes progress: it ticks before every
  wait and watch, at every namespace event and after every template written, so a gap longer
  than ``stale_after_s`` means a hung loop, which a restart mends. Every API call has its own
  timeout and the longest wait is the backoff's, so a working loop never comes near it.
- ``/readyz`` (readiness) answers 200 once a valid policy set is loaded and the last full
  pass over the namespaces had no error: a pod whose RBAC misses a namespace, or whose
  apiserver refuses it, shows as not ready (and `helm install --wait` says so) instead of
  quietly retrying.

Both answer counts only (no namespace or template names: the reasons are in the log).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

DEFAULT_LISTEN_PORT = 9402
# Longer than the longest wait of a working loop: the backoff (300 s), or one list of 40
# pages at 15 s per call.
DEFAULT_STALE_AFTER_S = 900.0
FULL, NAMESPACE = "full", "namespace"


class PassOutcome(Protocol):
    """What a pass reports (``reconciler.PassResult``)."""

    @property
    def created(self) -> list[str]: ...

    @property
    def applied(self) -> list[str]: ...

    @property
    def deleted(self) -> list[str]: ...

    @property
    def errors(self) -> list[str]: ...


class ReconcilerStatus:
    """The reconciler's metrics, and the state its probes answer from."""

    def __init__(
        self,
        *,
        stale_after_s: float = DEFAULT_STALE_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._passes = Counter(
            "gpushare_dra_reconciles",
            "Passes of the DRA template reconciler: over every namespace it keeps (scope "
            "full) or one new namespace (scope namespace), by outcome (ok, error).",
            ["scope", "outcome"],
            registry=self.registry,
        )
        self._errors = Counter(
            "gpushare_dra_reconcile_errors",
            "Failed namespaces or API calls in the reconciler's passes (each also logged).",
            registry=self.registry,
        )
        self._created = Counter(
            "gpushare_dra_templates_created",
            "ResourceClaimTemplates the reconciler created.",
            registry=self.registry,
        )
        self._updated = Counter(
            "gpushare_dra_templates_updated",
            "ResourceClaimTemplates the reconciler applied again because they had drifted "
            "or the policies changed.",
            registry=self.registry,
        )
        self._deleted = Counter(
            "gpushare_dra_templates_deleted",
            "ResourceClaimTemplates the reconciler deleted (no policy wants them any more).",
            registry=self.registry,
        )
        self._loaded = Gauge(
            "gpushare_dra_policies_loaded",
            "1 while the reconciler holds a valid policy set, 0 before the first one loads.",
            registry=self.registry,
        )
        self._last_full_pass = Gauge(
            "gpushare_dra_last_full_pass_success_timestamp_seconds",
            "Unix time of the last full pass without an error (0: none yet).",
            registry=self.registry,
        )
        for scope in (FULL, NAMESPACE):
            for outcome in ("ok", "error"):
                self._passes.labels(scope, outcome)
        self._stale_after_s = stale_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last_tick = clock()
        self._policies_loaded = False
        self._full_passes = 0
        self._last_full_pass_errors: int | None = None

    def tick(self) -> None:
        """The loop made progress."""
        with self._lock:
            self._last_tick = self._clock()

    def policies(self, loaded: bool) -> None:
        with self._lock:
            self._policies_loaded = loaded
        self._loaded.set(1 if loaded else 0)

    def record(self, scope: str, result: PassOutcome) -> None:
        """One pass (``FULL`` or ``NAMESPACE``) and what it did."""
        self._passes.labels(scope, "error" if result.errors else "ok").inc()
        self._errors.inc(len(result.errors))
        self._created.inc(len(result.created))
        self._updated.inc(len(result.applied) - len(result.created))
        self._deleted.inc(len(result.deleted))
        if scope == FULL:
            with self._lock:
                self._full_passes += 1
                self._last_full_pass_errors = len(result.errors)
            if not result.errors:
                self._last_full_pass.set_to_current_time()
        self.tick()

    def alive(self) -> tuple[bool, dict[str, object]]:
        with self._lock:
            idle = self._clock() - self._last_tick
        return idle <= self._stale_after_s, {"seconds_since_progress": round(idle, 1)}

    def ready(self) -> tuple[bool, dict[str, object]]:
        with self._lock:
            errors = self._last_full_pass_errors
            detail: dict[str, object] = {
                "policies_loaded": self._policies_loaded,
                "full_passes": self._full_passes,
                "last_full_pass_errors": errors,
            }
            return self._policies_loaded and errors == 0, detail

    def render(self) -> bytes:
        return generate_latest(self.registry)


class StatusServer:
    """A ThreadingHTTPServer on ``host:port`` serving the probes and the metrics."""

    def __init__(self, host: str, port: int, status: ReconcilerStatus) -> None:
        self._server = ThreadingHTTPServer((host, port), _handler(status))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="gpushare-dra-status", daemon=True
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


def _handler(status: ReconcilerStatus) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpushare-dra-templates"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, status.render(), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                ok, detail = status.alive() if path == "/healthz" else status.ready()
                body = json.dumps({"ok": ok, **detail}).encode()
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
            # Probes every few seconds would drown the log.
            del format, args

    return Handler


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::]:9402``, ``:9402`` for every address); ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 0.0.0.0:{DEFAULT_LISTEN_PORT})")
    return host.strip("[]") or "0.0.0.0", int(port)
