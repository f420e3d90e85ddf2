"""The benchmark's floors: gunicorn/TLS answering admissions without doing any admission work.

Both read the body (a real server must) and answer a constant ``allowed: true`` without
parsing anything, served by the same gunicorn config as the real service, so the gap is what
the webhook itself costs.

- ``app``: a Flask app (the floor the performance targets name).
- ``wsgi_app``: a bare WSGI callable, as the service is: the strict floor, and the measure
  of what a web framework would add per request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask, Response, request

ALLOWED = (
    b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",'
    b'"response":{"uid":"floor","allowed":true}}'
)


def create_floor_app() -> Flask:
    app = Flask("gpushare-floor")

    @app.post("/mutate")
    def mutate() -> Response:
        request.stream.read()
        return Response(ALLOWED, status=200, mimetype="application/json")

    @app.get("/healthz")
    def healthz() -> Response:
        return Response(b'{"status":"ok"}', status=200, mimetype="application/json")

    return app


app = create_floor_app()


def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    start_response(
        "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(ALLOWED)))]
    )
    return [ALLOWED]
