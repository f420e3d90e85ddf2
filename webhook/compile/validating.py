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
deny``), a pod without the annotations that does so is refused the same way: the policy's
mutating policy also matches it (``with_asks_by_hand``) and writes the webhook's sentence
(``refused_by_hand``) into ``gpushare.io/denied``. A validating policy of its own would
cost every pod create in the cluster a second CEL evaluation, annotated pods included; the
mutating policy's matchConditions are evaluated for every pod anyway. The check sees the pod
as created, before any mutating webhook (mutating policies run first): a resource added by
a later webhook is not refused here.
"""

from __future__ import annotations

from typing import Any

from webhook.compile.jsonpatch_cel import add_to_map
from webhook.compile.pod_cel import (
    API_VERSION,
    DENIAL_ANNOTATION,
    DENIAL_LABEL,
    match_constraints,
    s,
)
from webhook.constants import FRACTION_ANNOTATION, REQUEST_ANNOTATIONS
from webhook.core import DirectRequests, Policy

DENIALS_NAME = "gpushare-denials"
# The matchCondition letting only pods with gpushare's annotations through
# (``webhook.compile.compile_policies``).
ANNOTATED_CONDITION = "requests-gpu-share"


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


def asks_by_hand(policy: Policy) -> str | None:
    """Whether a pod asks for ``policy``'s shared resource by hand; None where the policy
    allows that (``verdict._validate_direct_requests``)."""
    if policy.direct_requests is not DirectRequests.DENY:
        return None
    return f"{_asks_by_hand(policy)}.size() > 0"


def with_asks_by_hand(policy: Policy, conditions: list[dict[str, str]]) -> list[dict[str, str]]:
    """The mutating policy's matchConditions, letting pods that ``asks_by_hand`` through too
    where ``policy`` refuses them."""
    by_hand = asks_by_hand(policy)
    if by_hand is None:
        return conditions
    return [
        {
            "name": "requests-gpu-share-or-asks-by-hand",
            "expression": f"({c['expression']}) || {by_hand}",
        }
        if c["name"] == ANNOTATED_CONDITION
        else c
        for c in conditions
    ]


def refused_by_hand(policy: Policy) -> str:
    """The ops writing the refusal of a pod that ``asks_by_hand`` into
    ``gpushare.io/denied`` (``denials`` reads it: 403, the webhook's sentence)."""
    return add_to_map(
        "/metadata/annotations",
        "has(object.metadata.annotations)",
        DENIAL_ANNOTATION,
        f"'403 ' + {_asks_by_hand_refusal(policy)}",
    )


def _asks_by_hand_refusal(policy: Policy) -> str:
    """The webhook's sentence for a pod that ``asks_by_hand``, as a CEL string."""
    first = f"{_asks_by_hand(policy)}[0].name"
    return f"'container ' + \"'\" + {first} + \"'\" + " + s(
        f" asks for {policy.resource_name} directly, which policy {policy.name!r} does "
        f'not allow: remove it and annotate the pod with {FRACTION_ANNOTATION}: "0.5" '
        "(or the share you need) instead."
    )
