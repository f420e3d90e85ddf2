"""The control plane's PKI: a CA, the apiserver's serving certificate, an admin client
certificate and a service-account signing key, written as PEM files.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from harness.processes import LOOPBACK
from webhook.install.certs import (
    Issued,
    certificate_pem,
    create_ca,
    issue_serving_certificate,
    private_key_pem,
)


@dataclass(frozen=True)
class Pki:
    """File paths of the control plane's keys and certificates (all PEM)."""

    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    service_account_key: Path


def _write_pem(path: Path, data: bytes) -> Path:
    # Keys are secrets even in tests; 0600 also keeps etcd/apiserver from warning.
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _admin_client_certificate(ca: Issued) -> Issued:
    """CN=admin, O=system:masters (bound to cluster-admin by the bootstrap RBAC policy).

    The only certificate kind webhook.install.certs has no reason to issue: a TLS *client* cert.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "admin"),
        ]
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # Backdated a little so a clock step between processes cannot make it "not yet valid".
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(key, certificate)


def generate_pki(directory: Path) -> Pki:
    """Create a CA, an apiserver serving cert, an admin client cert and a service-account key.

    CA and serving certificate come from webhook.install.certs, the code `gpushare certs` runs.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca = create_ca("gpushare-e2e-ca", valid_days=1)
    serving = issue_serving_certificate(
        ca,
        # localhost, plus the in-cluster names for clients that resolve `kubernetes`.
        ["localhost", "kubernetes", "kubernetes.default.svc"],
        [ipaddress.ip_address(LOOPBACK), ipaddress.ip_address("10.0.0.1")],
        valid_days=1,
    )
    admin = _admin_client_certificate(ca)
    # The apiserver signs service-account tokens with RS256 by default.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    return Pki(
        ca_cert=_write_pem(directory / "ca.crt", certificate_pem(ca.certificate)),
        serving_cert=_write_pem(directory / "apiserver.crt", certificate_pem(serving.certificate)),
        serving_key=_write_pem(directory / "apiserver.key", private_key_pem(serving.key)),
        admin_cert=_write_pem(directory / "admin.crt", certificate_pem(admin.certificate)),
        admin_key=_write_pem(directory / "admin.key", private_key_pem(admin.key)),
        service_account_key=_write_pem(directory / "sa.key", _key_pem(sa_key)),
    )
