"""The WSGI application: the admission routes, health, readiness and metrics.

A plain WSGI callable rather than a web framework: the service has five fixed routes and
answers nothing but JSON and the Prometheus text, and a framework's request and response
objects cost more CPU per admission than decoding, checking and answering the review
together (bench/README.md, "Why no web framework"). Routing is one dict lookup; every
answer, errors included, is a JSON body with its Content-Length.

``POST /mutate`` and ``POST /validate`` are each an ``endpoint.AdmissionEndpoint``, whose
one method reads the whole request path top to bottom. ``/healthz`` says the process
answers; ``/readyz`` says it should get traffic (policies loaded, certificate valid) and
shows why not; ``/metrics`` is the Prometheus exposition of all workers. Another path is a
404, another method a 405, both as AdmissionReview errors, so an apiserver pointed at the
wrong path still reads the reason. ``metrics_app`` is the same ``/metrics`` alone, for the
plain-HTTP metrics port (``GPUSHARE_METRICS_PORT``), where nothing else may be reached.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Callable, Iterable
from http import HTTPStatus
from pathlib import Path
from typing import Any

import orjson

from webhook.core import PolicySet
from webhook.policy_store import LAST_GOOD_VARIABLE, PolicyStore
from webhook.server.admission import Endpoint, pod_handler
from webhook.server.body_budget import BodyBudget
from webhook.server.endpoint import AdmissionEndpoint, HttpAnswer
from webhook.server.metrics import EXPOSITION_CONTENT_TYPE, AdmissionMetrics
from webhook.server.review import encode_review, errored
from webhook.server.settings import DEFAULT_MAX_BODY_BYTES, ServeSettings
from webhook.server.tls import ServingCertificate, serving_certificate

log = logging.getLogger("gpushare.server")

Environ = dict[str, Any]
StartResponse = Callable[..., Any]


Route = Callable[[Environ], HttpAnswer]
_STATUS_LINES = {status.value: f"{status.value} {status.phrase}" for status in HTTPStatus}


def _json(status: int, payload: object) -> HttpAnswer:
    return HttpAnswer(status, orjson.dumps(payload))


def _error_answer(status: int, message: str) -> HttpAnswer:
    response = errored(status, message)
    return HttpAnswer(response.http_status, encode_review(response))


class WebhookApp:
    """The WSGI callable gunicorn serves: ``routes[path][method]`` answers each request."""

    def __init__(
        self, routes: dict[str, dict[str, Route]], serves: str = "/mutate and /validate"
    ) -> None:
        self.routes = routes
        self.serves = serves

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        answer = self.answer(environ)
        start_response(
            _STATUS_LINES.get(answer.status) or str(answer.status),
            [("Content-Type", answer.content_type), ("Content-Length", str(len(answer.body)))],
        )
        return [answer.body]

    def answer(self, environ: Environ) -> HttpAnswer:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
        methods = self.routes.get(path)
        if methods is None:
            return _error_answer(404, f"No such path {path!r}: the webhook serves {self.serves}.")
        route = methods.get(method) or (methods.get("GET") if method == "HEAD" else None)
        if route is None:
            allowed = ", ".join(sorted(methods))
            return _error_answer(405, f"{method} is not allowed on {path}; use {allowed}.")
        try:
            return route(environ)
        except Exception:
            log.exception("request failed", extra={"path": path})
            return _error_answer(500, "The webhook failed to answer the request; see its logs.")


def create_app(
    store: PolicyStore,
    *,
    certificate: ServingCertificate | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    metrics: AdmissionMetrics | None = None,
    client_certificates: bool = False,
) -> WebhookApp:
    """The webhook's WSGI app, deciding with the policies ``store`` holds.

    ``certificate`` is the pair the TLS listener serves; readiness requires it to be valid.
    Without one (tests through a WSGI test client) readiness looks at policies only.
    With ``client_certificates`` the admission paths answer only clients that presented a
    certificate from the client CA; the status paths stay open to the kubelet's probes.
    """
    metrics = metrics or AdmissionMetrics()
    policies = store.policies
    metrics.set_policies_loaded(0 if policies is None else len(policies.policies))
    # A first load that failed (serving a sibling's last good version, or nothing) counts.
    metrics.set_policy_reload_successful(store.status().last_failure is None)
    routes: dict[str, dict[str, Route]] = {}
    budget = BodyBudget(max_body_bytes)  # one per worker process, shared by its endpoints
    for endpoint in Endpoint:
        admission = AdmissionEndpoint(
            endpoint,
            pod_handler(endpoint, store),
            metrics=metrics,
            budget=budget,
            max_body_bytes=max_body_bytes,
            client_certificates=client_certificates,
        )
        routes[f"/{endpoint}"] = {"POST": admission}
    routes.update(_status_routes(store, certificate, metrics))
    return WebhookApp(routes)


def _status_routes(
    store: PolicyStore, certificate: ServingCertificate | None, metrics: AdmissionMetrics
) -> dict[str, dict[str, Route]]:
    """``/healthz``, ``/readyz`` and ``/metrics``."""

    def healthz(environ: Environ) -> HttpAnswer:
        return _json(200, {"status": "ok"})

    def readyz(environ: Environ) -> HttpAnswer:
        now = dt.datetime.now(dt.UTC)
        policy_status = store.status()
        details: dict[str, object] = {"policies": policy_status.as_dict()}
        ready = policy_status.loaded
        if certificate is not None:
            cert_status = certificate.status()
            details["certificate"] = cert_status.as_dict(now)
            ready = ready and cert_status.valid_at(now)
        details["ready"] = ready
        return _json(200 if ready else 503, details)

    def metrics_view(environ: Environ) -> HttpAnswer:
        if certificate is not None:
            cert_status = certificate.status()
            if cert_status.not_after is not None:
                metrics.set_certificate_expiry(cert_status.not_after.timestamp())
        return HttpAnswer(200, metrics.exposition(), EXPOSITION_CONTENT_TYPE)

    return {
        "/healthz": {"GET": healthz},
        "/readyz": {"GET": readyz},
        "/metrics": {"GET": metrics_view},
    }


def metrics_app(app: WebhookApp) -> WebhookApp:
    """``app``'s ``/metrics`` alone: what the plain-HTTP metrics port answers (the admission
    and status paths stay on the TLS port)."""
    return WebhookApp({"/metrics": app.routes["/metrics"]}, serves="/metrics only on this port")


def create_app_from_settings(settings: ServeSettings) -> WebhookApp:
    """The app a worker serves, with its policy poller running."""
    metrics = AdmissionMetrics()

    def count_reload(ok: bool, policies: PolicySet | None) -> None:
        metrics.observe_policy_reload(ok, len(policies.policies) if policies else None)

    last_good = os.environ.get(LAST_GOOD_VARIABLE)
    store = PolicyStore.loaded(
        settings.policies, on_reload=count_reload, last_good=Path(last_good) if last_good else None
    )
    store.start_polling(settings.policy_poll_seconds)
    return create_app(
        store,
        certificate=serving_certificate(settings.tls_cert, settings.tls_key, settings.client_ca),
        max_body_bytes=settings.max_body_bytes,
        metrics=metrics,
        client_certificates=settings.client_ca is not None,
    )
