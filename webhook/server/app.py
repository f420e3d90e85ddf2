"""The WSGI application: the admission routes, health, readiness and metrics.

A plain WSGI callable rather than a web framework: the service has five fixed routes and
answers nothing but JSON and the Prometheus text, and a framework's request and response
objects cost more CPU per admission than decoding, checking and answering the review
together (bench/README.md, "Why no web framework"). Routing is one dict lookup; every
answer, errors included, is a JSON body with its Content-Length.

``POST /mutate`` and ``POST /validate`` hand the request's Content-Type and a capped body
reader (``request_body``) to an instrumented review pipeline (``admission``,
``instrument``). ``/healthz`` says the process answers; ``/readyz`` says it should get
traffic (policies loaded, certificate valid) and shows why not; ``/metrics`` is the
Prometheus exposition of all workers. Another path is a 404, another method a 405, both as
AdmissionReview errors, so an apiserver pointed at the wrong path still reads the reason.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

import orjson

from webhook.core import PolicySet
from webhook.server.admission import Endpoint, ReviewPipeline, pod_handler, review_pipeline
from webhook.server.body_budget import BodyBudget
from webhook.server.instrument import instrumented
from webhook.server.metrics import EXPOSITION_CONTENT_TYPE, AdmissionMetrics
from webhook.server.policy_store import LAST_GOOD_VARIABLE, PolicyStore
from webhook.server.request_body import read_body
from webhook.server.review import (
    JSON_CONTENT_TYPE,
    AdmissionRequest,
    AdmissionResponse,
    denied,
    encode_review,
    errored,
)
from webhook.server.settings import DEFAULT_MAX_BODY_BYTES, ServeSettings
from webhook.server.tls import ServingCertificate, serving_certificate

log = logging.getLogger("gpushare.server")

Environ = dict[str, Any]
StartResponse = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    status: int
    body: bytes
    content_type: str = JSON_CONTENT_TYPE


Route = Callable[[Environ], HttpAnswer]
_STATUS_LINES = {status.value: f"{status.value} {status.phrase}" for status in HTTPStatus}


def _json(status: int, payload: object) -> HttpAnswer:
    return HttpAnswer(status, orjson.dumps(payload))


def _review_answer(response: AdmissionResponse) -> HttpAnswer:
    return HttpAnswer(response.http_status, encode_review(response))


def _error_answer(status: int, message: str) -> HttpAnswer:
    return _review_answer(errored(status, message))


class WebhookApp:
    """The WSGI callable gunicorn serves: ``routes[path][method]`` answers each request."""

    def __init__(self, routes: dict[str, dict[str, Route]]) -> None:
        self.routes = routes

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
            return _error_answer(
                404, f"No such path {path!r}: the webhook serves /mutate and /validate."
            )
        route = methods.get(method) or (methods.get("GET") if method == "HEAD" else None)
        if route is None:
            allowed = ", ".join(sorted(methods))
            return _error_answer(405, f"{method} is not allowed on {path}; use {allowed}.")
        try:
            return route(environ)
        except Exception:
            log.exception("request failed", extra={"path": path})
            return _error_answer(500, "The webhook failed to answer the request; see its logs.")


def _review_route(review: ReviewPipeline, max_body_bytes: int) -> Route:
    def route(environ: Environ) -> HttpAnswer:
        content_type = environ.get("CONTENT_TYPE", "")
        response = review(content_type, lambda: read_body(environ, max_body_bytes))
        return _review_answer(response)

    return route


_NO_CLIENT_CERTIFICATE = (
    "This webhook accepts admission requests only from clients with a certificate signed by "
    "its client CA (--client-ca). Configure the apiserver to present one: an "
    "AdmissionConfiguration whose kubeConfigFile names the client certificate "
    "(docs/reliability.md)."
)


def require_client_certificate(route: Route, refusal: Route) -> Route:
    """``route`` for TLS connections that presented a verified certificate, else ``refusal``.

    The TLS layer already refused certificates that do not chain to the client CA
    (``tls.build_server_context``); this sends connections that presented none to
    ``refusal``, which denies the review in an AdmissionReview (HTTP 200), since the
    apiserver shows a webhook's message only from one.
    """

    def guarded(environ: Environ) -> HttpAnswer:
        connection = environ.get("gunicorn.socket")
        try:
            presented = connection is not None and bool(connection.getpeercert())
        except (AttributeError, ValueError):  # not TLS, or no handshake
            presented = False
        return route(environ) if presented else refusal(environ)

    return guarded


def _refuse_uncertified(request: AdmissionRequest) -> AdmissionResponse:
    return denied(403, [_NO_CLIENT_CERTIFICATE])


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
        pipeline = review_pipeline(pod_handler(endpoint, store), max_body_bytes, budget)
        review = instrumented(pipeline, metrics, endpoint)
        route = _review_route(review, max_body_bytes)
        if client_certificates:
            refusal = review_pipeline(_refuse_uncertified, max_body_bytes, budget)
            route = require_client_certificate(route, _review_route(refusal, max_body_bytes))
        routes[f"/{endpoint}"] = {"POST": route}
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
