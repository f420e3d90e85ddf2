"""``gpushare certs --in-cluster``: the webhook's TLS Secret and caBundle, kept in the cluster.

Owns what the Helm chart's certgen Jobs do (deploy/helm/gpushare/templates/certgen.yaml), the
job ingress-nginx's kube-webhook-certgen does for its webhook: create the serving certificate
as a ``kubernetes.io/tls`` Secret and write its CA into the ``caBundle`` of the webhook
configurations. Run again (every ``helm upgrade``) it is idempotent:

- a Secret whose certificate still fits (key matches, signed by its ``ca.crt``, covers the
  Service's names, CA and leaf both further than ``renew_before`` from expiry) is kept
  untouched; anything else (missing, foreign, damaged, near expiry) is replaced by a new CA
  and serving certificate;
- a configuration whose every webhook already trusts the Secret's CA is left alone; else its
  ``caBundle`` becomes the current CA, and right after a renewal the current CA followed by
  the previous one (while still valid), so replicas still serving the old certificate until
  the kubelet refreshes the mounted Secret (about a minute) are trusted meanwhile.

The CA key is never stored: a renewal makes a new CA, which is why the previous CA rides
along in caBundle. Every write is guarded (Secret by resourceVersion on update; caBundle by
a JSON-patch ``test`` of the resourceVersion), and a conflict re-reads and decides again, at
most ``MAX_ATTEMPTS`` times. Every API call has a timeout. The pure part (``secret_verdict``,
``bundle_after``, ``ca_bundle_patch``) takes no I/O; ``ClusterCertificates`` is the edge.
RBAC it needs: get/update on the one Secret, create on Secrets, get/patch on the two
configurations of one name (the chart's Role and ClusterRole).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from webhook.install.certs import (
    CA_CERT_FILE,
    SERVING_CERT_FILE,
    SERVING_KEY_FILE,
    CertificateError,
    Issued,
    certificate_names,
    certificate_pem,
    create_ca,
    issue_serving_certificate,
    private_key_pem,
)

SECRET_TYPE = "kubernetes.io/tls"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpushare-certs"}
JSON_PATCH = "application/json-patch+json"
# Conflicts (another writer between our read and our write) re-read and decide again.
MAX_ATTEMPTS = 3
# Seconds for connecting and for each response: the Job's activeDeadlineSeconds bounds the rest.
REQUEST_TIMEOUT = (5.0, 15.0)
# A Secret or caBundle larger than this is not one we wrote: treat it as foreign, never parse it.
MAX_PEM_BYTES = 64 * 1024
# (kind, read method, patch method) of the configurations whose caBundle is ours.
CONFIGURATION_KINDS = (
    (
        "MutatingWebhookConfiguration",
        "read_mutating_webhook_configuration",
        "patch_mutating_webhook_configuration",
    ),
    (
        "ValidatingWebhookConfiguration",
        "read_validating_webhook_configuration",
        "patch_validating_webhook_configuration",
    ),
)


class ClusterCertificateError(CertificateError):
    """The Secret or a configuration cannot be read or written; the message says which."""


@dataclass(frozen=True)
class CertSettings:
    """What to keep: the Secret of the Service's certificate and the configurations' name."""

    namespace: str
    service: str
    secret_name: str
    dns_names: tuple[str, ...]
    webhook_configuration: str | None = None
    valid_days: int = 365
    renew_before: dt.timedelta = dt.timedelta(days=30)
    # Before install the configurations do not exist yet: skip them instead of failing.
    missing_ok: bool = False


@dataclass(frozen=True)
class Verdict:
    """Keep the Secret, or issue a new one, and why (one line for the Job's log)."""

    keep: bool
    reason: str


@dataclass
class Outcome:
    """What one run did, line by line."""

    lines: list[str] = field(default_factory=list)


def _load_pem_certificates(data: bytes) -> list[x509.Certificate]:
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
        ca = _load_pem_certificates(data[CA_CERT_FILE])[0]
        leaf = _load_pem_certificates(data[SERVING_CERT_FILE])[0]
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
        return ca in _load_pem_certificates(base64.b64decode(ca_bundle_b64, validate=True))
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


def _decode_secret(secret: Any) -> dict[str, bytes]:
    decoded: dict[str, bytes] = {}
    for key, value in (secret.data or {}).items():
        try:
            decoded[key] = base64.b64decode(value or "", validate=True)
        except (ValueError, binascii.Error):
            decoded[key] = b""
    return decoded


def _first_ca(data: Mapping[str, bytes] | None) -> x509.Certificate | None:
    try:
        return _load_pem_certificates((data or {}).get(CA_CERT_FILE, b""))[0]
    except (ValueError, IndexError):
        return None


def connect(kubeconfig: Path | None) -> k8s.ApiClient:
    """In-cluster config (the Job's ServiceAccount) unless a kubeconfig is given."""
    try:
        if kubeconfig is not None:
            return k8s_config.new_client_from_config(  # type: ignore[no-any-return,no-untyped-call]
                config_file=str(kubeconfig), persist_config=False
            )
        configuration = k8s.Configuration()
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return k8s.ApiClient(configuration)
    except (ConfigException, OSError) as error:
        raise ClusterCertificateError(
            f"Cannot reach the Kubernetes API: {error}. --in-cluster runs in a pod with a "
            "ServiceAccount token, or pass --kubeconfig."
        ) from None


@dataclass
class ClusterCertificates:
    """The edge: reads and writes the Secret and the configurations through the API."""

    api: k8s.ApiClient
    settings: CertSettings
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)

    def run(self) -> Outcome:
        outcome = Outcome()
        current, previous, renewed = self._ensure_secret(outcome)
        if self.settings.webhook_configuration:
            bundle = bundle_after(current, previous if renewed else None, self.now())
            self._patch_configurations(outcome, bundle, current, force=renewed)
        return outcome

    # -- the Secret -----------------------------------------------------------------------

    def _ensure_secret(
        self, outcome: Outcome
    ) -> tuple[x509.Certificate, x509.Certificate | None, bool]:
        """(current CA, previous CA, renewed?) after keeping or writing the Secret."""
        core = k8s.CoreV1Api(self.api)
        settings = self.settings
        where = f"Secret {settings.namespace}/{settings.secret_name}"
        for _ in range(MAX_ATTEMPTS):
            secret = self._call(
                f"read {where}",
                lambda: core.read_namespaced_secret(
                    settings.secret_name, settings.namespace, _request_timeout=REQUEST_TIMEOUT
                ),
                missing_ok=True,
            )
            data = _decode_secret(secret) if secret is not None else None
            verdict = secret_verdict(data, settings.dns_names, self.now(), settings.renew_before)
            if verdict.keep:
                kept_ca = _first_ca(data)
                assert kept_ca is not None  # secret_verdict parsed it
                outcome.lines.append(f"kept {where}: {verdict.reason}")
                return kept_ca, None, False
            ca, serving = new_certificates(settings.dns_names, settings.valid_days)
            body = self._secret_body(ca, serving, secret)
            try:
                if secret is None:
                    core.create_namespaced_secret(
                        settings.namespace, body, _request_timeout=REQUEST_TIMEOUT
                    )
                else:
                    core.replace_namespaced_secret(
                        settings.secret_name,
                        settings.namespace,
                        body,
                        _request_timeout=REQUEST_TIMEOUT,
                    )
            except ApiException as error:
                if error.status == 409:  # created or changed meanwhile: look again
                    continue
                raise self._api_error(f"write {where}", error) from None
            except HTTPError as error:
                raise ClusterCertificateError(f"Cannot write {where}: {error}.") from None
            action = "created" if secret is None else "renewed"
            expires = serving.certificate.not_valid_after_utc
            outcome.lines.append(
                f"{action} {where} ({verdict.reason}); valid until {expires:%Y-%m-%d}"
            )
            return ca.certificate, _first_ca(data), True
        raise ClusterCertificateError(
            f"{where} kept changing under us ({MAX_ATTEMPTS} attempts); is another certgen "
            "Job running? Run it again once that one has finished."
        )

    def _secret_body(self, ca: Issued, serving: Issued, existing: Any) -> k8s.V1Secret:
        metadata = k8s.V1ObjectMeta(
            name=self.settings.secret_name,
            namespace=self.settings.namespace,
            labels={**((existing.metadata.labels or {}) if existing else {}), **MANAGED_BY},
            annotations=(existing.metadata.annotations if existing else None),
            resource_version=(existing.metadata.resource_version if existing else None),
        )
        data = {
            CA_CERT_FILE: certificate_pem(ca.certificate),
            SERVING_CERT_FILE: certificate_pem(serving.certificate),
            SERVING_KEY_FILE: private_key_pem(serving.key),
        }
        return k8s.V1Secret(
            metadata=metadata,
            type=SECRET_TYPE,
            data={key: base64.b64encode(value).decode("ascii") for key, value in data.items()},
        )

    # -- the configurations ---------------------------------------------------------------

    def _patch_configurations(
        self, outcome: Outcome, bundle: bytes, ca: x509.Certificate, *, force: bool
    ) -> None:
        admission = k8s.AdmissionregistrationV1Api(self.api)
        name = self.settings.webhook_configuration
        assert name is not None
        found = 0
        for kind, read_name, patch_name in CONFIGURATION_KINDS:
            read = getattr(admission, read_name)
            patch = getattr(admission, patch_name)

            def read_document(read: Any = read) -> Any:
                stored = read(name, _request_timeout=REQUEST_TIMEOUT)
                return self.api.sanitize_for_serialization(stored)  # type: ignore[no-untyped-call]

            for _ in range(MAX_ATTEMPTS):
                document = self._call(f"read {kind} {name}", read_document, missing_ok=True)
                if document is None:
                    outcome.lines.append(f"no {kind} {name} yet")
                    break
                operations = ca_bundle_patch(document, bundle, ca, force=force)
                if not operations:
                    found += 1
                    outcome.lines.append(f"{kind} {name} already trusts the CA")
                    break
                try:
                    patch(
                        name,
                        operations,
                        _content_type=JSON_PATCH,
                        _request_timeout=REQUEST_TIMEOUT,
                    )
                except ApiException as error:
                    # A failed `test` (changed since read) is 422; a stale write 409.
                    if error.status in (409, 422):
                        continue
                    raise self._api_error(f"patch {kind} {name}", error) from None
                except HTTPError as error:
                    raise ClusterCertificateError(f"Cannot patch {kind} {name}: {error}.") from None
                found += 1
                outcome.lines.append(f"patched caBundle of {kind} {name}")
                break
            else:
                raise ClusterCertificateError(
                    f"{kind} {name} kept changing under us ({MAX_ATTEMPTS} attempts); run again."
                )
        if not found and not self.settings.missing_ok:
            raise ClusterCertificateError(
                f"No MutatingWebhookConfiguration or ValidatingWebhookConfiguration named {name}:"
                " install the chart's configurations first, or pass --missing-ok."
            )

    # -- API errors -----------------------------------------------------------------------

    def _call(self, what: str, call: Callable[[], Any], *, missing_ok: bool) -> Any:
        try:
            return call()
        except ApiException as error:
            if error.status == 404 and missing_ok:
                return None
            raise self._api_error(what, error) from None
        except HTTPError as error:
            raise ClusterCertificateError(f"Cannot {what}: {error}.") from None

    def _api_error(self, what: str, error: ApiException) -> ClusterCertificateError:
        hint = ""
        if error.status == 403:
            hint = (
                " The ServiceAccount lacks the RBAC the chart's certgen Role and ClusterRole "
                "grant (get/update/create on the Secret, get/patch on the configurations)."
            )
        reason = (error.reason or "").strip()
        return ClusterCertificateError(f"Cannot {what}: HTTP {error.status} {reason}.{hint}")
