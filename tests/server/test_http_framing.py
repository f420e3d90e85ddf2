"""Requests framed by llhttp (webhook/server/http_framing.py): what the framer takes from the
connection's buffer, what it leaves there, and what it refuses.

Through a running server (TLS, slow and hostile clients, pipelining) the same framing is held
by test_hostile_clients.py, test_slow_clients.py and test_live_server.py.
"""

from __future__ import annotations

import pytest

from webhook.server.http_framing import (
    MAX_HEAD_BYTES,
    Event,
    MalformedRequestError,
    RequestFramer,
    RequestHead,
    Signal,
)
from webhook.server.http_messages import serialized
from webhook.server.wsgi_call import Answer

BODY = b'{"kind":"AdmissionReview"}'
REQUEST = (
    b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: webhook\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
)


def events(framer: RequestFramer, inbox: bytearray, eof: bool = False) -> list[Event]:
    """Every event until the framer needs more or has ended the request."""
    found = []
    while True:
        event = framer.next_event(inbox, eof)
        found.append(event)
        if event in (Signal.NEED_DATA, Signal.PAUSED):
            return found


def head_of(found: list[Event]) -> RequestHead:
    (head,) = [e for e in found if isinstance(e, RequestHead)]
    return head


def test_a_request_in_one_piece_and_the_next_left_in_the_buffer() -> None:
    framer = RequestFramer()
    inbox = bytearray(REQUEST + REQUEST)

    found = events(framer, inbox)

    head = head_of(found)
    assert (head.method, head.target, head.declared_length) == ("POST", "/mutate?timeout=10s", 26)
    assert (b"content-type", b"application/json") in head.headers
    assert head.keep_alive and not head.chunked and not head.expects_continue
    assert b"".join(e for e in found if isinstance(e, bytes)) == BODY
    assert found[-2:] == [Signal.END, Signal.PAUSED]
    assert inbox == REQUEST  # the pipelined request waits for the answer
    framer.start_next_cycle()
    assert b"".join(e for e in events(framer, inbox) if isinstance(e, bytes)) == BODY
    assert inbox == b""


def test_a_request_a_byte_at_a_time_is_framed_the_same() -> None:
    """Each byte fed alone, the head's blank line split across them."""
    framer = RequestFramer()
    inbox = bytearray()
    found: list[Event] = []
    for byte in REQUEST:
        inbox.append(byte)
        found += [e for e in events(framer, inbox) if e is not Signal.NEED_DATA]
    assert head_of(found).declared_length == len(BODY)
    assert b"".join(e for e in found if isinstance(e, bytes)) == BODY
    assert found[-2:] == [Signal.END, Signal.PAUSED]


def test_a_head_at_the_bound_is_taken_and_one_past_it_refused_with_431() -> None:
    start = b"POST /mutate HTTP/1.1\r\nContent-Length: 0\r\nX-Pad: "
    padding = MAX_HEAD_BYTES - len(start) - len(b"\r\n\r\n")
    at_bound = start + b"p" * padding + b"\r\n\r\n"
    assert head_of(events(RequestFramer(), bytearray(at_bound))).declared_length == 0

    framer = RequestFramer()
    with pytest.raises(MalformedRequestError) as refused:
        events(framer, bytearray(start + b"p" * (padding + 1) + b"\r\n\r\n"))
    assert refused.value.status == 431
    assert not framer.reusable


def test_an_endless_head_is_refused_before_it_is_all_parsed() -> None:
    framer = RequestFramer()
    inbox = bytearray(b"POST /mutate HTTP/1.1\r\nX-Endless: ")
    events(framer, inbox)
    with pytest.raises(MalformedRequestError) as refused:
        for _ in range(MAX_HEAD_BYTES // 1024 + 2):
            inbox += b"e" * 1024
            events(framer, inbox)
    assert refused.value.status == 431


def test_a_chunked_body_is_joined_and_ends_the_connection() -> None:
    framer = RequestFramer()
    chunked = (
        b"POST /mutate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    found = events(framer, bytearray(chunked + REQUEST))
    head = head_of(found)
    assert head.chunked and head.declared_length is None and not head.keep_alive
    assert b"".join(e for e in found if isinstance(e, bytes)) == b"hello world"
    assert found[-2:] == [Signal.END, Signal.PAUSED]
    assert not framer.reusable


@pytest.mark.parametrize(
    ("request_bytes", "keep_alive", "expects_continue"),
    [
        (REQUEST, True, False),
        (REQUEST.replace(b"HTTP/1.1", b"HTTP/1.0"), False, False),
        (REQUEST.replace(b"Host: webhook\r\n", b"Connection: close\r\n"), False, False),
        (REQUEST.replace(b"Host: webhook\r\n", b"Expect: 100-continue\r\n"), True, True),
    ],
    ids=["http-1.1", "http-1.0", "connection-close", "expect-100-continue"],
)
def test_what_the_client_asks_of_the_connection(
    request_bytes: bytes, keep_alive: bool, expects_continue: bool
) -> None:
    head = head_of(events(RequestFramer(), bytearray(request_bytes)))
    assert (head.keep_alive, head.expects_continue) == (keep_alive, expects_continue)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /mutate HTTP/1.1\nHost: webhook\nContent-Length: 0\n\n",
        b"\x16\x03 this is not HTTP\r\n\r\n",
        b"POST /mutate HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        b"POST /mutate HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nab",
        b"POST /mutate HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST /mutate HTTP/1.1\r\nBad Header: x\r\nContent-Length: 0\r\n\r\n",
        b"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
        b"POST /mutate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=[
        "bare-lf",
        "garbage",
        "negative-length",
        "two-lengths",
        "length-and-chunked",
        "space-in-name",
        "upgrade",
        "bad-chunk",
    ],
)
def test_malformed_requests_are_refused_with_400(request_bytes: bytes) -> None:
    framer = RequestFramer()
    with pytest.raises(MalformedRequestError) as refused:
        events(framer, bytearray(request_bytes))
    assert refused.value.status == 400
    assert str(refused.value)
    assert not framer.reusable


def test_a_client_gone_inside_a_request_is_told_and_one_gone_between_is_not() -> None:
    with pytest.raises(MalformedRequestError) as refused:
        events(RequestFramer(), bytearray(REQUEST[:-3]), eof=True)
    assert refused.value.status == 400
    assert events(RequestFramer(), bytearray(), eof=True) == [Signal.NEED_DATA]


def test_an_answer_leaves_as_one_message_with_its_length() -> None:
    answer = Answer(200, [("Content-Type", "application/json"), ("Connection", "x")], BODY)

    kept = serialized(answer, keep_alive=True)
    closing = serialized(answer, keep_alive=False)
    head_only = serialized(answer, keep_alive=True, head_only=True)

    assert kept == (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY
    )
    assert closing.split(b"\r\n\r\n")[0].endswith(b"\r\nConnection: close")
    assert head_only == kept.removesuffix(BODY)  # the length of the body a GET would get
    with pytest.raises(ValueError, match="line break"):
        serialized(Answer(200, [("X-Injected", "a\r\nSet-Cookie: b")], b""), keep_alive=True)
