"""Everything ``gpushare webhook-config`` prints, in the order to apply it.

The one generator of gpushare's admission objects (the Helm chart and deploy/ take them from
here): the MutatingWebhookConfiguration, the safety-net ValidatingAdmissionPolicy and its
binding (``validating_policy``, built from the policies), and the
ValidatingWebhookConfiguration (``webhook_config``). The policy shares the webhooks' name,
namespaceSelector, matchConditions and failurePolicy; under failurePolicy Ignore it also lets
an annotated pod the mutating webhook never mutated through, as Ignore says.
"""

from __future__ import annotations

from typing import Any

from webhook.core import PolicySet
from webhook.install.validating_policy import SafetyNetSettings, safety_net
from webhook.install.webhook_config import (
    WebhookSettings,
    namespace_selector,
    pod_match_conditions,
    webhook_configurations,
)


def safety_net_settings(settings: WebhookSettings) -> SafetyNetSettings:
    """The safety-net policy's share of the webhook settings: name, filters, failurePolicy,
    and whether a pod the mutating webhook never mutated is refused (Fail) or goes on as
    written (Ignore: otherwise the net would refuse what Ignore admits)."""
    return SafetyNetSettings(
        name=settings.name,
        failure_policy=settings.failure_policy,
        refuse_unmutated=settings.failure_policy == "Fail",
        namespace_selector=namespace_selector(settings),
        match_conditions=pod_match_conditions(settings),
        validation_actions=settings.validation_actions,
        labels=settings.labels,
    )


def admission_configurations(
    settings: WebhookSettings, policies: PolicySet
) -> list[dict[str, Any]]:
    """Everything `gpushare webhook-config` prints, in the order to apply it: the mutating
    configuration, the safety-net policy and its binding, the validating configuration."""
    webhooks = webhook_configurations(settings)
    net = safety_net(safety_net_settings(settings), policies) if settings.safety_net_policy else []
    return [webhooks[0], *net, *webhooks[1:]]
