"""Faults under load: a bounded stream of pod creates, a relay in front of the webhook, and
what the stored pods say afterwards.

`PodStream` creates annotated and ordinary pods from a few threads through the real
kube-apiserver and keeps every outcome with its start and end time; `tally()` turns those
outcomes and the pods etcd holds into the figures each scenario prints and asserts.
`Relay` stands where a Service would: a loopback TCP relay, round robin over the replicas'
ports, that counts the connections the apiserver opens (every handshake with a rotated
certificate goes through it), can be taken down entirely, and takes a replica that refuses
a connection out of the rotation. `start_server()` runs `gpushare serve` on certificates
and a port the test chooses, so replicas can share one certificate and come back on the
same port.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import ipaddress
import itertools
import json
import os
import selectors
import shutil
import signal
import socket
import ssl
import struct
import threading
import time
import typing
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pods import annotated_pod, plain_pod

from harness.api import create_pod, status_message
from harness.controlplane import ControlPlane
from harness.processes import LOOPBACK, wait_for
from harness.registration import SHARED_RESOURCE
from harness.webhookserver import WebhookServer
from webhook.constants import APPLIED_ANNOTATION, FRACTION_ANNOTATION
from webhook.install.certs import (
    CertificateFiles,
    certificate_pem,
    issue_serving_certificate,
    load_ca,
    private_key_pem,
    service_dns_names,
    write_file_atomically,
)

# -- the stream of creates -------------------------------------------------------------------


@dataclass(frozen=True)
class Create:
    """One pod create as the client saw it: None for `error` means the pod was created."""

    name: str
    annotated: bool
    started: float
    finished: float
    error: str | None = None
    status: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class PodStream:
    """`threads` threads creating pods in `namespace` until stopped, or at most `limit`
    creates or `seconds` seconds (the bound that holds whatever a test does).

    Each thread alternates an annotated pod (gpu-fraction 0.5) and an ordinary one, on an
    ApiClient of its own, resting `pause` seconds between creates. `burst(n)` adds n
    annotated creates at once, which makes the apiserver open connections beyond those the
    steady stream keeps alive (so a new certificate meets fresh handshakes).
    """

    def __init__(
        self,
        control_plane: ControlPlane,
        namespace: str,
        *,
        threads: int = 3,
        pause: float = 0.03,
        limit: int = 20_000,
        seconds: float = 240.0,
    ) -> None:
        self.control_plane = control_plane
        self.namespace = namespace
        self.threads = threads
        self.pause = pause
        self.limit = limit
        self.seconds = seconds
        self.started = 0.0
        self.stopped = 0.0
        self._results: list[Create] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self._counter = itertools.count()
        self._crashes: list[BaseException] = []

    def __enter__(self) -> PodStream:
        self.started = time.monotonic()
        for index in range(self.threads):
            thread = threading.Thread(target=self._run, args=(index,), daemon=True)
            self._workers.append(thread)
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._workers:
            thread.join(timeout=60)
        if not self.stopped:
            self.stopped = time.monotonic()
        if self._crashes:
            raise AssertionError(f"a load thread crashed: {self._crashes[0]!r}")

    @property
    def duration(self) -> float:
        return (self.stopped or time.monotonic()) - self.started

    def results(self) -> list[Create]:
        with self._lock:
            return list(self._results)

    def sent(self) -> int:
        with self._lock:
            return len(self._results)

    def run_for(self, seconds: float) -> None:
        """Let the stream run `seconds` longer (it must still be running)."""
        if self._stop.wait(seconds):
            raise AssertionError("the pod stream stopped early (its limit or time bound)")
        if not any(thread.is_alive() for thread in self._workers):
            raise AssertionError("every load thread has ended")

    def burst(self, count: int) -> list[Create]:
        """`count` annotated creates started together; their outcomes (also kept in results)."""
        barrier = threading.Barrier(count)
        client = self.control_plane.api_client()
        outcomes: list[Create] = []

        def one() -> None:
            name = f"burst-{next(self._counter)}"
            barrier.wait(timeout=30)
            outcomes.append(self._create(client, name, annotated=True))

        threads = [threading.Thread(target=one, daemon=True) for _ in range(count)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
        finally:
            client.close()  # type: ignore[no-untyped-call]
        return outcomes

    def _run(self, index: int) -> None:
        try:
            client = self.control_plane.api_client()
        except BaseException as exc:
            self._crashes.append(exc)
            return
        deadline = self.started + self.seconds
        try:
            for step in itertools.count():
                if self._stop.is_set() or time.monotonic() >= deadline:
                    return
                number = next(self._counter)
                if number >= self.limit:
                    return
                self._create(client, f"load-{index}-{step}", annotated=step % 2 == 0)
                if self._stop.wait(self.pause):
                    return
        except BaseException as exc:
            self._crashes.append(exc)
        finally:
            client.close()  # type: ignore[no-untyped-call]

    def _create(self, client: k8s.ApiClient, name: str, *, annotated: bool) -> Create:
        pod = annotated_pod(name) if annotated else plain_pod(name)
        started = time.monotonic()
        try:
            create_pod(client, self.namespace, pod)
        except ApiException as exc:
            outcome = Create(
                name, annotated, started, time.monotonic(), status_message(exc), exc.status
            )
        except Exception as exc:
            outcome = Create(name, annotated, started, time.monotonic(), repr(exc), None)
        else:
            outcome = Create(name, annotated, started, time.monotonic())
        with self._lock:
            self._results.append(outcome)
        return outcome


# -- what etcd holds, and the figures ----------------------------------------------------------


def stored_pods(api: k8s.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    """Every pod stored in `namespace` by name, as raw JSON (no client models)."""
    response: Any = k8s.CoreV1Api(api).list_namespaced_pod(namespace, _preload_content=False)
    return {pod["metadata"]["name"]: pod for pod in json.loads(response.data)["items"]}


def mutated(pod: Mapping[str, Any]) -> bool:
    """gpushare's mutation is on the pod: its record, and the shared resource as a limit."""
    annotations = pod["metadata"].get("annotations") or {}
    return APPLIED_ANNOTATION in annotations and any(
        SHARED_RESOURCE in ((c.get("resources") or {}).get("limits") or {})
        for c in pod["spec"]["containers"]
    )


def annotated(pod: Mapping[str, Any]) -> bool:
    return FRACTION_ANNOTATION in (pod["metadata"].get("annotations") or {})


@dataclass(frozen=True)
class Figures:
    """One scenario's outcome: the client's view and what storage holds.

    A wrong allow is an annotated pod stored without gpushare's mutation while the
    failurePolicy is Fail; under Ignore the same pods are counted as `unmutated`.
    """

    scenario: str
    sent: int
    succeeded: int
    failed: int
    annotated_sent: int
    annotated_failed: int
    ordinary_failed: int
    unmutated: int
    wrong_allows: int
    seconds: float
    failures: tuple[Create, ...]
    unmutated_names: tuple[str, ...]

    def line(self, extra: str = "") -> str:
        rate = self.sent / self.seconds if self.seconds else 0.0
        tail = f" | {extra}" if extra else ""
        return (
            f"[{self.scenario}] sent {self.sent} ({self.annotated_sent} annotated), "
            f"succeeded {self.succeeded}, failed {self.failed} "
            f"(annotated {self.annotated_failed}, ordinary {self.ordinary_failed}), "
            f"wrong allows {self.wrong_allows}, unmutated {self.unmutated}, "
            f"{self.seconds:.1f} s, {rate:.0f} creates/s{tail}"
        )

    def failure_summary(self, limit: int = 5) -> str:
        """The distinct failure messages with their counts, for assertion messages."""
        counts = Counter(f"{c.status}: {c.error}" for c in self.failures)
        return "; ".join(f"{n} x {text[:300]}" for text, n in counts.most_common(limit))


def tally(
    scenario: str,
    stream: PodStream,
    api: k8s.ApiClient,
    *,
    fail_policy: bool = True,
    results: Sequence[Create] | None = None,
) -> Figures:
    """The figures of a stopped stream (or of `results`, a part of it) and its stored pods."""
    outcomes = list(stream.results() if results is None else results)
    stored = stored_pods(api, stream.namespace)
    names = {c.name for c in outcomes}
    unmutated = tuple(
        sorted(
            name
            for name, pod in stored.items()
            if name in names and annotated(pod) and not mutated(pod)
        )
    )
    failures = tuple(c for c in outcomes if not c.ok)
    return Figures(
        scenario=scenario,
        sent=len(outcomes),
        succeeded=sum(c.ok for c in outcomes),
        failed=len(failures),
        annotated_sent=sum(c.annotated for c in outcomes),
        annotated_failed=sum(c.annotated for c in failures),
        ordinary_failed=sum(not c.annotated for c in failures),
        unmutated=len(unmutated),
        wrong_allows=len(unmutated) if fail_policy else 0,
        seconds=stream.duration,
        failures=failures,
        unmutated_names=unmutated,
    )


def between(outcomes: Sequence[Create], start: float, end: float) -> list[Create]:
    """The creates that started at or after `start` and ended by `end`."""
    return [c for c in outcomes if c.started >= start and c.finished <= end]


# -- the relay --------------------------------------------------------------------------------

_RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a RST


def _reset(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        sock.close()


# The client's first flight on a connection that can only be a request on a kept-alive
# connection: after ClientHello and the handshake's last client flight.
KEPT_ALIVE_FLIGHT = 3


@dataclass(eq=False)
class _Relayed:
    client: socket.socket
    abort: threading.Event = field(default_factory=threading.Event)


@dataclass
class Relay:
    """A loopback TCP relay in front of one or more webhook replicas (a Service).

    New connections go round robin to `endpoints` (ports on 127.0.0.1); established ones
    stay with their replica, as with kube-proxy. A replica that refuses a connection is taken
    out of the rotation at once and the next one is tried (a failed readiness probe, without
    its delay); `add()` puts one back. TLS passes through untouched. Closing is passed on as
    it happened: a FIN as a half close, a reset as a reset. `down()` refuses every new
    connection and resets the relayed ones (the webhook is gone); `up()` listens again on the
    same port; `reset_next_call()` cuts one call short. `accepted` counts the connections
    the client opened.
    """

    endpoints: list[int]
    accepted: int = 0
    resets: int = 0
    refused_by: Counter[int] = field(default_factory=Counter)
    routed_to: Counter[int] = field(default_factory=Counter)
    _port: int = 0
    _want_listening: bool = True
    _listening: threading.Event = field(default_factory=threading.Event, repr=False)
    _closed: threading.Event = field(default_factory=threading.Event, repr=False)
    _next: int = 0
    _reset_next: bool = False
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _threads: list[threading.Thread] = field(default_factory=list, repr=False)
    _relayed: dict[int, _Relayed] = field(default_factory=dict, repr=False)
    _ids: Iterator[int] = field(default_factory=itertools.count, repr=False)

    @property
    def port(self) -> int:
        assert self._port, "enter the relay first"
        return self._port

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    def __enter__(self) -> Relay:
        listener = self._bind(0)
        self._port = int(listener.getsockname()[1])
        self._spawn(self._accept_loop, listener)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=10)

    def add(self, port: int) -> None:
        with self._lock:
            if port not in self.endpoints:
                self.endpoints.append(port)

    def remove(self, port: int) -> None:
        with self._lock:
            if port in self.endpoints:
                self.endpoints.remove(port)

    def reset_next_call(self) -> None:
        """Reset the next kept-alive connection the client sends a request on, dropping it:
        a webhook call written, then a reset instead of an answer.

        Only a connection's third flight from the client or later (after the TLS
        handshake's two, the second possibly carrying the first request) is cut. Cutting a
        new connection's handshake instead failed no call in a fresh-clone run: Go's HTTP
        transport serves a request waiting for a new connection with one that frees up
        meanwhile, so the failed dial fails nobody.
        """
        with self._lock:
            self._reset_next = True

    def down(self) -> None:
        """Stop listening (connection refused) and reset every relayed connection.

        Returns once both are done: from then on no call reaches a replica.
        """
        self._closed.clear()
        with self._lock:
            self._want_listening = False
            relayed = list(self._relayed.values())
        if not self._closed.wait(10):
            raise AssertionError("the relay did not stop listening")
        for connection in relayed:
            connection.abort.set()
        wait_for(
            "the relayed connections to be reset",
            lambda: None if self._relaying(relayed) else True,
            timeout=10,
            interval=0.01,
        )

    def _relaying(self, connections: Sequence[_Relayed]) -> bool:
        with self._lock:
            current = [id(c) for c in self._relayed.values()]
        return any(id(c) in current for c in connections)

    def up(self) -> None:
        """Listen again on the same port."""
        self._listening.clear()
        with self._lock:
            self._want_listening = True
        if not self._listening.wait(10):
            raise AssertionError("the relay did not listen again")

    def _bind(self, port: int) -> socket.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, port))
        listener.listen(128)
        listener.settimeout(0.05)
        self._listening.set()
        return listener

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self, first: socket.socket) -> None:
        # The listener is opened and closed only here, so no other thread closes a socket
        # this one is blocked on.
        listener: socket.socket | None = first
        try:
            while not self._stop.is_set():
                with self._lock:
                    want = self._want_listening
                if not want and listener is not None:
                    listener.close()
                    listener = None
                    self._closed.set()
                if want and listener is None:
                    listener = self._bind(self._port)
                if listener is None:
                    time.sleep(0.02)
                    continue
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                client.settimeout(None)
                with self._lock:
                    self.accepted += 1
                self._spawn(self._serve, client)
        finally:
            if listener is not None:
                listener.close()

    def _connect(self) -> socket.socket | None:
        with self._lock:
            candidates = list(self.endpoints)
            start = self._next
            self._next += 1
        for offset in range(len(candidates)):
            port = candidates[(start + offset) % len(candidates)]
            try:
                upstream = socket.create_connection((LOOPBACK, port), timeout=2)
            except ConnectionRefusedError:
                with self._lock:
                    self.refused_by[port] += 1
                    if port in self.endpoints:
                        self.endpoints.remove(port)
                continue
            except OSError:
                continue
            upstream.settimeout(None)
            with self._lock:
                self.routed_to[port] += 1
            return upstream
        return None

    def _serve(self, client: socket.socket) -> None:
        upstream = self._connect()
        if upstream is None:
            _reset(client)
            return
        key = next(self._ids)
        relayed = _Relayed(client)
        with self._lock:
            self._relayed[key] = relayed
        try:
            clean = self._pump(client, upstream, relayed.abort)
        finally:
            with self._lock:
                del self._relayed[key]
        if clean:
            client.close()
            upstream.close()
        else:
            _reset(client, upstream)

    def _take_reset(self) -> bool:
        with self._lock:
            if not self._reset_next:
                return False
            self._reset_next = False
            self.resets += 1
            return True

    def _pump(self, client: socket.socket, upstream: socket.socket, abort: threading.Event) -> bool:
        """Relay both ways; True when both sides closed cleanly, False to reset both."""
        peers = {client: upstream, upstream: client}
        # Flights: runs of data from one side; the client's third is a kept-alive call.
        last_sender: socket.socket | None = None
        client_flights = 0
        with selectors.DefaultSelector() as selector:
            for sock in peers:
                selector.register(sock, selectors.EVENT_READ)
            reading = set(peers)
            while reading:
                if self._stop.is_set() or abort.is_set():
                    return False
                for key, _ in selector.select(timeout=0.05):
                    source = typing.cast(socket.socket, key.fileobj)
                    target = peers[source]
                    try:
                        data = source.recv(65536)
                        if data and source is client and last_sender is not client:
                            client_flights += 1
                        if data:
                            last_sender = source
                        if data and client_flights >= KEPT_ALIVE_FLIGHT and self._take_reset():
                            return False
                        if data:
                            target.sendall(data)
                            continue
                        # A FIN: pass the half close on, keep the other direction.
                        selector.unregister(source)
                        reading.discard(source)
                        target.shutdown(socket.SHUT_WR)
                    except OSError:
                        return False
        return True


# -- gpushare serve on a chosen port and certificate directory ----------------------------------


def start_server(
    workdir: Path,
    policies: Path,
    cert_dir: Path,
    *,
    port: int | None = None,
    name: str = "serve",
    extra_args: Sequence[str] = (),
    wait: bool = True,
) -> WebhookServer:
    """`gpushare serve` (2 workers of 4 threads, as the session server) on `port`.

    Unlike WebhookServer.start it serves `cert_dir` as it is (a directory of regular files or
    a Secret-style mount), so several servers share one certificate and a restarted one can
    take its old port. Returns once /readyz answers 200, or at once without `wait` (then
    call `wait_ready`). Call from the test's main thread: the server dies with the thread
    that started it.
    """
    server = WebhookServer.launch(
        workdir, policies, cert_dir, port=port, name=name, extra_args=extra_args
    )
    if wait:
        server.wait_ready_or_stop()
    return server


def wait_ready(server: WebhookServer) -> None:
    """Wait for a server from `start_server(..., wait=False)`; stop it if it never is."""
    server.wait_ready_or_stop()


def with_bundle(documents: Sequence[Mapping[str, Any]], bundle: bytes) -> list[dict[str, Any]]:
    """Copies of webhook configurations whose every caBundle is `bundle` (PEM)."""
    copies = copy.deepcopy([dict(d) for d in documents])
    for document in copies:
        for webhook in document.get("webhooks", ()):
            webhook["clientConfig"]["caBundle"] = base64.b64encode(bundle).decode()
    return copies


def kill(server: WebhookServer) -> None:
    """SIGKILL the arbiter and its workers together, as when a container is killed."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=30)


# -- certificates -----------------------------------------------------------------------------

SECRET_FILES = ("ca.crt", "tls.crt", "tls.key")


@dataclass(frozen=True)
class KeyPair:
    cert: bytes
    key: bytes

    @property
    def serial(self) -> int:
        return x509.load_pem_x509_certificate(self.cert).serial_number


def new_serving_pair(ca_dir: Path) -> KeyPair:
    """A new key and serving certificate from the CA in `ca_dir` (as `gpushare certs` makes)."""
    ca = load_ca(CertificateFiles(ca_dir))
    issued = issue_serving_certificate(
        ca,
        service_dns_names("gpushare", "gpushare-system"),
        [ipaddress.ip_address(LOOPBACK)],
    )
    return KeyPair(certificate_pem(issued.certificate), private_key_pem(issued.key))


def rewrite_in_place(cert_dir: Path, pair: KeyPair) -> None:
    """Replace the pair by writing into the existing files (truncate, write): key first."""
    (cert_dir / "tls.key").write_bytes(pair.key)
    (cert_dir / "tls.crt").write_bytes(pair.cert)


def rename_into_place(cert_dir: Path, pair: KeyPair) -> None:
    """Replace the pair by atomic renames, key first (what `gpushare certs --renew` does)."""
    write_file_atomically(cert_dir / "tls.key", pair.key, 0o600)
    write_file_atomically(cert_dir / "tls.crt", pair.cert, 0o644)


class SecretMount:
    """A directory laid out as the kubelet mounts a Secret, updated as the kubelet does.

    `<dir>/tls.crt -> ..data/tls.crt`, `..data -> ..<version>/`; an update writes a new
    version directory, points a temporary `..data_tmp` link at it, renames that over
    `..data` (one atomic step for all files at once) and removes the old version.
    """

    def __init__(self, directory: Path, files: Mapping[str, bytes]) -> None:
        self.directory = directory
        self._versions = itertools.count()
        directory.mkdir(parents=True, exist_ok=True)
        self._current = self._write_version(files)
        (directory / "..data").symlink_to(self._current.name)
        for name in files:
            (directory / name).symlink_to(f"..data/{name}")

    def _write_version(self, files: Mapping[str, bytes]) -> Path:
        version = self.directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{next(self._versions)}"
        version.mkdir()
        for name, content in files.items():
            (version / name).write_bytes(content)
            (version / name).chmod(0o600 if name.endswith(".key") else 0o644)
        return version

    def update(self, files: Mapping[str, bytes]) -> None:
        new = self._write_version(files)
        temporary = self.directory / "..data_tmp"
        temporary.symlink_to(new.name)
        os.replace(temporary, self.directory / "..data")
        shutil.rmtree(self._current)
        self._current = new


def served_serials(port: int, connections: int = 6) -> set[int]:
    """Serial numbers of the certificates `connections` fresh TLS handshakes were shown.

    Each handshake is a new connection, so the kernel spreads them over the workers, each of
    which reloads the files on its own.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    serials = set()
    for _ in range(connections):
        with (
            socket.create_connection((LOOPBACK, port), timeout=5) as raw,
            context.wrap_socket(raw) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        serials.add(x509.load_der_x509_certificate(der).serial_number)
    return serials


def wait_served(port: int, serial: int, what: str, timeout: float = 15.0) -> None:
    """Wait until every fresh handshake on `port` shows the certificate `serial`."""
    wait_for(
        what,
        lambda: True if served_serials(port) == {serial} else None,
        timeout=timeout,
        interval=0.1,
    )
