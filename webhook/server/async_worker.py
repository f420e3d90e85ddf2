"""The gunicorn worker: one asyncio event loop serving HTTP/1.1 over TLS (``http_protocol``).

gunicorn stays the process manager (forking, restarting and stopping workers, one listening
socket per worker with ``reuse_port``, the heartbeat); the worker is a subclass of
``gunicorn.workers.base.Worker``, the documented base for custom worker classes
(gunicorn's ``worker_class`` setting), and uses only its documented parts: ``run``,
``sockets``, ``wsgi``, ``cfg``, ``log``, ``alive``, ``ppid``, ``timeout`` and ``notify``.
gunicorn's own workers cannot bound what a client holds (bench/README.md, "The transport").

With ``GPUSHARE_METRICS_PORT`` gunicorn also gives each worker a listener on that port
(``gunicorn_conf.bind``): served over plain HTTP by the same connection code, with
``/metrics`` alone (``app.metrics_app``: the exposition of all workers) and a small
connection cap of its own, so a scraper that connects and sends nothing holds its own
connection only, as on the admission port, and never reaches an admission path.

Signals, as gunicorn's other workers take them: SIGTERM stops accepting, closes idle
connections, lets requests being read or answered finish within ``graceful_timeout`` and
closes each after its answer; SIGINT and SIGQUIT stop at once; SIGUSR1 reopens log files.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gunicorn.workers.base import Worker

from webhook.server.connections import Connections, Phase
from webhook.server.http_protocol import HttpConnection
from webhook.server.serving import Limits, Service
from webhook.server.settings import ServeSettings
from webhook.server.tls import serving_certificate

# Room for a few maximum-size bodies at once (the apiserver sends at most 3 MiB) besides
# every ordinary one; past it the oldest unfinished request is dropped.
BUFFERED_BODIES = 2
# The metrics port: a few scrapers at once; a GET has no body worth the name.
METRICS_MAX_CONNECTIONS = 32
METRICS_MAX_BODY_BYTES = 4096


class AsyncioWorker(Worker):  # type: ignore[misc]
    alive: bool

    def run(self) -> None:
        try:
            asyncio.run(self.serve())
        finally:
            # Closing the loop restored the default SIGTERM action, which would kill the
            # worker mid-exit if the arbiter signalled again.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        settings = ServeSettings.from_environ()
        service = Service(
            app=self.wsgi,
            limits=Limits(
                read_timeout=settings.request_read_timeout_seconds,
                keepalive=float(self.cfg.keepalive),
                max_body_bytes=settings.max_body_bytes,
                loop_answer_max_bytes=settings.loop_answer_max_bytes,
            ),
            connections=Connections(
                self.cfg.worker_connections, BUFFERED_BODIES * settings.max_body_bytes
            ),
            executor=ThreadPoolExecutor(self.cfg.threads, thread_name_prefix="gpushare"),
            tls_context=self.tls_contexts(settings) if self.cfg.is_ssl else None,
        )
        stop = asyncio.Event()
        quit_now = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, quit_now.set)
        loop.add_signal_handler(signal.SIGQUIT, quit_now.set)
        loop.add_signal_handler(signal.SIGUSR1, self.log.reopen_files)
        metrics = self.metrics_service(service, settings)
        servers = []
        for listener in self.sockets:
            sock = socket.socket(fileno=os.dup(listener.fileno()))
            # The metrics listener is the one on the metrics port (gunicorn_conf.bind).
            serving = metrics if sock.getsockname()[1] == settings.metrics_port else service
            servers.append(await self.listen(sock, serving or service))
        await self.heartbeat_until(stop, quit_now)
        for server in servers:
            server.close()
        for connection in list(metrics.live if metrics else ()):
            connection.evict("worker stopping")  # scrapes are not worth a drain
        if not quit_now.is_set():
            await self.drain(service, quit_now)
        for connection in list(service.live):
            connection.evict("worker stopped")
        service.executor.shutdown(wait=False, cancel_futures=True)

    async def listen(self, sock: socket.socket, service: Service) -> asyncio.Server:
        return await asyncio.get_running_loop().create_server(
            lambda: HttpConnection(service), sock=sock, backlog=self.cfg.backlog
        )

    def metrics_service(self, service: Service, settings: ServeSettings) -> Service | None:
        """What the metrics port's connections share: ``/metrics`` alone, no TLS, every
        answer in the loop, few connections; None without a metrics port."""
        if not settings.metrics_port:
            return None
        # Here, in the worker: the arbiter loads this class and need not import the app.
        from webhook.server.app import WebhookApp, metrics_app

        if not isinstance(self.wsgi, WebhookApp):
            raise TypeError("the metrics port serves the webhook's own WSGI app only")
        return Service(
            app=metrics_app(self.wsgi),
            limits=Limits(
                read_timeout=settings.request_read_timeout_seconds,
                keepalive=float(self.cfg.keepalive),
                max_body_bytes=METRICS_MAX_BODY_BYTES,
                loop_answer_max_bytes=METRICS_MAX_BODY_BYTES,
            ),
            connections=Connections(METRICS_MAX_CONNECTIONS, METRICS_MAX_BODY_BYTES),
            executor=service.executor,
            tls_context=None,
        )

    def tls_contexts(self, settings: ServeSettings) -> Callable[[], ssl.SSLContext]:
        certificate = serving_certificate(
            Path(self.cfg.certfile), Path(self.cfg.keyfile), settings.client_ca
        )
        return certificate.context

    async def heartbeat_until(self, stop: asyncio.Event, quit_now: asyncio.Event) -> None:
        """Tell the arbiter this worker lives, until a signal or the arbiter's death."""
        interval = max(0.5, self.timeout / 4)
        while self.alive and not stop.is_set() and not quit_now.is_set():
            self.notify()
            if os.getppid() != self.ppid:
                self.log.info("Parent changed, shutting down: %s", self)
                return
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(quit_now.wait())]
            await asyncio.wait(waiters, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()
        self.alive = False

    async def drain(self, service: Service, quit_now: asyncio.Event) -> None:
        """Let requests in progress finish; idle connections close now."""
        service.stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.graceful_timeout
        while service.live and loop.time() < deadline and not quit_now.is_set():
            for connection in service.connections.members(Phase.IDLE):
                connection.evict("worker stopping")
            self.notify()
            await asyncio.sleep(0.05)
