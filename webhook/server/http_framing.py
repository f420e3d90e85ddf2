"""HTTP/1.1 requests (RFC 9112) framed by llhttp, through httptools, one at a time, with a
bounded head.

httptools parses whatever it is given and calls back for each part, so this module decides
what it is given: the head up to its blank line and no further (a head still unfinished past
``MAX_HEAD_BYTES`` is refused with 431 before more of it is parsed), then exactly the
declared body, so that the bytes of a next, pipelined request stay with the caller until this
one is answered. A chunked body's end is known only once parsed; after one the connection
takes no further request (``RequestHead.keep_alive`` is False: the apiserver always sends a
length).

Why not h11, which framed requests here before: on e2e_bench.py's review, a request and its
answer cost h11 about 130 us of pure Python per cycle and llhttp about 5 us (bench/README.md,
"The transport"), a quarter of the worker's CPU per admission. llhttp (Node.js's parser) is
strict by default: no bare LF line ends, no obsolete line folding, one Content-Length, no
Content-Length beside Transfer-Encoding, token methods it knows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum

import httptools

# Far above what the apiserver sends (a few hundred bytes of head).
MAX_HEAD_BYTES = 16 * 1024
_HEAD_END = b"\r\n\r\n"


class MalformedRequestError(Exception):
    """A request the server refuses before the application sees it: ``status`` (400, or
    431 for a head without end) and what is wrong."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class RequestHead:
    method: str
    target: str
    # Names lower-cased, values as sent, in order.
    headers: list[tuple[bytes, bytes]]
    declared_length: int | None
    chunked: bool
    # "Expect: 100-continue" from an HTTP/1.1 client.
    expects_continue: bool
    # The client keeps the connection after the answer (its version and Connection header),
    # and the framing can take another request after this one.
    keep_alive: bool


class Signal(Enum):
    NEED_DATA = "need data"  # the caller's buffer holds no more of the request
    END = "end"  # the request's body is complete
    PAUSED = "paused"  # the request has ended: answer it before the next is framed


Event = RequestHead | bytes | Signal


class _Stage(Enum):
    HEAD = "head"
    BODY = "body"
    ENDED = "ended"


class RequestFramer:
    """The requests of one connection, from the bytes the caller has buffered."""

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._events: deque[Event] = deque()
        self._stage = _Stage.HEAD
        self._head_fed = 0
        self._head_tail = b""  # the last bytes of the head fed, where its end may begin
        self._body_left: int | None = None
        self._begun = False
        self._target = bytearray()
        self._headers: list[tuple[bytes, bytes]] = []
        self._reusable = True

    # -- what the caller asks ------------------------------------------------------------

    def next_event(self, inbox: bytearray, eof: bool) -> Event:
        """The next part of the request, parsing what it needs from the front of ``inbox``
        (which it consumes); raises ``MalformedRequestError``."""
        if self._stage is _Stage.ENDED:
            return Signal.PAUSED
        while not self._events:
            if not inbox:
                if eof and self._begun:
                    raise MalformedRequestError(400, "the connection ended inside the request")
                return Signal.NEED_DATA
            if self._stage is _Stage.HEAD:
                self._feed_head(inbox)
            else:
                size = len(inbox) if self._body_left is None else self._body_left
                self._feed(inbox, min(size, len(inbox)))
        event = self._events.popleft()
        if event is Signal.END:
            self._stage = _Stage.ENDED
        return event

    def start_next_cycle(self) -> None:
        """The answer is out: frame the next request."""
        self._stage = _Stage.HEAD
        self._head_fed = 0
        self._head_tail = b""
        self._begun = False

    @property
    def reusable(self) -> bool:
        """Whether another request can follow (not after a chunked body or an error)."""
        return self._reusable

    # -- feeding llhttp --------------------------------------------------------------------

    def _feed_head(self, inbox: bytearray) -> None:
        """Up to the head's blank line and not past it; refused once the head, blank line
        included, cannot end within MAX_HEAD_BYTES."""
        tail = self._head_tail
        room = MAX_HEAD_BYTES - self._head_fed
        end = (tail + inbox[:room]).find(_HEAD_END)
        if end < 0 and len(inbox) >= room:
            self._reusable = False
            raise MalformedRequestError(431, f"the request head is over {MAX_HEAD_BYTES} bytes")
        size = end + len(_HEAD_END) - len(tail) if end >= 0 else len(inbox)
        self._head_tail = (tail + inbox[:size])[-(len(_HEAD_END) - 1) :]
        self._head_fed += size
        self._feed(inbox, size)

    def _feed(self, inbox: bytearray, size: int) -> None:
        data = bytes(inbox[:size])
        del inbox[:size]
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reusable = False
            raise MalformedRequestError(400, "protocol upgrades are not served here") from None
        except httptools.HttpParserError as error:
            self._reusable = False
            raise MalformedRequestError(400, str(error) or type(error).__name__) from None

    # -- httptools' callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._begun = True
        self._target = bytearray()
        self._headers = []

    def on_url(self, url: bytes) -> None:
        self._target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        headers = self._headers
        declared = None
        chunked = expects = False
        for name, value in headers:
            if name == b"content-length":
                declared = int(value.strip())  # llhttp has checked it: one decimal number
            elif name == b"transfer-encoding":
                chunked = True
            elif name == b"expect":
                expects = value.strip().lower() == b"100-continue"
        version = self._parser.get_http_version()
        if chunked:
            self._reusable = False  # its end is found only by parsing past it
        self._body_left = declared if not chunked else None
        self._stage = _Stage.BODY
        self._events.append(
            RequestHead(
                method=self._parser.get_method().decode("ascii"),
                target=self._target.decode("latin-1"),
                headers=headers,
                declared_length=declared,
                chunked=chunked,
                expects_continue=expects and version == "1.1",
                keep_alive=self._parser.should_keep_alive() and self._reusable,
            )
        )

    def on_body(self, body: bytes) -> None:
        if self._body_left is not None:
            self._body_left -= len(body)
        self._events.append(body)

    def on_message_complete(self) -> None:
        self._events.append(Signal.END)
