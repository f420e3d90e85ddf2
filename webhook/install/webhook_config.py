"""The admissionregistration.k8s.io/v1 objects that point an apiserver at the webhook.

Owns the Mutating- and ValidatingWebhookConfiguration a cluster admin applies: where the
apiserver calls (a Service or a URL), the caBundle it trusts, and the filters that keep every
pod the webhook has no business with away from it, so an outage of the webhook can never
block ordinary pods. Pure functions return plain dicts; ``render_yaml`` is the thin printer.

Filters, cheapest first, as the apiserver applies them:
- ``rules``: pods, CREATE only (resources are immutable on UPDATE; in-place resize goes
  through the ``resize`` subresource, which the rule does not match).
- ``namespaceSelector``: never kube-system nor the webhook's own namespace, so the webhook
  cannot block its own pods (``kubernetes.io/metadata.name`` is set on every namespace
  since Kubernetes 1.22), nor namespaces labelled ``gpushare.io/webhook=exclude``.
- ``matchConditions`` (CEL, GA in 1.30): the mutating webhook sees only pods carrying a
  ``gpu-fraction`` or ``gpu-memory`` annotation; the validating one also pods that request
  a shared GPU resource by hand. Mirror pods (kubelet static pods) are never sent.

The safety net: by default the pods are re-checked after every mutator by a
ValidatingAdmissionPolicy evaluated inside the apiserver (``validating_policy``), not by a
second webhook call; ``validating_webhook="pods"`` adds the pod validating webhook back for
what only it can check. Both share the filters above.

Workloads: the ValidatingWebhookConfiguration also registers the kinds that carry pod
templates (CREATE and UPDATE): Kubernetes' own and the operators' (KubeRay, Kubeflow,
LeaderWorkerSet, JobSet, KServe, Argo) from the core's table, one webhook per match
condition (``template_webhooks``). Their failurePolicy is always Ignore: the check is early
feedback, the pods are still checked at creation under the configured failurePolicy, and an
outage of gpushare must not block editing or scaling down a workload.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml

from webhook.constants import (
    ALWAYS_EXCLUDED_NAMESPACES,
    MIRROR_POD_ANNOTATION,
    OPT_OUT_LABEL,
    OPT_OUT_VALUE,
    REQUEST_ANNOTATIONS,
    SHARED_GPU_RESOURCE,
)
from webhook.core import WorkloadKind, builtin_kinds
from webhook.errors import GpushareError
from webhook.install.policy_facts import cel_string
from webhook.install.template_webhooks import (
    KUEUE_CONDITION,
    KUEUE_CONDITION_NAME,
    KUEUE_WEBHOOK_NAME,
    WORKLOAD_OPERATIONS,
    TemplateWebhook,
    template_webhooks,
)
from webhook.install.validating_policy import DEFAULT_VALIDATION_ACTIONS

CONFIGURATION_NAME = "gpushare"
MUTATING_WEBHOOK_NAME = "mutate.gpushare.io"
VALIDATING_WEBHOOK_NAME = "validate.gpushare.io"
MUTATE_PATH = "/mutate"
VALIDATE_PATH = "/validate"
WORKLOAD_FAILURE_POLICY = "Ignore"


# The annotations a developer writes; kept here rather than imported from the core so the
# configuration stays printable without loading policies.
DEFAULT_SHARED_RESOURCES: tuple[str, ...] = (SHARED_GPU_RESOURCE,)

FAILURE_POLICIES = ("Fail", "Ignore")
# What the ValidatingWebhookConfiguration holds: the workload-template webhooks (the
# default), those and the pod webhook, or nothing.
VALIDATING_WEBHOOK_CHOICES = ("workloads", "pods", "none")
DEFAULT_TIMEOUT_SECONDS = 5
MIN_TIMEOUT_SECONDS = 1
MAX_TIMEOUT_SECONDS = 30


class WebhookConfigError(GpushareError):
    """The requested webhook configuration cannot be built; the message says what to change."""


@dataclass(frozen=True)
class ServiceTarget:
    """Call the webhook through an in-cluster Service (HTTP/1.1 with keep-alive)."""

    name: str
    namespace: str
    port: int = 443


@dataclass(frozen=True)
class UrlTarget:
    """Call the webhook at a fixed https URL (local development, out-of-cluster servers)."""

    url: str


@dataclass(frozen=True)
class WebhookSettings:
    target: ServiceTarget | UrlTarget
    ca_bundle_pem: bytes
    failure_policy: str = "Fail"
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    excluded_namespaces: tuple[str, ...] = ()
    shared_resources: tuple[str, ...] = DEFAULT_SHARED_RESOURCES
    name: str = CONFIGURATION_NAME
    labels: dict[str, str] = field(default_factory=lambda: {"app.kubernetes.io/name": "gpushare"})
    validating_webhook: str = "workloads"
    # The ValidatingAdmissionPolicy and its binding (the pods' safety net), and its actions.
    safety_net_policy: bool = True
    validation_actions: tuple[str, ...] = DEFAULT_VALIDATION_ACTIONS
    # The kinds whose pod templates are checked: the core's table and the policies' own.
    workload_kinds: tuple[WorkloadKind, ...] = field(default_factory=builtin_kinds)


def _annotations_contain_any(keys: Iterable[str]) -> str:
    tests = " || ".join(f"{cel_string(key)} in object.metadata.annotations" for key in keys)
    return f"has(object.metadata.annotations) && ({tests})"


def not_mirror_pod_expression() -> str:
    return (
        "!has(object.metadata.annotations) || "
        f"!({cel_string(MIRROR_POD_ANNOTATION)} in object.metadata.annotations)"
    )


def annotated_pod_expression() -> str:
    return _annotations_contain_any(REQUEST_ANNOTATIONS)


def _requests_any_resource(container_list: str, resources: Sequence[str]) -> str:
    checks = []
    for resource in resources:
        literal = cel_string(resource)
        checks.append(
            f"(has(c.resources.limits) && {literal} in c.resources.limits)"
            f" || (has(c.resources.requests) && {literal} in c.resources.requests)"
        )
    inner = " || ".join(checks)
    return (
        f"has(object.spec.{container_list}) && "
        f"object.spec.{container_list}.exists(c, has(c.resources) && ({inner}))"
    )


def shared_gpu_pod_expression(shared_resources: Sequence[str]) -> str:
    """True for pods that carry the annotations or request a shared resource themselves."""
    parts = [annotated_pod_expression()]
    parts += [
        _requests_any_resource(containers, shared_resources)
        for containers in ("containers", "initContainers")
    ]
    return " || ".join(f"({part})" for part in parts)


def _client_config(settings: WebhookSettings, path: str) -> dict[str, Any]:
    ca_bundle = base64.b64encode(settings.ca_bundle_pem).decode("ascii")
    target = settings.target
    if isinstance(target, ServiceTarget):
        return {
            "service": {
                "name": target.name,
                "namespace": target.namespace,
                "path": path,
                "port": target.port,
            },
            "caBundle": ca_bundle,
        }
    return {"url": target.url.rstrip("/") + path, "caBundle": ca_bundle}


def excluded_namespaces(settings: WebhookSettings) -> list[str]:
    """The namespaceSelector's NotIn values: exact names only. A glob pattern (``team-*``)
    cannot be written there, so namespaces it matches are left for the webhook to skip."""
    names = list(ALWAYS_EXCLUDED_NAMESPACES)
    if isinstance(settings.target, ServiceTarget):
        names.append(settings.target.namespace)
    names += (name for name in settings.excluded_namespaces if not _is_glob(name))
    return list(dict.fromkeys(names))


def _is_glob(pattern: str) -> bool:
    return any(char in pattern for char in "*?[")


_POD_RULES = [
    {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE"],
        "resources": ["pods"],
        "scope": "Namespaced",
    }
]


def namespace_selector(settings: WebhookSettings) -> dict[str, Any]:
    """Every namespace but the excluded ones and those labelled for opt-out."""
    return {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": excluded_namespaces(settings),
            },
            # Opt-out label for admins: `kubectl label ns X gpushare.io/webhook=exclude`.
            {"key": OPT_OUT_LABEL, "operator": "NotIn", "values": [OPT_OUT_VALUE]},
        ]
    }


def _common_webhook(
    settings: WebhookSettings, name: str, path: str, rules: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": settings.failure_policy,
        "timeoutSeconds": settings.timeout_seconds,
        "matchPolicy": "Equivalent",
        "clientConfig": _client_config(settings, path),
        "rules": rules if rules is not None else _POD_RULES,
        "namespaceSelector": namespace_selector(settings),
    }


def _metadata(settings: WebhookSettings) -> dict[str, Any]:
    return {"name": settings.name, "labels": dict(settings.labels)}


def mutating_configuration(settings: WebhookSettings) -> dict[str, Any]:
    webhook = _common_webhook(settings, MUTATING_WEBHOOK_NAME, MUTATE_PATH)
    # IfNeeded: another mutator may add a container after us; the core is idempotent, so a
    # second call on our own output yields no patch.
    webhook["reinvocationPolicy"] = "IfNeeded"
    # One condition, the annotation first: the apiserver evaluates every condition of a
    # webhook for every pod create, each a CEL program of its own (about 30 us each in the
    # harness's apiserver, bench/README.md), and most pods stop at the annotation. It does
    # so twice for a pod some mutator changed (again in the reinvocation round, before it
    # asks whether the webhook is to be called again: k8s.io/apiserver v0.37.2
    # admission/plugin/webhook/mutating/dispatcher.go), so each read of the annotations
    # counts: the mirror test reuses the annotated test's has().
    not_mirror = f"!({cel_string(MIRROR_POD_ANNOTATION)} in object.metadata.annotations)"
    webhook["matchConditions"] = [
        {
            "name": "requests-gpu-share",
            "expression": f"{annotated_pod_expression()} && {not_mirror}",
        },
    ]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": _metadata(settings),
        "webhooks": [
            webhook,
            kueue_webhook(settings),
        ],
    }


def kueue_webhook(settings: WebhookSettings) -> dict[str, Any]:
    """The one mutating webhook for workloads Kueue manages (any kind with pod templates):
    their templates get the share their pods will hold, so Kueue charges it before any pod
    exists. Its condition is the template webhooks' conditions joined (each guarded by
    has(), so false on another kind's object). The pods' failurePolicy: a workload admitted
    without its share escapes the queue's quota."""
    templates = template_webhooks(settings.workload_kinds)
    rules = [rule for t in templates for rule in t.rules(WORKLOAD_OPERATIONS)]
    webhook = _common_webhook(settings, KUEUE_WEBHOOK_NAME, MUTATE_PATH, rules)
    webhook["matchConditions"] = [
        {"name": KUEUE_CONDITION_NAME, "expression": KUEUE_CONDITION},
        {
            "name": "template-requests-gpu-share",
            "expression": " || ".join(f"({t.expression})" for t in templates),
        },
    ]
    return webhook


def pod_match_conditions(settings: WebhookSettings) -> list[dict[str, str]]:
    """What reaches the pod checks: no mirror pod; annotated, or asking by hand."""
    return [
        {"name": "not-mirror-pod", "expression": not_mirror_pod_expression()},
        {
            "name": "uses-gpu-share",
            "expression": shared_gpu_pod_expression(settings.shared_resources),
        },
    ]


def validating_configuration(settings: WebhookSettings) -> dict[str, Any]:
    """The workload-template webhooks, and the pod webhook where ``validating_webhook``
    is "pods"."""
    webhooks = []
    if settings.validating_webhook == "pods":
        webhook = _common_webhook(settings, VALIDATING_WEBHOOK_NAME, VALIDATE_PATH)
        webhook["matchConditions"] = pod_match_conditions(settings)
        webhooks.append(webhook)
    webhooks += (template_webhook(settings, t) for t in template_webhooks(settings.workload_kinds))
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": _metadata(settings),
        "webhooks": webhooks,
    }


def template_webhook(settings: WebhookSettings, template: TemplateWebhook) -> dict[str, Any]:
    """The validating webhook that checks the pod templates of some workload kinds."""
    rules = template.rules(WORKLOAD_OPERATIONS)
    webhook = _common_webhook(settings, template.name, VALIDATE_PATH, rules)
    webhook["failurePolicy"] = WORKLOAD_FAILURE_POLICY
    webhook["matchConditions"] = [
        {"name": "template-requests-gpu-share", "expression": template.expression}
    ]
    return webhook


def check_settings(settings: WebhookSettings) -> None:
    """Raise ``WebhookConfigError`` for values the apiserver would reject."""
    if settings.failure_policy not in FAILURE_POLICIES:
        raise WebhookConfigError(
            f"failurePolicy {settings.failure_policy!r} is not one of "
            f"{', '.join(FAILURE_POLICIES)}."
        )
    if not MIN_TIMEOUT_SECONDS <= settings.timeout_seconds <= MAX_TIMEOUT_SECONDS:
        raise WebhookConfigError(
            f"timeoutSeconds {settings.timeout_seconds} is outside 1..30, the range the "
            "apiserver accepts; keep it short (5) so a slow webhook fails fast."
        )
    if isinstance(settings.target, UrlTarget):
        parts = urlsplit(settings.target.url)
        if parts.scheme != "https" or not parts.hostname:
            raise WebhookConfigError(
                f"--url {settings.target.url!r} must be an https URL such as "
                "https://127.0.0.1:8443; the apiserver only calls webhooks over TLS."
            )
        if parts.query or parts.fragment or parts.username or parts.password:
            raise WebhookConfigError(
                f"--url {settings.target.url!r} must not carry a query, fragment or user "
                "info; the apiserver rejects them."
            )
    elif not 1 <= settings.target.port <= 65535:
        raise WebhookConfigError(f"Service port {settings.target.port} is outside 1..65535.")
    if b"-----BEGIN CERTIFICATE-----" not in settings.ca_bundle_pem:
        raise WebhookConfigError(
            "The CA file holds no PEM certificate; pass the ca.crt written by `gpushare certs`."
        )
    if not settings.shared_resources:
        raise WebhookConfigError(
            "Name at least one shared GPU resource for the validating webhook."
        )
    if settings.validating_webhook not in VALIDATING_WEBHOOK_CHOICES:
        raise WebhookConfigError(
            f"--validating-webhook {settings.validating_webhook!r} is not one of "
            f"{', '.join(VALIDATING_WEBHOOK_CHOICES)}."
        )
    if not settings.safety_net_policy and settings.validating_webhook != "pods":
        raise WebhookConfigError(
            "Without the safety-net policy nothing re-checks pods after mutation: keep it, "
            "or pass --validating-webhook pods."
        )


def webhook_configurations(settings: WebhookSettings) -> list[dict[str, Any]]:
    """The mutating and validating webhook configuration, in the order to apply them;
    the validating one only when it holds a webhook."""
    check_settings(settings)
    documents = [mutating_configuration(settings)]
    if settings.validating_webhook != "none":
        documents.append(validating_configuration(settings))
    return documents


def render_yaml(documents: Sequence[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False, width=1000)
