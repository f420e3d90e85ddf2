"""Where an HTTP/1.1 request ends, judged from the bytes received so far.

The worker (``worker.ReadAheadWorker``) reads each request in its event loop and gives it to
a thread only once it is all there, so a client that sends slowly, or nothing, holds no
thread. This module answers the one question that needs: are these bytes a whole request?
It does not validate: anything it cannot make sense of is declared complete, so gunicorn's
parser, which sees the same bytes, answers it with its own 400 at once.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

# gunicorn refuses a request line over 4094 bytes and 100 header fields of 8190 bytes each;
# a head that has not ended by here will be refused whatever follows, so it goes to the
# parser now rather than after more reading.
MAX_HEAD_BYTES = 64 * 1024
# A chunk-size line is hex digits and perhaps extensions; anything longer is malformed.
MAX_CHUNK_LINE_BYTES = 1024

_HEAD_END = b"\r\n\r\n"
_EXPECT_CONTINUE = re.compile(rb"\r\nexpect:[ \t]*100-continue[ \t]*(?=\r\n)", re.IGNORECASE)


class Progress(enum.Enum):
    INCOMPLETE = "incomplete"
    # Everything the parser needs is here (or the request is malformed or too large: the
    # parser or the app refuses it without reading further).
    COMPLETE = "complete"


@dataclass(frozen=True)
class Framing:
    progress: Progress
    # The client waits for "100 Continue" before sending its body.
    expects_continue: bool = False

    @property
    def complete(self) -> bool:
        return self.progress is Progress.COMPLETE


INCOMPLETE = Framing(Progress.INCOMPLETE)
COMPLETE = Framing(Progress.COMPLETE)


def frame(buffer: bytes | bytearray, max_body_bytes: int) -> Framing:
    """Whether ``buffer`` holds a whole request (head and body) yet.

    A body declared larger than ``max_body_bytes``, or a chunked one that has grown past
    it, is complete as far as reading goes: the app answers 413 from what it has.
    """
    head_end = buffer.find(_HEAD_END, 0, MAX_HEAD_BYTES + len(_HEAD_END))
    if head_end < 0:
        return COMPLETE if len(buffer) > MAX_HEAD_BYTES else INCOMPLETE
    head = bytes(buffer[: head_end + 2])
    body_start = head_end + len(_HEAD_END)
    fields = _header_fields(head)
    if fields is None:
        return COMPLETE
    received = len(buffer) - body_start
    lengths = fields.get(b"content-length", [])
    codings = b",".join(fields.get(b"transfer-encoding", [])).lower()
    if codings:
        if b"chunked" not in codings or lengths:
            return COMPLETE
        progress = _chunked_progress(buffer, body_start, max_body_bytes)
        expected = None
    elif lengths:
        if len(lengths) != 1 or not lengths[0].isdigit():
            return COMPLETE
        expected = int(lengths[0])
        if expected > max_body_bytes or received >= expected:
            return COMPLETE
        progress = Progress.INCOMPLETE
    else:
        return COMPLETE
    if progress is Progress.COMPLETE:
        return COMPLETE
    waits = received == 0 and _EXPECT_CONTINUE.search(head) is not None
    return Framing(progress, expects_continue=waits)


def without_expect_continue(buffer: bytes | bytearray) -> bytes:
    """The request with its ``Expect: 100-continue`` field removed.

    Used once the worker has sent "100 Continue" itself, so gunicorn does not send a
    second one.
    """
    head_end = buffer.find(_HEAD_END)
    head, rest = bytes(buffer[: head_end + 2]), bytes(buffer[head_end + 2 :])
    return _EXPECT_CONTINUE.sub(b"", head, count=1) + rest


def _header_fields(head: bytes) -> dict[bytes, list[bytes]] | None:
    """Field values by lower-case name, or None when a line is not ``name: value``."""
    fields: dict[bytes, list[bytes]] = {}
    for line in head.split(b"\r\n")[1:]:
        if not line:
            continue
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            return None
        fields.setdefault(name.lower(), []).append(value.strip())
    return fields


def _chunked_progress(buffer: bytes | bytearray, position: int, max_body_bytes: int) -> Progress:
    """Walk the chunks received so far; COMPLETE at the last chunk's end or on nonsense."""
    body_bytes = 0
    while True:
        line_end = buffer.find(b"\r\n", position, position + MAX_CHUNK_LINE_BYTES)
        if line_end < 0:
            if len(buffer) - position > MAX_CHUNK_LINE_BYTES:
                return Progress.COMPLETE
            return Progress.INCOMPLETE
        size_text = bytes(buffer[position:line_end]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            return Progress.COMPLETE
        if size < 0:
            return Progress.COMPLETE
        position = line_end + 2
        if size == 0:
            return _trailers_progress(buffer, position)
        body_bytes += size
        if body_bytes > max_body_bytes:
            return Progress.COMPLETE
        position += size + 2
        if position > len(buffer):
            return Progress.INCOMPLETE


def _trailers_progress(buffer: bytes | bytearray, position: int) -> Progress:
    if buffer[position : position + 2] == b"\r\n":
        return Progress.COMPLETE
    if buffer.find(_HEAD_END, position - 2, position + MAX_HEAD_BYTES) >= 0:
        return Progress.COMPLETE
    if len(buffer) - position > MAX_HEAD_BYTES:
        return Progress.COMPLETE
    return Progress.INCOMPLETE
