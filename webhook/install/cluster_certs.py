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
most ``MAX_ATTEMPTS`` times. Every API call has a timeout. The decisions (no I/O) are in
cluster_cert_checks.py; ``ClusterCertificates`` here is the edge.
RBAC it needs: get/update on the one Secret, create on Secrets, get/patch on the two
configurations of one name (the chart's Role and ClusterRole). With ``renew_only`` (the
renewal CronJob, which runs the same decisions on a schedule so that a release nobody
upgrades renews too) it never creates the Secret, and needs no ``create``.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
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
    certificate_pem,
    private_key_pem,
)
from webhook.install.cluster_cert_checks import (
    bundle_after,
    ca_bundle_patch,
    decode_secret,
    first_ca,
    new_certificates,
    secret_verdict,
)

SECRET_TYPE = "kubernetes.io/tls"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpushare-certs"}
# The field manager of every write: what a later `kubectl apply --server-side` of other values
# for the Secret's data or caBundle names as the conflicting manager.
FIELD_MANAGER = "gpushare-certs"
JSON_PATCH = "application/json-patch+json"
# Conflicts (another writer between our read and our write) re-read and decide again.
MAX_ATTEMPTS = 3
# Seconds for connecting and for each response: the Job's activeDeadlineSeconds bounds the rest.
REQUEST_TIMEOUT = (5.0, 15.0)
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
    # The renewal CronJob: renew the Secret that install made, never create one (its RBAC
    # has no `create` on Secrets; a missing Secret is an error naming who makes it).
    renew_only: bool = False


@dataclass
class Outcome:
    """What one run did, line by line."""

    lines: list[str] = field(default_factory=list)


def connect_to_cluster(kubeconfig: Path | None) -> k8s.ApiClient:
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
            if secret is None and settings.renew_only:
                raise ClusterCertificateError(
                    f"No {where} to renew: --renew-only (the renewal CronJob) never creates "
                    "it. The chart's certgen hook Job creates it at `helm install` and "
                    "`helm upgrade`; deploy/overlays/gpushare-certs applies it from "
                    "`gpushare certs`."
                )
            data = decode_secret(secret) if secret is not None else None
            verdict = secret_verdict(data, settings.dns_names, self.now(), settings.renew_before)
            if verdict.keep:
                kept_ca = first_ca(data)
                assert kept_ca is not None  # secret_verdict parsed it
                outcome.lines.append(f"kept {where}: {verdict.reason}")
                return kept_ca, None, False
            ca, serving = new_certificates(settings.dns_names, settings.valid_days)
            body = self._secret_body(ca, serving, secret)
            if not self._write_secret(core, body, secret, where):
                continue  # created or changed meanwhile: look again
            action = "created" if secret is None else "renewed"
            expires = serving.certificate.not_valid_after_utc
            outcome.lines.append(
                f"{action} {where} ({verdict.reason}); valid until {expires:%Y-%m-%d}"
            )
            return ca.certificate, first_ca(data), True
        raise ClusterCertificateError(
            f"{where} kept changing under us ({MAX_ATTEMPTS} attempts); is another certgen "
            "Job running? Run it again once that one has finished."
        )

    def _write_secret(
        self, core: k8s.CoreV1Api, body: k8s.V1Secret, existing: Any, where: str
    ) -> bool:
        """Create the Secret, or replace ``existing`` (the one read); False when another
        writer came first (409)."""
        settings = self.settings
        try:
            if existing is None:
                core.create_namespaced_secret(
                    settings.namespace,
                    body,
                    field_manager=FIELD_MANAGER,
                    _request_timeout=REQUEST_TIMEOUT,
                )
            else:
                core.replace_namespaced_secret(
                    settings.secret_name,
                    settings.namespace,
                    body,
                    field_manager=FIELD_MANAGER,
                    _request_timeout=REQUEST_TIMEOUT,
                )
        except ApiException as error:
            if error.status == 409:
                return False
            raise self._api_error(f"write {where}", error) from None
        except HTTPError as error:
            raise ClusterCertificateError(f"Cannot write {where}: {error}.") from None
        return True

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
                        field_manager=FIELD_MANAGER,
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
