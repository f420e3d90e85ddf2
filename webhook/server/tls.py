"""The TLS side of the listener: an SSLContext that follows the certificate files on disk.

The worker (``async_worker``) asks for a context for every accepted connection, so a
certificate replaced on disk reaches the next connection without a restart. Building one
from scratch each time would re-read and re-parse the key pair per handshake, so
``ServingCertificate`` keeps the last context and rebuilds it only when the files' identity
changes. Identity is the
(device, inode, size, mtime) of what each path resolves to, which changes for all three ways
a certificate gets replaced: a plain rewrite, an atomic rename, and a Kubernetes Secret
mount's ``..data`` symlink swap (the path's target becomes a different file).

A pair that does not load (a half-written file, a key from the new pair beside the old
certificate) never replaces a working context: the old one keeps serving and the load is
tried again when the files change or after a short back-off.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

log = logging.getLogger("gpushare.tls")

MINIMUM_TLS_VERSION = ssl.TLSVersion.TLSv1_2
# TLS 1.2 suites: forward secrecy (ECDHE) and AEAD only, as Kubernetes' own components
# recommend; TLS 1.3's three suites are all AEAD and OpenSSL fixes them. The apiserver's Go
# client offers ECDHE with AES-GCM and ChaCha20 first. docs/reliability.md lists the result.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
# A failed load is retried at most this often while the files look unchanged, in case a
# writer changed them within one mtime tick.
RETRY_FAILED_LOAD_SECONDS = 1.0

FileIdentity = tuple[int, int, int, int]


def _identity(path: Path) -> FileIdentity | None:
    try:
        status = os.stat(path)  # follows symlinks: a ``..data`` swap changes the target
    except OSError:
        return None
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


@dataclass(frozen=True)
class CertificateStatus:
    """What readiness and metrics need to know about the certificate being served."""

    loaded: bool
    not_before: dt.datetime | None
    not_after: dt.datetime | None
    subject: str | None
    error: str | None

    def valid_at(self, moment: dt.datetime) -> bool:
        if not self.loaded or self.not_before is None or self.not_after is None:
            return False
        return self.not_before <= moment < self.not_after

    def as_dict(self, moment: dt.datetime) -> dict[str, object]:
        """What /readyz shows: validity, not the subject or file errors (those are logged)."""
        return {
            "loaded": self.loaded,
            "valid": self.valid_at(moment),
            "not_after": self.not_after.isoformat() if self.not_after else None,
        }


def build_server_context(
    cert_file: Path, key_file: Path, client_ca: Path | None = None
) -> ssl.SSLContext:
    """A server context: TLS 1.2+, ``TLS12_CIPHERS``, and client certificates if asked.

    With ``client_ca`` a client certificate, when one is presented, must chain to it or the
    handshake fails. Presenting none is left to the app to refuse on the admission paths
    (``app.require_client_certificate``): the kubelet's probes of /healthz and /readyz
    present none.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_TLS_VERSION
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    context.load_cert_chain(certfile=cert_file, keyfile=key_file)
    if client_ca is not None:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_OPTIONAL
    # The apiserver speaks HTTP/1.1 to Service webhooks; gunicorn serves h1 unless h2 is
    # configured, so advertise exactly that.
    context.set_alpn_protocols(["http/1.1"])
    return context


class ServingCertificate:
    """The current SSLContext for one cert/key pair, reloaded when the files change.

    Thread-safe: the event loop asks for contexts while the readiness check, which may run
    on a worker thread, reads the status.
    """

    def __init__(self, cert_file: Path, key_file: Path, client_ca: Path | None = None) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca = client_ca
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._loaded_identity: tuple[FileIdentity | None, ...] | None = None
        self._failed_identity: tuple[FileIdentity | None, ...] | None = None
        self._failed_at = 0.0
        self._certificate: x509.Certificate | None = None
        self._error: str | None = None
        self._reloads = 0

    @property
    def reloads(self) -> int:
        """How many times a changed pair was loaded after the first load."""
        return self._reloads

    def context(self) -> ssl.SSLContext:
        """The context to wrap the next connection with; raises only if none ever loaded."""
        self.refresh()
        context = self._context
        if context is None:
            raise ssl.SSLError(f"no usable certificate in {self.cert_file}: {self._error}")
        return context

    def refresh(self) -> bool:
        """Reload the pair if the files changed; True when a new pair was loaded."""
        identity = (
            _identity(self.cert_file),
            _identity(self.key_file),
            _identity(self.client_ca) if self.client_ca else None,
        )
        if identity == self._loaded_identity:
            return False
        with self._lock:
            if identity == self._loaded_identity:
                return False
            now = time.monotonic()
            if (
                identity == self._failed_identity
                and now - self._failed_at < RETRY_FAILED_LOAD_SECONDS
            ):
                return False
            try:
                context = build_server_context(self.cert_file, self.key_file, self.client_ca)
                certificate = x509.load_pem_x509_certificate(self.cert_file.read_bytes())
            except (OSError, ssl.SSLError, ValueError) as error:
                self._failed_identity, self._failed_at = identity, now
                self._error = f"{type(error).__name__}: {error}"
                log.warning(
                    "certificate not loaded; still serving the previous one",
                    extra={"cert_file": str(self.cert_file), "error": self._error},
                )
                return False
            replaced = self._context is not None
            self._context, self._certificate = context, certificate
            self._loaded_identity, self._failed_identity, self._error = identity, None, None
            if replaced:
                self._reloads += 1
                log.info(
                    "certificate reloaded",
                    extra={
                        "cert_file": str(self.cert_file),
                        "not_after": certificate.not_valid_after_utc.isoformat(),
                    },
                )
            return True

    def status(self) -> CertificateStatus:
        self.refresh()
        certificate = self._certificate
        if certificate is None:
            return CertificateStatus(False, None, None, None, self._error)
        return CertificateStatus(
            loaded=True,
            not_before=certificate.not_valid_before_utc,
            not_after=certificate.not_valid_after_utc,
            subject=certificate.subject.rfc4514_string(),
            error=self._error,
        )


_registry_lock = threading.Lock()
_registry: dict[tuple[Path, Path, Path | None], ServingCertificate] = {}


def serving_certificate(
    cert_file: Path, key_file: Path, client_ca: Path | None = None
) -> ServingCertificate:
    """The process's one ``ServingCertificate`` for this pair.

    The worker's listener and the app's readiness check run in the same worker process but
    are wired up separately; sharing the instance means /readyz reports the certificate the
    listener actually serves.
    """
    key = (Path(cert_file), Path(key_file), Path(client_ca) if client_ca else None)
    with _registry_lock:
        found = _registry.get(key)
        if found is None:
            found = _registry[key] = ServingCertificate(*key)
        return found
