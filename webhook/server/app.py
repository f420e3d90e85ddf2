"""The Flask application: the admission routes, health, readiness and metrics.

``POST /mutate`` and ``POST /validate`` hand the body (capped by Flask's
``MAX_CONTENT_LENGTH``: 413 before reading a declared length over it, and a chunked body is
cut off at it) to an instrumented review pipeline (``admission``, ``instrument``).
``/healthz`` says the process answers; ``/readyz`` says it should get traffic (policies
loaded, certificate valid) and shows why not; ``/metrics`` is the Prometheus exposition of
all workers. Any other path or method still gets a JSON AdmissionReview error, never an
HTML page.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from webhook.core import PolicySet
from webhook.server.admission import Endpoint, ReviewPipeline, pod_handler, review_pipeline
from webhook.server.instrument import instrumented
from webhook.server.metrics import EXPOSITION_CONTENT_TYPE, AdmissionMetrics
from webhook.server.policy_store import PolicyStore
from webhook.server.review import JSON_CONTENT_TYPE, AdmissionResponse, encode_review, errored
from webhook.server.settings import DEFAULT_MAX_BODY_BYTES, ServeSettings
from webhook.server.tls import ServingCertificate, serving_certificate


def _json_response(status: int, payload: object) -> Response:
    return Response(orjson.dumps(payload), status=status, mimetype=JSON_CONTENT_TYPE)


def _review_response(response: AdmissionResponse) -> Response:
    return Response(
        encode_review(response), status=response.http_status, mimetype=JSON_CONTENT_TYPE
    )


def read_body() -> bytes | None:
    """The current request's body, or None when it is over ``MAX_CONTENT_LENGTH``.

    Werkzeug refuses a declared length over the cap before reading; a chunked body is read
    up to the cap and no further, and one that reaches it is taken as too large.
    """
    try:
        body = request.get_data(cache=False)
    except RequestEntityTooLarge:
        return None
    limit = request.max_content_length
    if request.content_length is None and limit is not None and len(body) >= limit:
        return None
    return body


def _review_view(review: ReviewPipeline) -> Callable[[], Response]:
    def view() -> Response:
        return _review_response(review(request.content_type or "", read_body))

    return view


def create_app(
    store: PolicyStore,
    *,
    certificate: ServingCertificate | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    metrics: AdmissionMetrics | None = None,
) -> Flask:
    """The webhook's WSGI app, deciding with the policies ``store`` holds.

    ``certificate`` is the pair the TLS listener serves; readiness requires it to be valid.
    Without one (tests through the Flask client) readiness looks at policies only.
    """
    metrics = metrics or AdmissionMetrics()
    app = Flask("gpushare")
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    app.config["GPUSHARE_METRICS"] = metrics
    app.config["GPUSHARE_POLICY_STORE"] = store
    policies = store.policies
    if policies is not None:
        metrics.set_policies_loaded(len(policies.policies))

    for endpoint in Endpoint:
        review = review_pipeline(pod_handler(endpoint, store), max_body_bytes)
        app.add_url_rule(
            f"/{endpoint}",
            endpoint=str(endpoint),
            view_func=_review_view(instrumented(review, metrics, endpoint)),
            methods=["POST"],
        )

    _add_status_routes(app, store, certificate, metrics)

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> Response:
        # Wrong method or path, or a failure outside the pipeline: still an AdmissionReview.
        status = error.code or 500
        return _review_response(errored(status, error.description or error.name).complete(None))

    return app


def _add_status_routes(
    app: Flask,
    store: PolicyStore,
    certificate: ServingCertificate | None,
    metrics: AdmissionMetrics,
) -> None:
    """``/healthz``, ``/readyz`` and ``/metrics``."""

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
        max_body_bytes=settings.max_body_bytes,
        metrics=metrics,
    )
