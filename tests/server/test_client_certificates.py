"""TLS as the apiserver meets it: the accepted suites, and optional client certificates."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.client_certs import write_client_pki
from webhook.install.certs import write_certificates
from webhook.server.tls import build_server_context

from .support import RunningServer, annotated_pod, review, running_server

pytestmark = pytest.mark.server

# What docs/reliability.md lists; the test below fails when the server's list changes.
ACCEPTED_TLS12_SUITES = {
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
}
TLS13_SUITES = {"TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256", "TLS_AES_128_GCM_SHA256"}


@pytest.fixture(scope="module")
def client_pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return write_client_pki(tmp_path_factory.mktemp("client-pki"))


@pytest.fixture(scope="module")
def guarded(
    tmp_path_factory: pytest.TempPathFactory, client_pki: tuple[Path, Path, Path]
) -> Iterator[RunningServer]:
    ca_file, _, _ = client_pki
    with running_server(tmp_path_factory.mktemp("guarded"), "--client-ca", str(ca_file)) as server:
        yield server


def test_the_server_offers_exactly_the_listed_suites(server_files: tuple[Path, Path]) -> None:
    context = build_server_context(*server_files)
    offered = {cipher["name"] for cipher in context.get_ciphers()}
    assert offered == ACCEPTED_TLS12_SUITES | TLS13_SUITES


@pytest.fixture
def server_files(tmp_path: Path) -> tuple[Path, Path]:
    files = write_certificates(tmp_path / "certs", ["localhost"])
    return files.serving_cert, files.serving_key


def _handshake(server: RunningServer, ciphers: str) -> bool:
    context = server.context()
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(ciphers)
    try:
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            return True
    except ssl.SSLError:
        return False


def test_suites_without_forward_secrecy_or_aead_are_refused(guarded: RunningServer) -> None:
    for weak in ("AES128-GCM-SHA256", "ECDHE-ECDSA-AES128-SHA", "ECDHE-RSA-AES256-SHA384"):
        assert not _handshake(guarded, weak), weak
    assert _handshake(guarded, "ECDHE-ECDSA-AES128-GCM-SHA256")


def _post_mutate(server: RunningServer, context: ssl.SSLContext) -> tuple[int, Any]:
    connection = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    try:
        body = json.dumps(review(annotated_pod())).encode()
        connection.request("POST", "/mutate", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_admission_needs_a_certificate_from_the_client_ca(
    guarded: RunningServer, client_pki: tuple[Path, Path, Path]
) -> None:
    _, cert_file, key_file = client_pki
    with_certificate = guarded.context()
    with_certificate.load_cert_chain(cert_file, key_file)
    status, answer = _post_mutate(guarded, with_certificate)
    assert status == 200 and answer["response"]["allowed"] is True

    status, answer = _post_mutate(guarded, guarded.context())
    assert status == 200  # a denial the apiserver shows, with the uid echoed
    assert answer["response"]["allowed"] is False
    assert answer["response"]["uid"] == review(annotated_pod())["request"]["uid"]
    assert answer["response"]["status"]["code"] == 403
    message = answer["response"]["status"]["message"]
    assert "client certificate" in message and "--client-ca" in message


def test_a_certificate_from_another_ca_fails_the_handshake(
    guarded: RunningServer, tmp_path: Path
) -> None:
    _, cert_file, key_file = write_client_pki(tmp_path, "stranger")
    context = guarded.context()
    context.load_cert_chain(cert_file, key_file)
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        _post_mutate(guarded, context)


def test_probes_need_no_client_certificate(guarded: RunningServer) -> None:
    assert guarded.request("GET", "/healthz")[0] == 200
    assert guarded.request("GET", "/readyz")[0] == 200
