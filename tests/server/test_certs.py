"""Certificates: what the apiserver needs to trust the webhook, and safe files."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store

from webhook.install.certs import (
    CertificateError,
    CertificateFiles,
    ensure_local_certificates,
    load_certificate,
    needs_renewal,
    parse_ip_addresses,
    service_dns_names,
    write_certificates,
)

NAMES = service_dns_names("gpushare", "gpushare-system")


def written(tmp_path: Path) -> CertificateFiles:
    return write_certificates(tmp_path / "certs", NAMES, parse_ip_addresses(["127.0.0.1", "::1"]))


def test_service_names() -> None:
    assert NAMES == ["gpushare", "gpushare.gpushare-system", "gpushare.gpushare-system.svc"]


def test_serving_certificate_has_sans_and_server_auth(tmp_path: Path) -> None:
    files = written(tmp_path)
    certificate = load_certificate(files.serving_cert)
    san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == NAMES
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    eku = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    usage = certificate.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.digital_signature and not usage.value.key_cert_sign
    constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca is False
    assert isinstance(certificate.public_key(), ec.EllipticCurvePublicKey)
    assert certificate.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]


def test_ca_is_a_ca(tmp_path: Path) -> None:
    ca = load_certificate(written(tmp_path).ca_cert)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign


def test_chain_verifies_for_every_name(tmp_path: Path) -> None:
    files = written(tmp_path)
    store = Store([load_certificate(files.ca_cert)])
    leaf = load_certificate(files.serving_cert)
    for name in NAMES:
        verifier = PolicyBuilder().store(store).build_server_verifier(x509.DNSName(name))
        verifier.verify(leaf, [])
    verifier = (
        PolicyBuilder()
        .store(store)
        .build_server_verifier(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    )
    verifier.verify(leaf, [])


def test_key_files_are_private(tmp_path: Path) -> None:
    files = written(tmp_path)
    for key in (files.serving_key, files.ca_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.serving_cert.stat().st_mode) == 0o644
    assert not list(files.directory.glob(".*"))  # no temporary files left behind


def test_modes_do_not_depend_on_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        files = written(tmp_path / "new" / "certs")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(files.directory.stat().st_mode) == 0o750
    assert stat.S_IMODE(files.ca_key.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.serving_cert.stat().st_mode) == 0o644


def test_existing_ca_is_not_replaced_without_renew(tmp_path: Path) -> None:
    written(tmp_path)
    with pytest.raises(CertificateError, match="--renew"):
        written(tmp_path)


def test_renew_reuses_the_ca(tmp_path: Path) -> None:
    files = written(tmp_path)
    ca_before = files.ca_cert.read_bytes()
    leaf_before = files.serving_cert.read_bytes()
    write_certificates(files.directory, NAMES, renew=True)
    assert files.ca_cert.read_bytes() == ca_before
    assert files.serving_cert.read_bytes() != leaf_before
    verifier = (
        PolicyBuilder()
        .store(Store([load_certificate(files.ca_cert)]))
        .build_server_verifier(x509.DNSName(NAMES[-1]))
    )
    verifier.verify(load_certificate(files.serving_cert), [])


def test_renew_without_a_ca_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(CertificateError, match=r"ca\.crt"):
        write_certificates(tmp_path, NAMES, renew=True)


def test_bad_ip_is_explained() -> None:
    with pytest.raises(CertificateError, match="not an IP address"):
        parse_ip_addresses(["localhost"])


def test_local_certificates_are_reused_while_they_fit(tmp_path: Path) -> None:
    loopback = parse_ip_addresses(["127.0.0.1"])
    files = ensure_local_certificates(tmp_path, ["localhost"], loopback)
    leaf = files.serving_cert.read_bytes()
    ca = files.ca_cert.read_bytes()
    assert (
        ensure_local_certificates(tmp_path, ["localhost"], loopback).serving_cert.read_bytes()
        == leaf
    )
    # A new name needs a new serving certificate from the same CA.
    files = ensure_local_certificates(tmp_path, ["localhost", "webhook.test"], loopback)
    assert files.serving_cert.read_bytes() != leaf
    assert files.ca_cert.read_bytes() == ca


def test_near_expiry_needs_renewal(tmp_path: Path) -> None:
    files = written(tmp_path)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=340)
    assert not needs_renewal(files, NAMES, [])
    assert needs_renewal(files, NAMES, [], now=later)
