"""The ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) of one gpushare policy, and
its binding: the webhook's denials, said in the webhook's words.

Validating policies run after every mutation, on the pod as it will be stored. It declares
the same variables as the mutating policy (``plan.PlanCel``): a pod the mutating policy
changed plans again without problems, so only pods left alone for a reason are denied, with
the reasons the webhook gives, joined by spaces as its AdmissionResponse message joins them.
A request that cannot be read is ``Invalid`` (HTTP 422), a request that breaks the policy
``Forbidden`` (403), as the webhook's status codes.

Where the policy denies asking for its shared resource by hand (``directResourceRequests:
deny``), a pod without the annotations that does so is denied too, as by the validating
webhook.
"""

from __future__ import annotations

from typing import Any

from webhook.compile.mutating import API_VERSION, _labels, _match_constraints
from webhook.compile.plan import DEVICES_REFUSAL, PlanCel, V, s
from webhook.compile.selection import governs
from webhook.constants import DEVICES_ANNOTATION, FRACTION_ANNOTATION, REQUEST_ANNOTATIONS
from webhook.core.policy.model import DirectRequests, Policy, PolicySet


def annotated() -> str:
    tests = " || ".join(f"{s(k)} in object.metadata.annotations" for k in REQUEST_ANNOTATIONS)
    return f"has(object.metadata.annotations) && ({tests})"


def _direct_request(policy: Policy) -> str:
    """``verdict._validate_direct_requests``: the first container or init container asking
    for the policy's shared resource by hand."""
    resource = s(policy.resource_name)
    asks = (
        f"has(x.resources) && ((has(x.resources.limits) && {resource} in x.resources.limits) || "
        f"(has(x.resources.requests) && {resource} in x.resources.requests))"
    )
    init = "(has(object.spec.initContainers) ? object.spec.initContainers : [])"
    return f"(object.spec.containers + {init}).filter(x, {asks})"


class ValidatingPolicy:
    """The validating admission policy of ``policy`` within ``policies``."""

    def __init__(self, policy: Policy, policies: PolicySet, name: str, plan: PlanCel) -> None:
        self.policy = policy
        self.policies = policies
        self.name = name
        self.plan = plan

    def validations(self) -> list[dict[str, Any]]:
        ann = annotated()
        found = [
            {
                "expression": f"!({ann}) || !({s(DEVICES_ANNOTATION)} in {V}a)",
                "message": DEVICES_REFUSAL,
                "reason": "Invalid",
            },
            {
                "expression": f"!({ann}) || {V}bad.size() == 0",
                "messageExpression": f"{V}bad.join(' ')",
                "reason": "Invalid",
            },
            {
                "expression": f"!({ann}) || {V}bad.size() > 0 || {V}problems.size() == 0",
                "messageExpression": f"{V}problems.join(' ')",
                "reason": "Forbidden",
            },
        ]
        policy = self.policy
        if policy.direct_requests is DirectRequests.DENY:
            offenders = _direct_request(policy)
            name = f"{offenders}[0].name"
            found.append(
                {
                    "expression": f"({ann}) || {offenders}.size() == 0",
                    "messageExpression": (
                        f"'container ' + \"'\" + {name} + \"'\" + "
                        + s(
                            f" asks for {policy.resource_name} directly, which policy "
                            f"{policy.name!r} does not allow: remove it and annotate the pod "
                            f'with {FRACTION_ANNOTATION}: "0.5" (or the share you need) instead.'
                        )
                    ),
                    "reason": "Forbidden",
                }
            )
        return found

    def documents(
        self, match_conditions: list[dict[str, str]], namespace_selector: dict[str, Any]
    ) -> list[dict[str, Any]]:
        conditions = [
            *match_conditions,
            {"name": "governed-by-policy", "expression": governs(self.policy, self.policies)},
        ]
        if self.policy.direct_requests is DirectRequests.ALLOW:
            conditions.insert(0, {"name": "requests-gpu-share", "expression": annotated()})
        labels = _labels(self.policy)
        return [
            {
                "apiVersion": API_VERSION,
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": self.name, "labels": labels},
                "spec": {
                    "matchConstraints": _match_constraints(),
                    "matchConditions": conditions,
                    "failurePolicy": "Fail",
                    "variables": [{"name": n, "expression": e} for n, e in self.plan.variables],
                    "validations": self.validations(),
                },
            },
            {
                "apiVersion": API_VERSION,
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": self.name, "labels": labels},
                "spec": {
                    "policyName": self.name,
                    "validationActions": ["Deny"],
                    "matchResources": {"namespaceSelector": namespace_selector},
                },
            },
        ]
