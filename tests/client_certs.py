"""A client CA and a client certificate, as an apiserver's AdmissionConfiguration would use."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.install.certs import Issued, certificate_pem, create_ca, private_key_pem


def issue_client_certificate(ca: Issued, common_name: str = "kube-apiserver") -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(key, certificate)


def write_client_pki(directory: Path, name: str = "client") -> tuple[Path, Path, Path]:
    """(CA certificate, client certificate, client key) files for a new client CA."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = create_ca(f"{name}-ca")
    client = issue_client_certificate(ca)
    ca_file, cert_file, key_file = (
        directory / f"{name}-ca.crt",
        directory / f"{name}.crt",
        directory / f"{name}.key",
    )
    ca_file.write_bytes(certificate_pem(ca.certificate))
    cert_file.write_bytes(certificate_pem(client.certificate))
    key_file.write_bytes(private_key_pem(client.key))
    key_file.chmod(0o600)
    return ca_file, cert_file, key_file
