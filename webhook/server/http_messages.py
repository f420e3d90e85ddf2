"""Framed requests made whole, and the answers the transport makes itself, as bytes.

``http_protocol`` collects a request's head and body (``http_framing``) into one
``WholeRequest`` for the application; what the application never sees (a malformed request,
an application that failed) is answered here in the same JSON shape; every answer leaves as
one HTTP/1.1 message with its length (``serialized``).
"""

from __future__ import annotations

from http import HTTPStatus

import orjson

from webhook.server.http_framing import RequestHead
from webhook.server.wsgi_call import Answer, WholeRequest

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def body_size(head: RequestHead, max_body: int) -> int:
    """What the body may take: its declared length, else the cap if it is chunked."""
    if head.declared_length is not None:
        return head.declared_length
    return max_body if head.chunked else 0


def whole(head: RequestHead | None, body: bytes, within_cap: bool = True) -> WholeRequest:
    assert head is not None
    return WholeRequest(
        method=head.method,
        target=head.target,
        headers=head.headers,
        body=body,
        body_within_cap=within_cap,
        declared_length=head.declared_length,
        keep_alive=head.keep_alive,
    )


def serialized(answer: Answer, keep_alive: bool, head_only: bool = False) -> bytes:
    """The answer as one HTTP/1.1 message: its own Connection header dropped, ours added
    when the connection closes after it, and its length declared (the body is whole). The
    answer to a HEAD request (``head_only``) declares the length and sends no body (RFC 9110,
    section 9.3.2): a body would be read as the start of the next answer."""
    reason = answer.reason or _reason(answer.status)
    lines = [b"HTTP/1.1 %d %s" % (answer.status, reason)]
    for name, value in answer.headers:
        lowered = name.lower()
        if lowered in ("connection", "content-length", "transfer-encoding"):
            continue
        line = f"{name}: {value}"
        if "\r" in line or "\n" in line:
            raise ValueError(f"header {name!r} of the answer holds a line break")
        lines.append(line.encode("latin-1"))
    lines.append(b"Content-Length: %d" % len(answer.body))
    if not keep_alive:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + (b"" if head_only else answer.body)


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


def failure_answer() -> Answer:
    return json_answer(500, "The server failed to answer the request; see its logs.")


def json_answer(status: int, message: str) -> Answer:
    """An answer the transport makes itself (the application never saw the request)."""
    body = orjson.dumps({"message": message})
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    return Answer(status, headers, body, _reason(status))
