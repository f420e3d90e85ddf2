"""The benchmark's floors: the webhook's own gunicorn/TLS stack doing no admission work.

Both read the body (a real server must) and answer a constant ``allowed: true`` without
parsing anything, served by the same gunicorn config as the real service, so the gap is what
the webhook itself costs.

- ``app``: the admission POST goes through Flask routing (the floor issue 3 names).
- ``bypass_app``: the same Flask app with a WSGI layer in front answering the admission
  POST, as the real service does (``webhook.server.app.AdmissionEndpoints``): the floor
  for the stack the service really runs.
"""

from __future__ import annotations

from collections.abc import Iterable
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


def _bypass(fallback: Any) -> Any:
    def wsgi(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") == "POST" and environ.get("PATH_INFO") == "/mutate":
            environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            start_response(
                "200 OK",
                [("Content-Type", "application/json"), ("Content-Length", str(len(ALLOWED)))],
            )
            return [ALLOWED]
        return fallback(environ, start_response)  # type: ignore[no-any-return]

    return wsgi


app = create_floor_app()
bypass_app = create_floor_app()
bypass_app.wsgi_app = _bypass(bypass_app.wsgi_app)  # type: ignore[method-assign]
