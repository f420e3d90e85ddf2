"""The benchmark's floor: the webhook's own Flask/gunicorn/TLS stack doing no admission work.

It reads the body (a real server must) and answers a constant ``allowed: true`` without
parsing anything, served by the same gunicorn config as the real service, so the gap is what
the webhook itself costs.
"""

from __future__ import annotations

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
