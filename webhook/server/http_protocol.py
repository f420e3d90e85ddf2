"""HTTP/1.1 over TLS for one connection, on asyncio: no client can stall it.

Each accepted socket gets an ``HttpConnection`` (an ``asyncio.Protocol``) and one task that
runs its requests in turn: the TLS handshake (``tls_session``), then per request read it
whole, answer (``wsgi_call``), write, wait for the next. ``http_framing`` frames requests
(RFC 9112, llhttp); this module only decides when to read, when to give up and what to hold.

What a client can hold, and for how long:

- reading a request (handshake included) has ``read_timeout`` from its first byte awaited;
  past it the connection is closed. An idle kept-alive connection has ``keepalive``;
- a head is at most ``http_framing.MAX_HEAD_BYTES`` (431 past it); a body past
  ``max_body_bytes``, declared or received, is not read further: the application answers
  413 from the declared length (no "100 Continue" is sent for it) and the connection closes;
- bytes received but not yet framed pause the socket past ``INBOX_PAUSE_BYTES``; a body is
  read only once its size is reserved in the worker's budget, which also caps the number
  of connections (``connections.Connections``);
- an answer the client does not take in has ``read_timeout`` to leave the buffers;
- closing sends TLS close_notify and a half-close, and drops what the client still sends
  for at most ``CLOSE_TIMEOUT``.

Small requests (every ordinary admission) are answered in the loop; larger ones go to the
worker's thread pool with their body in memory, so no thread ever waits on a client.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

from webhook.server import http_messages as messages
from webhook.server.connections import STALLED_SECONDS, Phase
from webhook.server.http_framing import (
    MalformedRequestError,
    RequestFramer,
    RequestHead,
    Signal,
)
from webhook.server.serving import Service
from webhook.server.tls_session import TlsSession
from webhook.server.wsgi_call import Answer, Peer, WholeRequest, call

log = logging.getLogger("gpushare.server.http")

INBOX_PAUSE_BYTES = 64 * 1024
# Bodies this small (every ordinary review) need no reservation: what they can hold is
# bounded by the connection cap and INBOX_PAUSE_BYTES, and they never wait behind uploads.
SMALL_BODY_BYTES = 64 * 1024
CLOSE_TIMEOUT = 2.0


class HttpConnection(asyncio.Protocol):
    def __init__(self, service: Service) -> None:
        self.service = service
        self.loop = asyncio.get_running_loop()
        self.framer = RequestFramer()
        # Nothing of an answer written yet for the request being read: a refusal may go out.
        self.answerable = True
        self.inbox = bytearray()
        self.room: asyncio.Future[None] | None = None
        self.small_body = 0  # bytes of a body read without a reservation
        self.eof = False
        self.paused = False
        self.lost = False
        self.waiter: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None
        self.transport: asyncio.Transport | None = None
        tls_context = service.tls_context
        self.tls = TlsSession(tls_context()) if tls_context is not None else None
        self.closing = False

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.service.live.add(self)
        self.service.connections.admit(self)
        self.expire_in(self.service.limits.read_timeout)
        self.task = self.loop.create_task(self.run())

    def data_received(self, data: bytes) -> None:
        connections = self.service.connections
        if self.closing:
            return  # lingering after the answer: the client's leftovers are dropped
        if self.tls is not None:
            data = self.decrypt(data)
            if not data:
                return
        if connections.phase_of.get(self) is Phase.IDLE:
            connections.enter(self, Phase.READING)
            self.expire_in(self.service.limits.read_timeout)
        self.inbox += data
        connections.heard_from(self, len(self.inbox) + self.small_body)
        if len(self.inbox) > INBOX_PAUSE_BYTES:
            self.pause()
        self.wake()

    def decrypt(self, data: bytes) -> bytes:
        assert self.tls is not None and self.transport is not None
        try:
            received = self.tls.receive(data)
        except ssl.SSLError as error:
            log.debug("TLS refused: %s", error)
            self.transport.write(self.tls.pending_output())  # the alert says why
            self.close(notify=False)
            return b""
        if received.outgoing:
            self.transport.write(received.outgoing)
        if received.closed:
            self.eof = True
        if self.tls.handshaken or received.closed:
            self.wake()
        return received.plaintext

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True

    def resume(self) -> None:
        if self.paused and not self.lost and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def room_granted(self) -> None:
        settle(self.room)

    async def reserve(self, size: int) -> None:
        """Hold ``size`` bytes of the worker's body budget before reading the body."""
        connections = self.service.connections
        if connections.reserve(self, size):
            return
        self.pause()
        self.room = self.loop.create_future()
        retry = self.loop.call_later(STALLED_SECONDS, self.retry_room)
        try:
            await self.room
        finally:
            retry.cancel()
            self.room = None
        if len(self.inbox) <= INBOX_PAUSE_BYTES:
            self.resume()

    def retry_room(self) -> None:
        """Still waiting for room: uploads may have stalled since; close them."""
        if self.room is None or self.room.done() or self.lost:
            return
        self.service.connections.retry_waiting()
        if self.room is not None and not self.room.done():
            self.loop.call_later(STALLED_SECONDS, self.retry_room)

    def eof_received(self) -> bool | None:
        self.eof = True
        self.wake()
        if self.closing and self.transport is not None:
            self.transport.close()  # the client has finished too: end the linger
        return True  # the answer may still be written; close() ends the connection

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.service.connections.forget(self)
        self.service.live.discard(self)
        if self.deadline is not None:
            self.deadline.cancel()
        self.wake()
        settle(self.drained)

    def resume_writing(self) -> None:
        settle(self.drained)

    # -- bounds ----------------------------------------------------------------------------

    def expire_in(self, seconds: float) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = self.loop.call_later(seconds, self.evict, "deadline")

    def evict(self, reason: str) -> None:
        """Close now, without waiting for the client (the cap, the memory bound, a deadline,
        or a stopping worker)."""
        log.debug("closing a connection: %s", reason)
        self.service.connections.forget(self)
        if self.transport is not None:
            self.transport.abort()
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()

    # -- the connection's requests ---------------------------------------------------------

    async def run(self) -> None:
        try:
            peer = await self.handshake()
            while not self.lost:
                request = await self.read_request()
                if request is None or not await self.answer(request, peer):
                    break
                if not self.next_cycle():
                    break
        except (OSError, ssl.SSLError, ConnectionError, asyncio.CancelledError) as error:
            log.debug("connection dropped: %r", error)
        except Exception:
            log.exception("connection failed")
        finally:
            self.close()

    async def handshake(self) -> Peer:
        """Wait for the TLS handshake (under the read deadline); who the client is."""
        transport = self.transport
        assert transport is not None
        while self.tls is not None and not self.tls.handshaken:
            if self.lost or self.eof or self.closing:
                raise ConnectionError("closed during the TLS handshake")
            await self.more_data()
        transport.set_write_buffer_limits(high=64 * 1024, low=0)
        server = transport.get_extra_info("sockname") or ("", 0)
        remote = transport.get_extra_info("peername") or ("", 0)
        return Peer(
            server_name=str(server[0]),
            server_port=str(server[1]),
            remote_addr=str(remote[0]),
            remote_port=str(remote[1]),
            url_scheme="https" if self.tls is not None else "http",
            client_certificate=self.tls is not None and self.tls.client_certificate(),
        )

    def wake(self) -> None:
        settle(self.waiter)

    async def more_data(self) -> None:
        self.waiter = self.loop.create_future()
        await self.waiter
        self.waiter = None

    def next_event(self) -> RequestHead | bytes | Signal:
        inbox = self.inbox
        size = len(inbox)
        event = self.framer.next_event(inbox, self.eof)
        if len(inbox) != size:
            self.service.connections.hold_loose(self, len(inbox) + self.small_body)
            if self.room is None and len(inbox) <= INBOX_PAUSE_BYTES:
                self.resume()
        return event

    async def read_request(self) -> WholeRequest | None:
        """The next request, whole or cut at the cap; None when the client has gone."""
        max_body = self.service.limits.max_body_bytes
        head: RequestHead | None = None
        size = 0
        body = bytearray()
        try:
            while True:
                event = self.next_event()
                if event is Signal.NEED_DATA:
                    if self.lost or self.eof:
                        return None
                    await self.more_data()
                elif isinstance(event, RequestHead):
                    head = event
                    declared = event.declared_length
                    if declared is not None and declared > max_body:
                        return messages.whole(head, b"", within_cap=False)
                    size = messages.body_size(event, max_body)
                    if size > SMALL_BODY_BYTES:
                        await self.reserve(size)
                    if event.expects_continue and not self.inbox:
                        self.write(messages.CONTINUE)
                elif isinstance(event, bytes):
                    body += event
                    if size <= SMALL_BODY_BYTES:
                        self.small_body = len(body)
                        self.service.connections.hold_loose(self, self.small_body)
                    if len(body) > max_body:  # chunked, past the cap: cut one byte over
                        return messages.whole(head, bytes(body[: max_body + 1]), False)
                elif event is Signal.END:
                    return messages.whole(head, bytes(body))
                else:  # PAUSED: nothing more is framed on this connection
                    return None
        except MalformedRequestError as error:
            self.refuse(error)
            return None

    def refuse(self, error: MalformedRequestError) -> None:
        """A 400 (431 for an endless head) for a malformed request."""
        if not self.answerable or self.lost:
            return
        answer = messages.json_answer(error.status, f"Malformed HTTP request: {error}")
        self.send_answer(answer, keep_alive=False)

    async def answer(self, request: WholeRequest, peer: Peer) -> bool:
        """Answer ``request``; True when the connection may carry another one."""
        connections = self.service.connections
        connections.enter(self, Phase.ANSWERING)
        if self.deadline is not None:
            self.deadline.cancel()
        app, limits = self.service.app, self.service.limits
        try:
            if len(request.body) <= limits.loop_answer_max_bytes:
                answer = call(app, request, peer)
            else:
                answer = await self.loop.run_in_executor(
                    self.service.executor, call, app, request, peer
                )
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the application failed to answer")
            answer = messages.failure_answer()
        keep_alive = request.body_within_cap and request.keep_alive and not self.service.stopping
        connections.release(self)
        self.small_body = 0
        connections.hold_loose(self, len(self.inbox))
        if self.lost:
            return False
        self.send_answer(answer, keep_alive, head_only=request.method == "HEAD")
        transport = self.transport
        if transport is not None and transport.get_write_buffer_size():
            self.expire_in(limits.read_timeout)
            self.drained = self.loop.create_future()
            await self.drained
            self.drained = None
        return keep_alive

    def send_answer(self, answer: Answer, keep_alive: bool, head_only: bool = False) -> None:
        """The whole answer in one write: one TLS record and one send, not one per part."""
        try:
            data = messages.serialized(answer, keep_alive, head_only)
        except ValueError:
            log.exception("the application's answer cannot be sent")
            data = messages.serialized(messages.failure_answer(), keep_alive, head_only)
        self.answerable = False
        self.write(data)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.lost:
            self.transport.write(self.tls.send(data) if self.tls is not None else data)

    def next_cycle(self) -> bool:
        """Ready for the next request: idle until its first byte, unless it is here."""
        if not self.framer.reusable:
            return False
        self.framer.start_next_cycle()
        self.answerable = True
        limits = self.service.limits
        if self.inbox:
            self.service.connections.enter(self, Phase.READING)
            self.expire_in(limits.read_timeout)
        else:
            self.service.connections.enter(self, Phase.IDLE)
            self.expire_in(limits.keepalive)
        return True

    def close(self, notify: bool = True) -> None:
        """Close after the last answer: close_notify, then a half-close, then drop what the
        client still sends until it closes too or ``CLOSE_TIMEOUT`` passes. Closing at once
        with unread bytes would reset the connection, which can destroy the answer before
        the client reads it (RFC 9112, section 9.6)."""
        if self.lost or self.transport is None:
            self.service.connections.forget(self)
            return
        if self.closing:
            return
        self.closing = True
        self.wake()
        self.service.connections.enter(self, Phase.CLOSING)
        self.expire_in(CLOSE_TIMEOUT)
        transport = self.transport
        if notify and self.tls is not None:
            transport.write(self.tls.close_notify())
        self.resume()
        try:
            if self.eof or not transport.can_write_eof():
                transport.close()
            else:
                transport.write_eof()
        except OSError:
            # The peer is gone already (shutdown(2) says ENOTCONN while the server stops):
            # nothing is left to tell it, and raising here would end the task with an error.
            transport.abort()


def settle(future: asyncio.Future[None] | None) -> None:
    """Wake whoever awaits ``future``, if anyone still does."""
    if future is not None and not future.done():
        future.set_result(None)
