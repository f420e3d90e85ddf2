"""h11's request events made whole, and the answers the transport makes itself.

``http_protocol`` collects a request's head and body from h11's events into one
``WholeRequest`` for the application; what the application never sees (a malformed request,
an application that failed) is answered here in the same JSON shape.
"""

from __future__ import annotations

from http import HTTPStatus

import h11
import orjson

from webhook.server.wsgi_call import Answer, WholeRequest


def body_size(request: h11.Request, declared: int | None, max_body: int) -> int:
    """What the body may take: its declared length, else the cap if it is chunked."""
    if declared is not None:
        return declared
    chunked = any(name == b"transfer-encoding" for name, _ in request.headers)
    return max_body if chunked else 0


def declared_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)  # h11 has checked it is one decimal number
    return None


def whole(
    head: h11.Request | None, body: bytes, declared: int | None, within_cap: bool = True
) -> WholeRequest:
    assert head is not None
    return WholeRequest(
        method=head.method.decode("ascii"),
        target=head.target.decode("latin-1"),
        headers=list(head.headers),
        body=body,
        body_within_cap=within_cap,
        declared_length=declared,
    )


def failure_answer() -> Answer:
    return json_answer(500, "The server failed to answer the request; see its logs.")


def json_answer(status: int, message: str) -> Answer:
    """An answer the transport makes itself (the application never saw the request)."""
    body = orjson.dumps({"message": message})
    try:
        reason = HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        reason = b""
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    return Answer(status, headers, body, reason)
