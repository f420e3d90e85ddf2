"""``request_framing.frame``: when the worker may hand a request to a thread."""

from __future__ import annotations

from webhook.server.request_framing import MAX_HEAD_BYTES, frame, without_expect_continue

HEAD = b"POST /mutate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
CAP = 1000


def test_a_head_still_arriving_is_incomplete() -> None:
    assert not frame(b"POST /mutate HTTP/1.1\r\nHost: web", CAP).complete


def test_a_request_without_a_body_is_complete_at_the_blank_line() -> None:
    assert frame(b"GET /healthz HTTP/1.1\r\nHost: webhook\r\n\r\n", CAP).complete


def test_a_body_of_known_length_is_complete_when_all_of_it_is_here() -> None:
    request = HEAD + b"Content-Length: 10\r\n\r\n"
    assert not frame(request, CAP).complete
    assert not frame(request + b"12345", CAP).complete
    assert frame(request + b"1234567890", CAP).complete


def test_a_declared_body_over_the_cap_goes_to_the_app_at_once_for_its_413() -> None:
    assert frame(HEAD + b"Content-Length: 1001\r\n\r\n", CAP).complete


def test_a_chunked_body_is_complete_at_its_last_chunk() -> None:
    request = HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
    assert not frame(request, CAP).complete
    assert not frame(request + b"5\r\nhello\r\n", CAP).complete
    assert not frame(request + b"5\r\nhello\r\n0\r\n", CAP).complete
    assert frame(request + b"5\r\nhello\r\n0\r\n\r\n", CAP).complete
    assert frame(request + b"5;ext=1\r\nhello\r\n0\r\nTrailer: x\r\n\r\n", CAP).complete


def test_a_chunked_body_past_the_cap_is_complete_as_far_as_reading_goes() -> None:
    request = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"3e8\r\n" + b"x" * 1000 + b"\r\n"
    assert not frame(request, CAP).complete
    assert frame(request + b"1\r\nx\r\n", CAP).complete


def test_nonsense_goes_to_the_parser_at_once_for_its_400() -> None:
    for request in (
        HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
        HEAD + b"Content-Length: ten\r\n\r\n",
        HEAD + b"Content-Length: 3\r\nContent-Length: 4\r\n\r\n",
        HEAD + b"Transfer-Encoding: gzip\r\n\r\n",
        HEAD + b"no colon here\r\n\r\n",
        b"GET / HTTP/1.1\r\n" + b"X-Long: " + b"a" * MAX_HEAD_BYTES,
        HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"1" * 2000,
    ):
        assert frame(request, CAP).complete, request[:80]


def test_a_client_waiting_for_100_continue_is_told_to_send() -> None:
    request = HEAD + b"Expect: 100-continue\r\nContent-Length: 4\r\n\r\n"
    framing = frame(request, CAP)
    assert not framing.complete
    assert framing.expects_continue
    assert not frame(request + b"ab", CAP).expects_continue
    stripped = without_expect_continue(request + b"abcd")
    assert b"expect" not in stripped.lower()
    assert stripped.endswith(b"Content-Length: 4\r\n\r\nabcd")
