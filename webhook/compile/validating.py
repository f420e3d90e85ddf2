"""The ValidatingAdmissionPolicies (admissionregistration.k8s.io/v1) of the compiled set: the
webhook's denials, in the webhook's words and status codes.

Validating policies run after every mutation, on the pod as it will be stored. The mutating
policy of a pod's governing policy has already planned it: where it found problems it wrote
them into ``gpushare.io/denied`` (``plan.DENIAL_ANNOTATION``) instead of mutating, so one
small policy for the whole set denies exactly those pods, with those reasons (joined by
spaces, as the webhook's AdmissionResponse message joins them): a request that cannot be
read is ``Invalid`` (HTTP 422), one that breaks the policy ``Forbidden`` (403). Planning is
done once per pod, in the mutating policy; the check here reads one annotation, and only
on pods carrying the ``gpushare.io/denied`` label the mutating policy puts beside it
(an objectSelector: every other pod skips this policy without being converted for CEL).

Where a policy denies asking for its shared resource by hand (``directResourceRequests:
deny``), a policy of its own denies a pod without the annotations that does so, as the
validating webhook does; its first condition lets only pods asking for that resource through.
"""

from __future__ import annotations

from typing import Any

from webhook.compile.pod_cel import (
    API_VERSION,
    DENIAL_ANNOTATION,
    DENIAL_LABEL,
    match_constraints,
    policy_labels,
    s,
)
from webhook.compile.selection import governs
from webhook.constants import FRACTION_ANNOTATION, REQUEST_ANNOTATIONS
from webhook.core import DirectRequests, Policy, PolicySet

DENIALS_NAME = "gpushare-denials"


def annotated() -> str:
    tests = " || ".join(f"{s(k)} in object.metadata.annotations" for k in REQUEST_ANNOTATIONS)
    return f"has(object.metadata.annotations) && ({tests})"


def _binding(
    name: str, namespace_selector: dict[str, Any], labels: dict[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": namespace_selector},
        },
    }


def denials(namespace_selector: dict[str, Any]) -> list[dict[str, Any]]:
    """The policy denying what the mutating policies refused, and its binding."""
    note = f"object.metadata.annotations[{s(DENIAL_ANNOTATION)}]"
    labels = {"app.kubernetes.io/name": "gpushare"}
    policy = {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": DENIALS_NAME, "labels": labels},
        "spec": {
            # Only pods the mutating policies marked refused: no CEL for any other pod.
            "matchConstraints": {
                **match_constraints(),
                "objectSelector": {
                    "matchExpressions": [{"key": DENIAL_LABEL, "operator": "Exists"}]
                },
            },
            "matchConditions": [
                {
                    "name": "refused-by-gpushare",
                    "expression": "has(object.metadata.annotations) && "
                    f"{s(DENIAL_ANNOTATION)} in object.metadata.annotations",
                }
            ],
            "failurePolicy": "Fail",
            "validations": [
                {
                    "expression": f"!{note}.startsWith('422 ')",
                    "messageExpression": f"{note}.substring(4)",
                    "reason": "Invalid",
                },
                {
                    "expression": f"{note}.startsWith('422 ')",
                    "messageExpression": f"{note}.substring(4)",
                    "reason": "Forbidden",
                },
            ],
        },
    }
    return [policy, _binding(DENIALS_NAME, namespace_selector, labels)]


def _asks_by_hand(policy: Policy) -> str:
    """Containers and init containers asking for the policy's shared resource by hand."""
    resource = s(policy.resource_name)
    asks = (
        f"has(x.resources) && ((has(x.resources.limits) && {resource} in x.resources.limits) || "
        f"(has(x.resources.requests) && {resource} in x.resources.requests))"
    )
    init = "(has(object.spec.initContainers) ? object.spec.initContainers : [])"
    return f"(object.spec.containers + {init}).filter(x, {asks})"


def direct_requests(
    policy: Policy,
    policies: PolicySet,
    name: str,
    match_conditions: list[dict[str, str]],
    namespace_selector: dict[str, Any],
) -> list[dict[str, Any]]:
    """``verdict._validate_direct_requests`` for ``policy``; nothing where it allows them."""
    if policy.direct_requests is not DirectRequests.DENY:
        return []
    offenders = _asks_by_hand(policy)
    first = f"{offenders}[0].name"
    message = f"'container ' + \"'\" + {first} + \"'\" + " + s(
        f" asks for {policy.resource_name} directly, which policy {policy.name!r} does "
        f'not allow: remove it and annotate the pod with {FRACTION_ANNOTATION}: "0.5" '
        "(or the share you need) instead."
    )
    labels = policy_labels(policy)
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "matchConstraints": match_constraints(),
                "matchConditions": [
                    {
                        "name": "asks-by-hand",
                        "expression": f"!({annotated()}) && {offenders}.size() > 0",
                    },
                    *match_conditions,
                    {"name": "governed-by-policy", "expression": governs(policy, policies)},
                ],
                "failurePolicy": "Fail",
                "validations": [
                    {"expression": "false", "messageExpression": message, "reason": "Forbidden"}
                ],
            },
        },
        _binding(name, namespace_selector, labels),
    ]
