"""Install tools: the serving certificate and the webhook configurations that register gpushare
with the apiserver, and the quota objects the policies declare. They read no pods and make no
admission decision.

This is the package's face: other packages import only the names below. Layout:
docs/architecture.md.
"""

from webhook.install.admission import admission_configurations
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
from webhook.install.cluster_certs import CertSettings, ClusterCertificates, connect_to_cluster
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

__all__ = [
    "DEFAULT_SHARED_RESOURCES",
    "DEFAULT_TIMEOUT_SECONDS",
    "DEFAULT_VALIDATION_ACTIONS",
    "FAILURE_POLICIES",
    "VALIDATING_WEBHOOK_CHOICES",
    "VALIDATION_ACTIONS",
    "CertSettings",
    "CertificateError",
    "CertificateFiles",
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
    "service_dns_names",
    "webhook_entries",
    "write_certificates",
]
