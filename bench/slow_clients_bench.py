"""Normal requests while many clients hold connections open: latency and failures, side by side.

Starts the webhook as the Deployment runs it (2 workers x 4 threads) and measures, in
alternating rounds, a steady client doing POST /mutate and GET /healthz on fresh TLS
connections: once on a quiet server and once while ``--held`` connections per kind (bare
TCP connects, ClientHellos cut short, TLS connections that send nothing, headers cut short,
bodies cut short) stay open, renewed as the server drops them. ``--worker gthread`` runs
gunicorn's stock threaded worker instead, and ``--worker gevent`` its gevent worker (needs
``pip install gevent``), for the comparison bench/README.md reports.

    .venv/bin/python bench/slow_clients_bench.py                  # ~1 minute
    .venv/bin/python bench/slow_clients_bench.py --worker gthread
    .venv/bin/python bench/slow_clients_bench.py --worker gevent
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.admission_bench import (  # noqa: E402
    GUNICORN_CONFIG,
    SERVICE_APP,
    admission_review,
    free_port,
    realistic_pods,
)
from harness.processes import terminate  # noqa: E402
from webhook.install.certs import write_certificates  # noqa: E402
from webhook.server.settings import ServeSettings  # noqa: E402

KINDS = ("tcp", "partial-hello", "tls-idle", "partial-headers", "partial-body")
CLIENT_TIMEOUT = 5.0


@dataclass
class Tally:
    latencies_ms: list[float] = field(default_factory=list)
    sent: int = 0
    failed: int = 0

    def line(self, label: str) -> str:
        if not self.latencies_ms:
            return f"{label:>8}: sent {self.sent}, failed {self.failed}"
        ordered = sorted(self.latencies_ms)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        return (
            f"{label:>8}: sent {self.sent:5}, succeeded {len(ordered):5}, failed "
            f"{self.failed:4}, p50 {statistics.median(ordered):7.1f} ms, p99 {p99:7.1f} ms"
        )


class Holder:
    """Keeps ``per_kind`` connections of each kind open, reopening those the server drops."""

    def __init__(self, port: int, context: ssl.SSLContext, per_kind: int) -> None:
        self.port, self.context, self.per_kind = port, context, per_kind
        self.stop = threading.Event()
        self.opened = 0
        self.hello = self._client_hello()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _client_hello(self) -> bytes:
        outgoing = ssl.MemoryBIO()
        probe = self.context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="127.0.0.1")
        with contextlib.suppress(ssl.SSLWantReadError):
            probe.do_handshake()
        return outgoing.read()

    def _open(self, kind: str) -> socket.socket | None:
        head = b"POST /mutate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
        try:
            raw = socket.create_connection(("127.0.0.1", self.port), timeout=CLIENT_TIMEOUT)
            if kind == "tcp":
                return raw
            if kind == "partial-hello":
                raw.sendall(self.hello[:20])
                return raw
            tls = self.context.wrap_socket(raw, server_hostname="127.0.0.1")
            if kind == "partial-headers":
                tls.sendall(head[:30])
            elif kind == "partial-body":
                tls.sendall(head + b'Content-Length: 5000\r\n\r\n{"apiVersion"')
            return tls
        except OSError:
            return None  # a server at its cap, or busy: try again next turn

    def _run(self) -> None:
        held: dict[str, list[socket.socket]] = {kind: [] for kind in KINDS}
        while not self.stop.is_set():
            for kind, sockets in held.items():
                alive = []
                for sock in sockets:
                    if _dropped(sock):
                        sock.close()
                    else:
                        alive.append(sock)
                while len(alive) < self.per_kind and not self.stop.is_set():
                    sock = self._open(kind)
                    if sock is None:
                        break
                    self.opened += 1
                    alive.append(sock)
                held[kind] = alive
            self.stop.wait(0.2)
        for sockets in held.values():
            for sock in sockets:
                sock.close()


def _dropped(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def measure(port: int, context: ssl.SSLContext, bodies: list[bytes], seconds: float) -> Tally:
    tally = Tally()
    deadline = time.monotonic() + seconds
    index = 0
    while time.monotonic() < deadline:
        body = bodies[index % len(bodies)]
        index += 1
        for method, path, payload in (("POST", "/mutate", body), ("GET", "/healthz", None)):
            tally.sent += 1
            started = time.monotonic()
            connection = http.client.HTTPSConnection(
                "127.0.0.1", port, context=context, timeout=CLIENT_TIMEOUT
            )
            try:
                headers = {"Content-Type": "application/json"} if payload else {}
                connection.request(method, path, payload, headers)
                response = connection.getresponse()
                response.read()
                if response.status != 200:
                    raise OSError(f"HTTP {response.status}")
                tally.latencies_ms.append((time.monotonic() - started) * 1000)
            except OSError:
                tally.failed += 1
            finally:
                connection.close()
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--worker", choices=("shipped", "gthread", "gevent"), default="shipped")
    parser.add_argument("--held", type=int, default=64, help="connections held per kind")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0, help="per measurement")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="gpushare-slow-bench-"))
    files = write_certificates(work / "certs", ["localhost"], [])
    settings = ServeSettings(
        tls_cert=files.serving_cert,
        tls_key=files.serving_key,
        policies=REPO / "policies",
        port=free_port(),
        workers=2,
        threads=4,
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    environ.update(settings.to_environ(), PYTHONPATH=str(REPO), MALLOC_ARENA_MAX="2")
    command = [sys.executable, "-m", "gunicorn", "--config", GUNICORN_CONFIG]
    if args.worker != "shipped":
        command += ["--worker-class", args.worker]
    log = (work / "server.log").open("wb")
    server = subprocess.Popen(
        [*command, SERVICE_APP], cwd=REPO, env=environ, stdout=log, stderr=log
    )
    context = ssl.create_default_context(cafile=str(files.ca_cert))
    context.check_hostname = False
    bodies = [
        json.dumps(admission_review(pod, i)).encode() for i, pod in enumerate(realistic_pods())
    ]
    try:
        time.sleep(3)
        quiet, held = Tally(), Tally()
        opened = 0
        for _ in range(args.rounds):
            for target, holding in ((quiet, False), (held, True)):
                holder = Holder(settings.port, context, args.held) if holding else None
                if holder:
                    holder.thread.start()
                    time.sleep(1.5)
                part = measure(settings.port, context, bodies, args.seconds)
                if holder:
                    holder.stop.set()
                    holder.thread.join()
                    opened += holder.opened
                target.latencies_ms += part.latencies_ms
                target.sent += part.sent
                target.failed += part.failed
        capacity = settings.workers * settings.threads
        print(
            f"worker {args.worker}; {settings.workers} workers x {settings.threads} threads; "
            f"held: {args.held} per kind x {len(KINDS)} kinds = {args.held * len(KINDS)} "
            f"({args.held * len(KINDS) / capacity:.0f}x the threads), {opened} opened in all"
        )
        print(quiet.line("quiet"))
        print(held.line("held"))
        if quiet.latencies_ms and held.latencies_ms:
            ratio = statistics.median(held.latencies_ms) / statistics.median(quiet.latencies_ms)
            print(f"p50 held/quiet: {ratio:.2f}")
        print(f"server alive: {server.poll() is None}")
    finally:
        terminate(server, 30)
        log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
