"""Reading a request body without letting a client make the server read or hold too much.

Content-Length is trusted only to refuse early (413 before reading) and to stop reading; a
chunked body, which has no length, is read up to the cap and no further.
"""

from __future__ import annotations

from typing import IO, Any

READ_CHUNK_BYTES = 64 * 1024


class UnreadableBodyError(Exception):
    """The server's input stream failed: a malformed chunk, a client gone mid-body."""


def _read(stream: IO[bytes], size: int) -> bytes:
    # Whatever the WSGI server's stream raises (a malformed chunk, a client gone mid-body)
    # is about the request, not about us.
    try:
        return stream.read(size)
    except Exception as error:
        raise UnreadableBodyError(f"{type(error).__name__}: {error}") from error


def read_body(environ: dict[str, Any], max_body_bytes: int) -> bytes | None:
    """The body of the WSGI request, or None when it is (or declares to be) too large.

    Without a length and without a server that ends chunked input
    (``wsgi.input_terminated``, which ``wsgi_call`` sets) the body is taken as empty, since
    reading could block forever.
    """
    stream = environ["wsgi.input"]
    declared = environ.get("CONTENT_LENGTH")
    if declared:
        try:
            length = int(declared)
        except ValueError:
            return b""
        if length > max_body_bytes:
            return None
        return read_exactly(stream, length)
    if not environ.get("wsgi.input_terminated"):
        return b""
    return read_capped(stream, max_body_bytes)


def read_capped(stream: IO[bytes], limit: int) -> bytes | None:
    """The stream to its end, or None as soon as it grows past ``limit`` bytes."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = _read(stream, min(READ_CHUNK_BYTES, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            return None


def read_exactly(stream: IO[bytes], length: int) -> bytes:
    """``length`` bytes, or fewer if the stream ends first.

    Never asks for more than ``length``: PEP 3333 lets a server block on a read past
    Content-Length. Asks for all that is left at once: the worker hands over the whole body
    in memory, and one read of it all is one copy, where small pieces would be many.
    """
    chunks: list[bytes] = []
    remaining = length
    while remaining > 0:
        chunk = _read(stream, remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
