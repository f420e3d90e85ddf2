"""The Flask application: HTTP routes around the admission handler, health and metrics.

Owns what is HTTP about admission: the Content-Type check (415), the capped body read (413,
see ``request_body``), timing, metrics and the one structured log line per admission.
``/healthz`` says the process answers; ``/readyz`` says it should get traffic (policies
loaded, certificate valid) and shows why not; ``/metrics`` is the Prometheus exposition of
all workers.

``POST /mutate`` and ``POST /validate`` are answered by ``AdmissionEndpoints``, a WSGI layer
in front of Flask (``app.wsgi_app``) that works on the environ and answers with bytes: Flask's
request context, routing, signals and ``Response`` object cost about 90 us per request on a
2-core machine (``bench/transport_micro.py``), twice what decoding, checking, answering,
counting and logging the review cost together. Every other request, including other
methods on the admission paths (405), goes to Flask.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES

from webhook.core import PolicySet
from webhook.server.admission import AdmissionHandler, Answer, Endpoint
from webhook.server.json_logs import AdmissionLog
from webhook.server.metrics import EXPOSITION_CONTENT_TYPE, AdmissionMetrics
from webhook.server.policy_store import PolicyStore
from webhook.server.request_body import read_body
from webhook.server.review import JSON_CONTENT_TYPE, Reply, errored
from webhook.server.settings import DEFAULT_MAX_BODY_BYTES, ServeSettings
from webhook.server.tls import ServingCertificate, serving_certificate


@dataclass(frozen=True)
class AdmissionOptions:
    excluded_namespaces: frozenset[str] = frozenset({"kube-system"})
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


def _json_response(status: int, payload: object) -> Response:
    return Response(orjson.dumps(payload), status=status, mimetype=JSON_CONTENT_TYPE)


def _reply_response(reply: Reply) -> Response:
    return Response(reply.body, status=reply.http_status, mimetype=JSON_CONTENT_TYPE)


log = logging.getLogger("gpushare.admission")

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
# Status lines as werkzeug writes them ("413 REQUEST ENTITY TOO LARGE"), so answers look the
# same whichever layer gives them.
_STATUS_LINES = {code: f"{code} {reason.upper()}" for code, reason in HTTP_STATUS_CODES.items()}
_INTERNAL_ERROR = "The webhook failed to answer the request; see its logs."


class AdmissionEndpoints:
    """The admission paths as a WSGI app: environ in, AdmissionReview bytes out.

    Installed as ``app.wsgi_app`` in front of Flask, which gets every request that is not a
    POST to ``/mutate`` or ``/validate``. The Flask views of those paths call ``admit`` too,
    so the answer does not depend on which layer serves it.
    """

    def __init__(
        self,
        handlers: dict[Endpoint, AdmissionHandler],
        options: AdmissionOptions,
        metrics: AdmissionMetrics,
        admission_log: AdmissionLog,
        fallback: WsgiApp,
    ) -> None:
        self._handlers = handlers
        self._max_body_bytes = options.max_body_bytes
        self._too_large = _too_large(options.max_body_bytes)
        self._metrics = metrics
        self._log = admission_log
        self._fallback = fallback
        self._routes = {f"/{endpoint}": endpoint for endpoint in handlers}

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") == "POST":
            endpoint = self._routes.get(environ.get("PATH_INFO", ""))
            if endpoint is not None:
                reply = self.admit(endpoint, environ)
                body = reply.body
                status = reply.http_status
                start_response(
                    _STATUS_LINES.get(status) or f"{status} UNKNOWN",
                    [("Content-Type", JSON_CONTENT_TYPE), ("Content-Length", str(len(body)))],
                )
                return [body]
        return self._fallback(environ, start_response)

    def admit(self, endpoint: Endpoint, environ: dict[str, Any]) -> Reply:
        """Answer one admission request, count it and log it."""
        started = perf_counter()
        try:
            answer = self._answer(endpoint, environ)
        except Exception:
            # The handler answers the core's failures itself; this is the rest (a client
            # gone while its body was read, a bug here): still an AdmissionReview.
            log.exception("admission failed", extra={"endpoint": str(endpoint)})
            answer = Answer(errored(500, _INTERNAL_ERROR))
        seconds = perf_counter() - started
        reply = answer.reply
        self._metrics.observe_admission(endpoint, reply.outcome, seconds)
        _log_admission(self._log, endpoint, answer, seconds)
        return reply

    def _answer(self, endpoint: Endpoint, environ: dict[str, Any]) -> Answer:
        content_type = environ.get("CONTENT_TYPE", "")
        if content_type != JSON_CONTENT_TYPE and not _is_json(content_type):
            return Answer(
                errored(
                    415,
                    f"Content-Type must be {JSON_CONTENT_TYPE}, not {content_type or 'missing'!r}.",
                )
            )
        body = read_body(environ, self._max_body_bytes)
        if body is None:
            return Answer(self._too_large)
        return self._handlers[endpoint].answer(body)


def _is_json(content_type: str) -> bool:
    return content_type.partition(";")[0].strip().lower() == JSON_CONTENT_TYPE


def create_app(
    store: PolicyStore,
    *,
    certificate: ServingCertificate | None = None,
    options: AdmissionOptions | None = None,
    metrics: AdmissionMetrics | None = None,
    admission_log: AdmissionLog | None = None,
) -> Flask:
    """The webhook's WSGI app, deciding with the policies ``store`` holds.

    ``certificate`` is the pair the TLS listener serves; readiness requires it to be valid.
    Without one (tests through the Flask client) readiness looks at policies only.
    """
    options = options or AdmissionOptions()
    metrics = metrics or AdmissionMetrics()
    admission_log = admission_log or AdmissionLog()
    app = Flask("gpushare")
    app.config["GPUSHARE_METRICS"] = metrics
    app.config["GPUSHARE_POLICY_STORE"] = store
    handlers = {
        endpoint: AdmissionHandler(endpoint, store, options.excluded_namespaces)
        for endpoint in Endpoint
    }
    policies = store.policies
    if policies is not None:
        metrics.set_policies_loaded(len(policies.policies))

    endpoints = AdmissionEndpoints(handlers, options, metrics, admission_log, app.wsgi_app)
    app.wsgi_app = endpoints  # type: ignore[method-assign]

    # Declared for Flask's URL map (a GET answers 405, not 404); POSTs are answered by
    # ``endpoints`` before Flask sees them.
    @app.post("/mutate")
    def mutate_view() -> Response:
        return _reply_response(endpoints.admit(Endpoint.MUTATE, request.environ))

    @app.post("/validate")
    def validate_view() -> Response:
        return _reply_response(endpoints.admit(Endpoint.VALIDATE, request.environ))

    @app.get("/healthz")
    def healthz() -> Response:
        return _json_response(200, {"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        now = dt.datetime.now(dt.UTC)
        policy_status = store.status()
        details: dict[str, object] = {"policies": policy_status.as_dict()}
        ready = policy_status.loaded
        if certificate is not None:
            cert_status = certificate.status()
            details["certificate"] = cert_status.as_dict(now)
            ready = ready and cert_status.valid_at(now)
        details["ready"] = ready
        return _json_response(200 if ready else 503, details)

    @app.get("/metrics")
    def metrics_view() -> Response:
        if certificate is not None:
            cert_status = certificate.status()
            if cert_status.not_after is not None:
                metrics.set_certificate_expiry(cert_status.not_after.timestamp())
        return Response(metrics.exposition(), status=200, content_type=EXPOSITION_CONTENT_TYPE)

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> Response:
        # Wrong method or path: still a JSON answer, never Flask's HTML page.
        status = error.code or 500
        return _reply_response(errored(status, error.description or error.name))

    return app


def create_app_from_settings(settings: ServeSettings) -> Flask:
    """The app a worker serves, with its policy poller running."""
    metrics = AdmissionMetrics()

    def count_reload(ok: bool, policies: PolicySet | None) -> None:
        metrics.observe_policy_reload(ok, len(policies.policies) if policies else None)

    store = PolicyStore.loaded(settings.policies, on_reload=count_reload)
    store.start_polling(settings.policy_poll_seconds)
    return create_app(
        store,
        certificate=serving_certificate(settings.tls_cert, settings.tls_key),
        options=AdmissionOptions(
            excluded_namespaces=frozenset(settings.exclude_namespaces),
            max_body_bytes=settings.max_body_bytes,
        ),
        metrics=metrics,
    )


def _too_large(max_body_bytes: int) -> Reply:
    return errored(
        413,
        f"The request body is larger than {max_body_bytes} bytes; the apiserver never sends "
        "more than 3 MiB.",
    )


def _log_admission(
    admission_log: AdmissionLog, endpoint: Endpoint, answer: Answer, seconds: float
) -> None:
    reply, admission = answer.reply, answer.request
    entry = admission_log.entry(
        logging.INFO if reply.http_status < 400 else logging.WARNING, "admission"
    )
    if entry is None:
        return
    entry["endpoint"] = endpoint
    entry["uid"] = reply.uid
    entry["decision"] = reply.outcome
    entry["status"] = reply.http_status
    entry["duration_ms"] = round(seconds * 1e6) / 1e3
    if admission is not None:
        entry["namespace"] = admission.namespace
        entry["pod"] = admission.pod_name
        entry["operation"] = admission.operation
        if admission.dry_run:
            entry["dry_run"] = True
    if answer.policy:
        entry["policy"] = answer.policy
    if reply.detail:
        entry["detail"] = reply.detail
    admission_log.emit(entry)
