"""Install tools: the serving certificate and the webhook configurations that register gpushare
with the apiserver, the quota objects the policies declare, and the check after an install
that the apiserver reaches the webhook (``check-admission``). They read no pods and make no
admission decision.

This is the package's face: other packages import only the names below. Layout:
docs/architecture.md. The names that talk to the cluster need the Kubernetes client, an
optional extra (``gpushare[cluster]``): they are imported when first asked for (PEP 562,
``_NEED_THE_CLIENT``), so the rest of the package works without it.
"""

from typing import TYPE_CHECKING

from webhook.install.admission import admission_configurations
from webhook.install.admission_check import (
    CHECK_IMAGE,
    DEFAULT_CHECK_NAMESPACE,
    DEFAULT_CHECK_TIMEOUT_SECONDS,
    AdmissionCheck,
    CheckResult,
    run_check,
)
from webhook.install.certs import (
    CertificateError,
    CertificateFiles,
    IPAddress,
    certificate_names,
    ensure_local_certificates,
    load_certificate,
    parse_ip_addresses,
    service_dns_names,
    write_certificates,
)
from webhook.install.declared_quotas import quota_objects
from webhook.install.template_webhooks import webhook_entries
from webhook.install.validating_policy import DEFAULT_VALIDATION_ACTIONS, VALIDATION_ACTIONS
from webhook.install.webhook_config import (
    DEFAULT_SHARED_RESOURCES,
    DEFAULT_TIMEOUT_SECONDS,
    FAILURE_POLICIES,
    VALIDATING_WEBHOOK_CHOICES,
    ServiceTarget,
    UrlTarget,
    WebhookSettings,
    render_yaml,
)

if TYPE_CHECKING:
    from webhook.install.cluster_certs import (
        CertSettings,
        ClusterCertificates,
        connect_to_cluster,
    )

# Name -> the module that defines it, imported (with the Kubernetes client) when first asked.
_NEED_THE_CLIENT = {
    "CertSettings": "webhook.install.cluster_certs",
    "ClusterCertificates": "webhook.install.cluster_certs",
    "connect_to_cluster": "webhook.install.cluster_certs",
}

__all__ = [
    "CHECK_IMAGE",
    "DEFAULT_CHECK_NAMESPACE",
    "DEFAULT_CHECK_TIMEOUT_SECONDS",
    "DEFAULT_SHARED_RESOURCES",
    "DEFAULT_TIMEOUT_SECONDS",
    "DEFAULT_VALIDATION_ACTIONS",
    "FAILURE_POLICIES",
    "VALIDATING_WEBHOOK_CHOICES",
    "VALIDATION_ACTIONS",
    "AdmissionCheck",
    "CertSettings",
    "CertificateError",
    "CertificateFiles",
    "CheckResult",
    "ClusterCertificates",
    "IPAddress",
    "ServiceTarget",
    "UrlTarget",
    "WebhookSettings",
    "admission_configurations",
    "certificate_names",
    "connect_to_cluster",
    "ensure_local_certificates",
    "load_certificate",
    "parse_ip_addresses",
    "quota_objects",
    "render_yaml",
    "run_check",
    "service_dns_names",
    "webhook_entries",
    "write_certificates",
]


def __getattr__(name: str) -> object:
    module = _NEED_THE_CLIENT.get(name)
    if module is None:  # a submodule not imported yet, or no such name
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
