"""The pure half of ``gpushare certs --in-cluster`` (cluster_certs.py is the API half).

Owns the decisions, on bytes already read: whether a TLS Secret's certificate can stay
(``secret_verdict``), what caBundle to write after keeping or renewing it (``bundle_after``),
whether a configuration already trusts a CA (``trusts``), and the JSON patch that writes
the bundle, guarded by the resourceVersion read (``ca_bundle_patch``). Every PEM input is
bounded (``MAX_PEM_BYTES``): a larger Secret or caBundle is not one gpushare wrote.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from webhook.install.certs import (
    CA_CERT_FILE,
    SERVING_CERT_FILE,
    SERVING_KEY_FILE,
    Issued,
    certificate_names,
    certificate_pem,
    create_ca,
    issue_serving_certificate,
)

# A Secret or caBundle larger than this is not one we wrote: treat it as foreign, never parse it.
MAX_PEM_BYTES = 64 * 1024


@dataclass(frozen=True)
class Verdict:
    """Keep the Secret, or issue a new one, and why (one line for the Job's log)."""

    keep: bool
    reason: str


def load_pem_certificates(data: bytes) -> list[x509.Certificate]:
    if len(data) > MAX_PEM_BYTES:
        raise ValueError(f"{len(data)} bytes, more than {MAX_PEM_BYTES}")
    return x509.load_pem_x509_certificates(data)


def secret_verdict(
    data: Mapping[str, bytes] | None,
    dns_names: Sequence[str],
    now: dt.datetime,
    renew_before: dt.timedelta,
) -> Verdict:
    """Whether the Secret's certificate can stay (pure: the decoded Secret data in)."""
    if data is None:
        return Verdict(False, "no Secret yet")
    missing = [
        key for key in (CA_CERT_FILE, SERVING_CERT_FILE, SERVING_KEY_FILE) if not data.get(key)
    ]
    if missing:
        return Verdict(False, f"the Secret lacks {', '.join(missing)}")
    try:
        ca = load_pem_certificates(data[CA_CERT_FILE])[0]
        leaf = load_pem_certificates(data[SERVING_CERT_FILE])[0]
        if len(data[SERVING_KEY_FILE]) > MAX_PEM_BYTES:
            raise ValueError("key too large")
        key = serialization.load_pem_private_key(data[SERVING_KEY_FILE], password=None)
    except (ValueError, TypeError, IndexError) as error:
        return Verdict(False, f"the Secret holds no usable PEM certificate and key ({error})")
    if key.public_key() != leaf.public_key():
        return Verdict(False, "tls.key is not the key of tls.crt")
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return Verdict(False, "tls.crt is not signed by ca.crt")
    covered, _ = certificate_names(leaf)
    lacking = [name for name in dns_names if name not in covered]
    if lacking:
        return Verdict(False, f"tls.crt does not cover {', '.join(lacking)}")
    for label, certificate in (("tls.crt", leaf), ("ca.crt", ca)):
        expires = certificate.not_valid_after_utc
        if expires - renew_before <= now:
            return Verdict(False, f"{label} expires {expires:%Y-%m-%d}, within the renewal window")
    return Verdict(True, f"valid until {leaf.not_valid_after_utc:%Y-%m-%d}")


def bundle_after(
    current_ca: x509.Certificate, previous_ca: x509.Certificate | None, now: dt.datetime
) -> bytes:
    """The caBundle to write: the current CA, then a still-valid previous one (rotation)."""
    bundle = certificate_pem(current_ca)
    if (
        previous_ca is not None
        and previous_ca != current_ca
        and previous_ca.not_valid_after_utc > now
    ):
        bundle += certificate_pem(previous_ca)
    return bundle


def trusts(ca_bundle_b64: str | None, ca: x509.Certificate) -> bool:
    """Whether a configuration's base64 caBundle holds ``ca``."""
    if not ca_bundle_b64:
        return False
    try:
        return ca in load_pem_certificates(base64.b64decode(ca_bundle_b64, validate=True))
    except (ValueError, binascii.Error):
        return False


def ca_bundle_patch(
    configuration: Mapping[str, Any], bundle: bytes, ca: x509.Certificate, *, force: bool
) -> list[dict[str, Any]]:
    """The JSON patch that writes ``bundle`` into every webhook's clientConfig, guarded by
    the resourceVersion read; empty when every webhook already trusts ``ca`` (unless
    ``force``, after a renewal, when the previous CA must ride along)."""
    webhooks = configuration.get("webhooks") or []
    if not force and all(trusts(w.get("clientConfig", {}).get("caBundle"), ca) for w in webhooks):
        return []
    encoded = base64.b64encode(bundle).decode("ascii")
    operations: list[dict[str, Any]] = [
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": configuration["metadata"]["resourceVersion"],
        }
    ]
    for index, webhook in enumerate(webhooks):
        operations.append(
            {"op": "test", "path": f"/webhooks/{index}/name", "value": webhook["name"]}
        )
        operations.append(
            {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded}
        )
    return operations


def new_certificates(dns_names: Sequence[str], valid_days: int) -> tuple[Issued, Issued]:
    ca = create_ca("gpushare-webhook-ca")
    return ca, issue_serving_certificate(ca, dns_names, (), valid_days)


def decode_secret(secret: Any) -> dict[str, bytes]:
    decoded: dict[str, bytes] = {}
    for key, value in (secret.data or {}).items():
        try:
            decoded[key] = base64.b64decode(value or "", validate=True)
        except (ValueError, binascii.Error):
            decoded[key] = b""
    return decoded


def first_ca(data: Mapping[str, bytes] | None) -> x509.Certificate | None:
    try:
        return load_pem_certificates((data or {}).get(CA_CERT_FILE, b""))[0]
    except (ValueError, IndexError):
        return None
