"""Certificates for the webhook's TLS listener: a private CA and the serving certificate it signs.

Owns key and certificate generation (ECDSA P-256 via ``cryptography``), the file layout a
Kubernetes TLS Secret expects (``ca.crt``, ``tls.crt``, ``tls.key``; the CA key stays in
``ca.key`` beside them and must not go into the Secret), restrictive file modes, and reading a
certificate back (expiry, names) for readiness checks and renewal decisions.

The kube-apiserver verifies a webhook's certificate with Go's ``crypto/x509``: only SANs count
(the subject CN is ignored), and the leaf needs the serverAuth extended key usage.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.errors import GpushareError

CA_CERT_FILE = "ca.crt"
CA_KEY_FILE = "ca.key"
SERVING_CERT_FILE = "tls.crt"
SERVING_KEY_FILE = "tls.key"

CA_VALID_DAYS = 3650
SERVING_VALID_DAYS = 365
# Renew a local serving certificate this long before it expires (cert-manager's default
# renewBefore is a third of the lifetime; a month is plenty for a one-year certificate).
RENEW_BEFORE = dt.timedelta(days=30)
# Backdate notBefore a little so a peer whose clock lags ours still accepts a fresh cert.
CLOCK_SKEW_ALLOWANCE = dt.timedelta(minutes=5)

KEY_FILE_MODE = 0o600
CERT_FILE_MODE = 0o644

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class CertificateError(GpushareError):
    """Certificates cannot be created or read; the message says which file and what to do."""


@dataclass(frozen=True)
class CertificateFiles:
    """Where one set of CA + serving certificate lives on disk."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / CA_CERT_FILE

    @property
    def ca_key(self) -> Path:
        return self.directory / CA_KEY_FILE

    @property
    def serving_cert(self) -> Path:
        return self.directory / SERVING_CERT_FILE

    @property
    def serving_key(self) -> Path:
        return self.directory / SERVING_KEY_FILE


@dataclass(frozen=True)
class Issued:
    """A private key and the certificate for it."""

    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names the apiserver may use for ``service.namespace``: S, S.N and S.N.svc."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc"]


def parse_ip_addresses(values: Iterable[str]) -> list[IPAddress]:
    addresses: list[IPAddress] = []
    for value in values:
        try:
            addresses.append(ipaddress.ip_address(value))
        except ValueError:
            raise CertificateError(
                f"{value!r} is not an IP address; pass --ip with an IPv4 or IPv6 address "
                "such as 127.0.0.1."
            ) from None
    return addresses


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def create_ca(common_name: str = "gpushare-webhook-ca", valid_days: int = CA_VALID_DAYS) -> Issued:
    """A self-signed CA that may sign leaf certificates only (pathLen 0)."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    public_key = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW_ALLOWANCE)
        .not_valid_after(now + dt.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(key, certificate)


def issue_serving_certificate(
    ca: Issued,
    dns_names: Sequence[str],
    ip_addresses: Sequence[IPAddress] = (),
    valid_days: int = SERVING_VALID_DAYS,
) -> Issued:
    """A TLS server certificate for ``dns_names`` and ``ip_addresses``, signed by ``ca``."""
    if not dns_names and not ip_addresses:
        raise CertificateError("A serving certificate needs at least one DNS name or IP address.")
    key = _new_key()
    common_name = dns_names[-1] if dns_names else str(ip_addresses[0])
    now = _now()
    not_after = min(now + dt.timedelta(days=valid_days), ca.certificate.not_valid_after_utc)
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(address) for address in ip_addresses]
    ca_ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW_ALLOWANCE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski.value),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(key, certificate)


def certificate_pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


# Owner writes, group reads; nobody else: the directory holds private keys.
CERTIFICATE_DIRECTORY_MODE = 0o750


def write_file_atomically(path: Path, content: bytes, mode: int) -> None:
    """Replace ``path`` with ``content`` in one rename, created with ``mode`` from the start.

    A reader (our own TLS reloader, or a person) never sees a half-written file, and a key
    is never readable by others, not even between creation and a later chmod.
    """
    try:
        path.parent.mkdir(parents=True)
    except FileExistsError:
        pass  # an existing directory keeps the mode its owner gave it
    else:
        # Not writable by others whatever the umask: whoever can write here can swap the key.
        path.parent.chmod(CERTIFICATE_DIRECTORY_MODE)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(descriptor, mode)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load_certificate(path: Path) -> x509.Certificate:
    """The first certificate in the PEM file at ``path``."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise CertificateError(f"Cannot read certificate {path}: {error.strerror}.") from None
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        raise CertificateError(f"{path} does not hold a PEM certificate.") from None


def load_ca(files: CertificateFiles) -> Issued:
    """The CA in ``files``, key included, as written by ``write_certificates``."""
    certificate = load_certificate(files.ca_cert)
    try:
        key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
    except OSError as error:
        raise CertificateError(
            f"Cannot read the CA key {files.ca_key}: {error.strerror}. --renew needs the ca.key "
            "written next to ca.crt when the CA was created."
        ) from None
    except ValueError:
        raise CertificateError(f"{files.ca_key} does not hold an unencrypted PEM key.") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertificateError(f"{files.ca_key} is not an ECDSA key; gpushare creates P-256 CAs.")
    if key.public_key() != certificate.public_key():
        raise CertificateError(f"{files.ca_key} is not the key of {files.ca_cert}.")
    return Issued(key, certificate)


def write_ca(files: CertificateFiles, ca: Issued) -> None:
    write_file_atomically(files.ca_key, private_key_pem(ca.key), KEY_FILE_MODE)
    write_file_atomically(files.ca_cert, certificate_pem(ca.certificate), CERT_FILE_MODE)


def write_serving(files: CertificateFiles, serving: Issued) -> None:
    # Key first: a TLS reloader that sees the new key with the old certificate fails to
    # load the pair and keeps the old one until the certificate lands a moment later.
    write_file_atomically(files.serving_key, private_key_pem(serving.key), KEY_FILE_MODE)
    write_file_atomically(files.serving_cert, certificate_pem(serving.certificate), CERT_FILE_MODE)


def write_certificates(
    out: Path,
    dns_names: Sequence[str],
    ip_addresses: Sequence[IPAddress] = (),
    *,
    renew: bool = False,
    valid_days: int = SERVING_VALID_DAYS,
) -> CertificateFiles:
    """Create a CA (or reuse it with ``renew``) and a serving certificate in ``out``.

    Refuses to replace an existing CA without ``renew``: a new CA invalidates every
    caBundle that trusts the old one.
    """
    files = CertificateFiles(out)
    if renew:
        ca = load_ca(files)
    else:
        if files.ca_cert.exists() or files.ca_key.exists():
            raise CertificateError(
                f"{out} already holds a CA. Pass --renew to issue a new serving certificate "
                "from it, or choose an empty --out directory for a new CA."
            )
        ca = create_ca()
        write_ca(files, ca)
    write_serving(files, issue_serving_certificate(ca, dns_names, ip_addresses, valid_days))
    return files


def certificate_names(certificate: x509.Certificate) -> tuple[set[str], set[IPAddress]]:
    """The DNS names and IP addresses a certificate's SAN extension covers."""
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    addresses = {
        value
        for value in san.get_values_for_type(x509.IPAddress)
        if isinstance(value, ipaddress.IPv4Address | ipaddress.IPv6Address)
    }
    return set(san.get_values_for_type(x509.DNSName)), addresses


def needs_renewal(
    files: CertificateFiles,
    dns_names: Iterable[str],
    ip_addresses: Iterable[IPAddress],
    now: dt.datetime | None = None,
) -> bool:
    """Whether the serving certificate is missing, close to expiry or lacks one of the names."""
    if not files.serving_cert.exists() or not files.serving_key.exists():
        return True
    try:
        certificate = load_certificate(files.serving_cert)
    except CertificateError:
        return True
    moment = now or _now()
    if certificate.not_valid_after_utc - RENEW_BEFORE <= moment:
        return True
    covered_names, covered_ips = certificate_names(certificate)
    return not (set(dns_names) <= covered_names and set(ip_addresses) <= covered_ips)


def ensure_local_certificates(
    directory: Path, dns_names: Sequence[str], ip_addresses: Sequence[IPAddress]
) -> CertificateFiles:
    """Certificates for running the webhook locally: reuse what is there while it still fits.

    The CA is kept across runs so a caBundle already given to an apiserver stays valid; the
    serving certificate is reissued when it is missing, near expiry or lacks a needed name.
    """
    files = CertificateFiles(directory)
    if not (files.ca_cert.exists() and files.ca_key.exists()):
        write_ca(files, create_ca("gpushare-local-ca"))
        write_serving(files, issue_serving_certificate(load_ca(files), dns_names, ip_addresses))
    elif needs_renewal(files, dns_names, ip_addresses):
        write_serving(files, issue_serving_certificate(load_ca(files), dns_names, ip_addresses))
    return files
