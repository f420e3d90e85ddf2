"""The real thing: ``gpushare serve`` (gunicorn, 2 workers) over TLS on a loopback port."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from webhook.install.certs import (
    CertificateFiles,
    create_ca,
    issue_serving_certificate,
    parse_ip_addresses,
    write_certificates,
    write_serving,
)

from .support import (
    BUNDLED_POLICIES,
    RunningServer,
    annotated_pod,
    decoded_patch,
    review,
    running_server,
    wait_until,
)

pytestmark = pytest.mark.server

LOOPBACK = parse_ip_addresses(["127.0.0.1"])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """``gpushare serve`` with no certificate or policy flags: local CA, bundled policies."""
    with running_server(tmp_path_factory.mktemp("default")) as running:
        yield running


# -- TLS ------------------------------------------------------------------------------------


def test_handshake_with_the_generated_ca(server: RunningServer) -> None:
    for host in ("127.0.0.1", "localhost"):
        context = server.context()
        with (
            socket.create_connection((host, server.port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            assert tls.version() in ("TLSv1.2", "TLSv1.3")


def test_startup_message_says_how_to_configure_the_apiserver(server: RunningServer) -> None:
    assert f"gpushare webhook-config --ca {server.ca_file}" in server.log()
    assert f"--url https://127.0.0.1:{server.port}" in server.log()


def legacy_context(maximum: ssl.TLSVersion) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_ciphers("DEFAULT:@SECLEVEL=0")  # let the client offer what we refuse
    context.minimum_version = ssl.TLSVersion.TLSv1
    context.maximum_version = maximum
    return context


def test_tls_1_1_is_refused_by_the_server(server: RunningServer) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLSv1/TLSv1_1 constants
        context = legacy_context(ssl.TLSVersion.TLSv1_1)
    with (
        pytest.raises(ssl.SSLError, match="PROTOCOL_VERSION"),
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
        context.wrap_socket(raw),
    ):
        pass


def test_tls_1_2_is_accepted(server: RunningServer) -> None:
    context = server.context()
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.version() == "TLSv1.2"


def test_plain_http_gets_no_answer(server: RunningServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        received = b""
        try:
            while chunk := raw.recv(4096):
                received += chunk
        except ConnectionResetError:
            pass
    assert b"HTTP/1" not in received
    assert b"ok" not in received


# -- admission over the wire ----------------------------------------------------------------


def test_mutate_over_tls(server: RunningServer) -> None:
    status, body = server.json("POST", "/mutate", review(annotated_pod("0.5"), uid="wire-1"))
    assert status == 200
    response = body["response"]
    assert response["uid"] == "wire-1" and response["allowed"] is True
    assert any(op["path"].endswith("nvidia.com~1gpu.shared") for op in decoded_patch(response))


def test_bad_input_over_tls(server: RunningServer) -> None:
    assert server.request("POST", "/mutate", b"")[0] == 400
    assert server.request("POST", "/mutate", b"{}", content_type="text/plain")[0] == 415


def open_tls(server: RunningServer) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    return server.context().wrap_socket(raw, server_hostname="127.0.0.1")


def read_status_line(tls: ssl.SSLSocket) -> bytes:
    received = b""
    while b"\r\n" not in received:
        chunk = tls.recv(4096)
        if not chunk:
            break
        received += chunk
    return received.split(b"\r\n", 1)[0]


def test_declared_oversized_body_is_413_before_it_is_sent(server: RunningServer) -> None:
    with open_tls(server) as tls:
        tls.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 8388610\r\n\r\n{"
        )
        assert read_status_line(tls) == b"HTTP/1.1 413 Request Entity Too Large"


def test_chunked_body_is_cut_off_at_the_cap(server: RunningServer) -> None:
    """No Content-Length to trust: the server stops reading at the cap and answers 413."""
    chunk = b" " * 65536
    with open_tls(server) as tls:
        tls.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        framed = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
        try:
            for _ in range(8 * 1024 * 1024 // len(chunk) + 16):  # past the 6 MiB cap
                tls.sendall(framed)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError):
            pass  # the server may stop reading once it has answered
        assert read_status_line(tls) == b"HTTP/1.1 413 Request Entity Too Large"


def test_a_malformed_chunk_is_a_400(server: RunningServer) -> None:
    """A chunk size that is not hexadecimal is the client's mistake, not a 500."""
    with open_tls(server) as tls:
        tls.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
        )
        assert read_status_line(tls) == b"HTTP/1.1 400 Bad Request"


def test_a_head_request_gets_no_body_and_the_connection_goes_on(server: RunningServer) -> None:
    """HEAD is answered as GET is, without the body (its length declared): a body would be
    read as the start of the next answer on the kept-alive connection."""
    requests = b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
        server.context().wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(requests)
        received = b""
        while received.count(b"HTTP/1.1 ") < 2 or not received.endswith(b"}"):
            chunk = tls.recv(65536)
            assert chunk, received
            received += chunk
    head, after_head = received.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 ") and after_head.startswith(b"HTTP/1.1 200 ")
    declared = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert len(after_head.split(b"\r\n\r\n", 1)[1]) == declared > 0


def test_one_json_log_line_per_admission(server: RunningServer) -> None:
    server.json("POST", "/mutate", review(annotated_pod(), uid="logged-uid"))

    def logged() -> list[dict[str, object]]:
        lines = [line for line in server.log().splitlines() if "logged-uid" in line]
        return [json.loads(line) for line in lines]

    assert wait_until(lambda: len(logged()) == 1)
    (line,) = logged()
    assert line["decision"] == "patched" and line["namespace"] == "ml"
    assert line["pod"] == "trainer-" and isinstance(line["duration_ms"], float)


def metric(server: RunningServer, name: str) -> float:
    status, text = server.request("GET", "/metrics")
    assert status == 200
    match = re.search(rf"^{re.escape(name)} (\S+)$", text.decode(), re.M)
    return float(match.group(1)) if match else 0.0


def test_metrics_add_up_over_workers(server: RunningServer) -> None:
    name = 'gpushare_admission_requests_total{endpoint="validate",outcome="denied"}'
    before = metric(server, name)
    for index in range(20):  # a new connection each: the kernel spreads them over workers
        server.json("POST", "/validate", review(annotated_pod("0.5"), uid=f"m-{index}"))
    # Whichever worker answers the scrape, it reports all workers' requests.
    for _ in range(5):
        assert metric(server, name) == before + 20
    expiry = metric(server, "gpushare_certificate_expiry_timestamp_seconds")
    assert expiry > 1.7e9


def test_readyz_over_tls(server: RunningServer) -> None:
    status, body = server.json("GET", "/readyz")
    assert status == 200 and body["ready"] is True
    assert body["certificate"]["valid"] is True
    assert body["policies"]["count"] == 1
    # Anyone who reaches the port sees /readyz: no paths, names, digests or subjects.
    text = json.dumps(body)
    assert not any(word in text for word in ("default", "digest", "path", "subject", ".yaml"))


# -- certificate replaced on disk -----------------------------------------------------------


def served_certificate(port: int) -> bytes:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der


def new_pair_in(directory: Path) -> CertificateFiles:
    directory.mkdir(parents=True, exist_ok=True)
    files = CertificateFiles(directory)
    write_serving(files, issue_serving_certificate(create_ca(), ["localhost"], LOOPBACK))
    return files


def der_of(files: CertificateFiles) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    from webhook.install.certs import load_certificate

    return load_certificate(files.serving_cert).public_bytes(Encoding.DER)


def secret_mount(tmp_path: Path) -> tuple[Path, CertificateFiles]:
    """A directory laid out like a mounted Secret: files are symlinks through ``..data``."""
    mount = tmp_path / "tls"
    first = write_certificates(mount / "..2026_01_01_00_00_00.1", ["localhost"], LOOPBACK)
    (mount / "..data").symlink_to(first.directory.name)
    for name in ("ca.crt", "tls.crt", "tls.key"):
        (mount / name).symlink_to(f"..data/{name}")
    return mount, first


@pytest.mark.parametrize("style", ["plain-write", "atomic-rename", "secret-symlink-swap"])
def test_replaced_certificate_reaches_new_connections(tmp_path: Path, style: str) -> None:
    mount, first = secret_mount(tmp_path)
    with running_server(tmp_path, "--cert-dir", str(mount), ca_file=first.ca_cert) as server:
        old = served_certificate(server.port)
        assert old == der_of(first)
        kept = server.connection()  # a kept-alive connection made before the swap
        kept.request("GET", "/healthz")
        assert kept.getresponse().read()

        replacement = new_pair_in(tmp_path / "replacement")
        if style == "plain-write":
            for name in ("tls.key", "tls.crt"):
                (mount / name).write_bytes((replacement.directory / name).read_bytes())
        elif style == "atomic-rename":
            for name in ("tls.key", "tls.crt"):
                staged = mount / f".{name}.new"
                shutil.copy(replacement.directory / name, staged)
                os.replace(staged, mount / name)
        else:
            target = mount / "..2026_01_01_00_01_00.2"
            shutil.copytree(replacement.directory, target)
            staging = mount / "..data_tmp"
            staging.symlink_to(target.name)
            os.replace(staging, mount / "..data")
            shutil.rmtree(first.directory)

        assert wait_until(lambda: served_certificate(server.port) == der_of(replacement))
        kept.request("GET", "/healthz")  # the old connection keeps working
        assert kept.getresponse().status == 200
        kept.close()
        # Both workers serve the new certificate (each builds contexts on its own).
        assert all(served_certificate(server.port) == der_of(replacement) for _ in range(10))


# -- policies replaced on disk ---------------------------------------------------------------


@pytest.fixture
def reloading_server(tmp_path: Path) -> Iterator[tuple[RunningServer, Path]]:
    policies = tmp_path / "policies"
    policies.mkdir()
    shutil.copy(BUNDLED_POLICIES / "default.yaml", policies / "default.yaml")
    with running_server(
        tmp_path, "--policies", str(policies), "--policy-poll-seconds", "0.2"
    ) as server:
        yield server, policies


def applied_policy(server: RunningServer) -> str:
    status, body = server.json("POST", "/mutate", review(annotated_pod("0.5")))
    assert status == 200
    for op in decoded_patch(body["response"]):
        if op["path"] == "/metadata/annotations/gpushare.io~1applied":
            return str(json.loads(op["value"])["policy"])
    raise AssertionError(f"no applied annotation in {body}")


def reloads(server: RunningServer, result: str) -> float:
    return metric(server, f'gpushare_policy_reloads_total{{result="{result}"}}')


def test_policy_reload_good_then_bad(reloading_server: tuple[RunningServer, Path]) -> None:
    server, policies = reloading_server
    file = policies / "default.yaml"
    # Ready means one worker answers; change the files only once both have loaded them,
    # or a late worker's first load would already see the new version.
    assert wait_until(lambda: server.log().count('"message":"policies loaded"') == 2)
    assert applied_policy(server) == "default"

    file.write_text(file.read_text().replace("name: default\n", "name: renamed\n", 1))
    assert wait_until(lambda: reloads(server, "ok") == 2)  # once per worker
    assert all(applied_policy(server) == "renamed" for _ in range(6))

    file.write_text("apiVersion: gpushare.io/v1alpha1\nkind: GpuSharingPolicy\nspec: [\n")
    assert wait_until(lambda: reloads(server, "failed") == 2)
    assert all(applied_policy(server) == "renamed" for _ in range(6))  # last good serves
    status, body = server.json("GET", "/readyz")
    assert status == 200 and body["policies"]["last_reload_failed_at"] is not None
    refused = [line for line in server.log().splitlines() if "policies refused" in line]
    assert refused and "default.yaml" in refused[-1]  # the why is in the log


def test_a_restarted_worker_serves_the_last_good_policies(
    reloading_server: tuple[RunningServer, Path],
) -> None:
    """A worker that starts while the files on disk are invalid (here: the replacement of a
    SIGKILLed one) serves what its siblings serve, not 503s."""
    server, policies = reloading_server
    file = policies / "default.yaml"
    assert wait_until(lambda: server.log().count('"message":"policies loaded"') == 2)
    file.write_text(file.read_text().replace("name: default\n", "name: renamed\n", 1))
    assert wait_until(lambda: reloads(server, "ok") == 2)
    file.write_text("apiVersion: gpushare.io/v1alpha1\nkind: GpuSharingPolicy\nspec: [\n")
    assert wait_until(lambda: reloads(server, "failed") == 2)

    victim = server.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    assert wait_until(lambda: len(server.worker_pids()) == 2 and victim not in server.worker_pids())
    assert wait_until(lambda: "serving the last good policies" in server.log())
    answers = [server.json("POST", "/mutate", review(annotated_pod("0.5"))) for _ in range(40)]
    assert all(status == 200 for status, _ in answers)
    assert all(applied_policy(server) == "renamed" for _ in range(10))


# -- graceful shutdown -----------------------------------------------------------------------


def test_sigterm_lets_in_flight_requests_finish(tmp_path: Path) -> None:
    with running_server(tmp_path) as server:
        payloads = [
            json.dumps(review(annotated_pod("0.5"), uid=f"in-flight-{i}")).encode()
            for i in range(4)
        ]
        sockets = []
        for payload in payloads:
            tls = server.context().wrap_socket(
                socket.create_connection(("127.0.0.1", server.port), timeout=20),
                server_hostname="127.0.0.1",
            )
            head = (
                f"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                f"\r\nContent-Length: {len(payload)}\r\n\r\n"
            ).encode()
            tls.sendall(head + payload[: len(payload) // 2])  # the request is now in flight
            sockets.append(tls)

        server.process.send_signal(signal.SIGTERM)
        assert wait_until(lambda: "Handling signal: term" in server.log())
        for tls, payload in zip(sockets, payloads, strict=True):
            tls.sendall(payload[len(payload) // 2 :])

        for index, tls in enumerate(sockets):
            received = b""
            while b"\r\n\r\n" not in received or not received.rstrip().endswith(b"}"):
                chunk = tls.recv(65536)
                if not chunk:
                    break
                received += chunk
            tls.close()
            head, _, body = received.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), received[:200]
            assert json.loads(body)["response"]["uid"] == f"in-flight-{index}"
        assert server.process.wait(timeout=30) == 0
        # Admission lines are batched per worker; a graceful stop writes them all.
        for index in range(len(payloads)):
            assert server.log().count(f'"uid":"in-flight-{index}"') == 1, server.log()


# -- the container's entrypoint --------------------------------------------------------------


def test_gunicorn_entrypoint_with_environment_settings(tmp_path: Path) -> None:
    """What the image runs: gunicorn itself, configured by GPUSHARE_* variables only."""
    from harness.cli import clean_environment
    from webhook.server.settings import ServeSettings

    from .support import RunningServer, free_port, wait_ready

    files = write_certificates(tmp_path / "tls", ["localhost"], LOOPBACK)
    settings = ServeSettings(
        tls_cert=files.serving_cert,
        tls_key=files.serving_key,
        policies=BUNDLED_POLICIES,
        port=free_port(),
        workers=1,
    )
    environ = clean_environment()
    environ.update(settings.to_environ())
    environ["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "metrics")  # as the image sets it
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "counter_999999.db").write_bytes(b"stale")  # a previous run's
    log_path = tmp_path / "gunicorn.log"
    command = [
        sys.executable,
        "-m",
        "gunicorn",
        "--config",
        "python:webhook.server.gunicorn_conf",
        "webhook.server.wsgi:app",
    ]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command, env=environ, stdout=log_file, stderr=subprocess.STDOUT, cwd=tmp_path
        )
    server = RunningServer(process, settings.port, files.ca_cert, log_path, tmp_path)
    try:
        wait_ready(server)
        status, body = server.json("POST", "/mutate", review(annotated_pod(), uid="image"))
        assert status == 200 and body["response"]["uid"] == "image"
        assert metric(server, "gpushare_policies_loaded") == 1.0
        assert not (tmp_path / "metrics" / "counter_999999.db").exists()
    finally:
        assert server.stop() == 0


# -- connections spread over workers ----------------------------------------------------------

TCP_LISTEN, TCP_ESTABLISHED = "0A", "01"


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    return inodes


def tcp_inodes(port: int, state: str) -> set[str]:
    """Inodes of the IPv4 TCP sockets bound to local ``port`` in ``state``."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].rsplit(":", 1)[1], 16)
        if local_port == port and fields[3] == state:
            inodes.add(fields[9])
    return inodes


def test_each_worker_listens_and_serves_on_its_own(server: RunningServer) -> None:
    """Every worker has a listening socket of its own, and a burst of kept-alive connections
    is not left to one worker (with 16 connections on 2 workers, the kernel's hashing gives
    one worker all of them with probability 2**-15)."""
    workers = server.worker_pids()
    assert len(workers) >= 2
    listening = tcp_inodes(server.port, TCP_LISTEN)
    owned = [socket_inodes(pid) & listening for pid in workers]
    assert all(len(inodes) == 1 for inodes in owned) and len(set.union(*owned)) == len(workers)

    connections = [server.connection() for _ in range(16)]
    try:
        for connection in connections:
            connection.request("GET", "/healthz")
            assert connection.getresponse().read()
        established = tcp_inodes(server.port, TCP_ESTABLISHED)
        served = [len(socket_inodes(pid) & established) for pid in workers]
        assert sum(served) == len(connections) and all(served), served
    finally:
        for connection in connections:
            connection.close()
