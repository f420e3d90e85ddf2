"""TLS for one connection over memory buffers (``ssl.SSLObject`` with two ``MemoryBIO``s).

The connection (``http_protocol``) owns its socket and hands this ciphertext in and out, so
pausing a client means pausing its socket, nothing else holds unread bytes, and what the
TLS layer has to say is always sent: the alert that refuses an old protocol version, and
close_notify when the server closes. asyncio's own TLS transport closes without flushing a
handshake alert and, when paused and resumed around its own read-ahead, was seen here to
leave bytes unread until the read deadline.
"""

from __future__ import annotations

import contextlib
import ssl
from dataclasses import dataclass

READ_BYTES = 256 * 1024


@dataclass
class Received:
    plaintext: bytes
    # Bytes to send back (handshake messages, session tickets, alerts).
    outgoing: bytes
    # The client sent close_notify: nothing more will come.
    closed: bool = False


class TlsSession:
    def __init__(self, context: ssl.SSLContext) -> None:
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.handshaken = False

    def receive(self, ciphertext: bytes) -> Received:
        """Take in bytes from the client. Raises ``ssl.SSLError`` for a handshake or record
        the server refuses; ``pending_output`` then holds the alert to send."""
        self.incoming.write(ciphertext)
        if not self.handshaken:
            try:
                self.tls.do_handshake()
            except ssl.SSLWantReadError:
                return Received(b"", self.outgoing.read())
            self.handshaken = True
        chunks: list[bytes] = []
        closed = False
        try:
            while True:
                chunk = self.tls.read(READ_BYTES)
                if not chunk:
                    closed = True
                    break
                chunks.append(chunk)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:
            closed = True
        return Received(b"".join(chunks), self.outgoing.read(), closed)

    def pending_output(self) -> bytes:
        return self.outgoing.read()

    def send(self, plaintext: bytes) -> bytes:
        """The ciphertext that carries ``plaintext``."""
        self.tls.write(plaintext)
        return self.outgoing.read()

    def close_notify(self) -> bytes:
        """The ciphertext of the server's close_notify (empty before the handshake)."""
        if not self.handshaken:
            return b""
        # unwrap waits for the client's reply, which the server does not need.
        with contextlib.suppress(ssl.SSLWantReadError, ssl.SSLError, ValueError):
            self.tls.unwrap()
        return self.outgoing.read()

    def client_certificate(self) -> bool:
        """The client presented a certificate that verified against the client CA."""
        return bool(self.tls.getpeercert())
