"""The Flask application: HTTP routes around the admission handler, health and metrics.

Owns what is HTTP about admission: the Content-Type check (415), the capped body read (413,
see ``request_body``), timing, metrics and the one structured log line per admission.
``/healthz`` says the process answers; ``/readyz`` says it should get traffic (policies
loaded, certificate valid) and shows why not; ``/metrics`` is the Prometheus exposition of
all workers.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass

import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from webhook.policy import PolicySet
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

    def admit(endpoint: Endpoint) -> Response:
        started = time.perf_counter()
        answer = _answer(handlers[endpoint], options.max_body_bytes)
        seconds = time.perf_counter() - started
        metrics.observe_admission(endpoint, answer.reply.outcome, seconds)
        _log_admission(admission_log, endpoint, answer, seconds)
        return _reply_response(answer.reply)

    @app.post("/mutate")
    def mutate_view() -> Response:
        return admit(Endpoint.MUTATE)

    @app.post("/validate")
    def validate_view() -> Response:
        return admit(Endpoint.VALIDATE)

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


def _answer(handler: AdmissionHandler, max_body_bytes: int) -> Answer:
    # The WSGI environ directly, not werkzeug's request properties: they parse headers and
    # wrap the input stream on every request, which shows up next to the webhook's own cost.
    environ = request.environ
    content_type = environ.get("CONTENT_TYPE", "")
    media_type = content_type.partition(";")[0].strip().lower()
    if media_type != JSON_CONTENT_TYPE:
        return Answer(
            errored(
                415, f"Content-Type must be {JSON_CONTENT_TYPE}, not {content_type or 'missing'!r}."
            )
        )
    body = read_body(environ, max_body_bytes)
    if body is None:
        return Answer(_too_large(max_body_bytes))
    return handler.answer(body)


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
    level = logging.INFO if reply.http_status < 400 else logging.WARNING
    if not admission_log.enabled_for(level):
        return
    fields: dict[str, object] = {
        "endpoint": str(endpoint),
        "uid": reply.uid,
        "decision": reply.outcome,
        "status": reply.http_status,
        "duration_ms": round(seconds * 1000, 3),
    }
    if admission is not None:
        fields["namespace"] = admission.namespace
        fields["pod"] = admission.pod_name
        fields["operation"] = admission.operation
        if admission.dry_run:
            fields["dry_run"] = True
    if answer.policy:
        fields["policy"] = answer.policy
    if reply.detail:
        fields["detail"] = reply.detail
    admission_log.write(level, "admission", fields)
