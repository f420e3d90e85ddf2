"""The core's front door: ``mutate`` and ``validate`` answer what the webhooks answer.

Both are pure: a pod (plain dict) in, a ``Verdict`` out. The HTTP and CLI edges only
decode their input, call these, and encode the outcome.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from webhook.constants import APPLIED_ANNOTATION, FRACTION_ANNOTATION, MIRROR_POD_ANNOTATION
from webhook.core.hand_set_env import device_variable_problems
from webhook.core.patch import JsonPatch, build_patch
from webhook.core.planning import (
    FORBIDDEN,
    MIRROR_POD,
    Decision,
    Denied,
    Planned,
    Untouched,
    plan_pod,
)
from webhook.core.policy.model import DirectRequests, Policy, PolicySet
from webhook.core.policy.selection import select_policy
from webhook.core.render import render
from webhook.core.request import has_gpu_request


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    patch: JsonPatch = field(default_factory=list)
    warnings: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    code: int = 200
    policy: str | None = None
    decision: Decision | None = None


def _denied(denied: Denied) -> Verdict:
    return Verdict(
        False, reasons=denied.reasons, code=denied.code, policy=denied.policy, decision=denied
    )


def mutate(
    pod: Mapping[str, Any], namespace: str, policies: PolicySet, *, explain: bool = False
) -> Verdict:
    """The mutating webhook's answer: a JSON Patch (maybe empty), or a denial."""
    decision = plan_pod(pod, namespace, policies, explain=explain)
    if isinstance(decision, Untouched):
        return Verdict(True, warnings=decision.warnings, decision=decision)
    if isinstance(decision, Denied):
        return _denied(decision)
    patch = build_patch(pod, decision.edits)
    return Verdict(True, patch, decision.warnings, policy=decision.policy.name, decision=decision)


def mutated_pod(pod: Mapping[str, Any], decision: Decision) -> dict[str, Any]:
    """The planned pod for a decision (the original when nothing changes)."""
    if isinstance(decision, Planned):
        return render(dict(pod), decision.edits)
    return dict(pod)


def validate(pod: Mapping[str, Any], namespace: str, policies: PolicySet) -> Verdict:
    """The validating webhook's answer, on the pod as every mutator left it.

    An annotated pod must still be exactly what planning yields (nothing to patch), so a
    later webhook that removed or loosened our limits is caught; a pod without annotation
    must not set device variables by hand, nor ask for the shared resource by hand, where
    the policy governing it denies that.
    """
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    if MIRROR_POD_ANNOTATION in annotations:
        return Verdict(True, decision=MIRROR_POD)
    if has_gpu_request(annotations):
        return _validate_planned(pod, namespace, policies, annotations)
    policy = select_policy(policies, namespace, metadata.get("labels") or {}).policy
    if policy is None:
        return Verdict(True)
    forbidden = device_variable_problems(pod.get("spec") or {}, policy)
    if forbidden:
        return Verdict(False, reasons=tuple(forbidden), code=FORBIDDEN, policy=policy.name)
    if policy.direct_requests is DirectRequests.ALLOW:
        return Verdict(True)
    return _validate_direct_requests(pod, policy)


def _validate_planned(
    pod: Mapping[str, Any], namespace: str, policies: PolicySet, annotations: Mapping[str, Any]
) -> Verdict:
    """An annotated pod: planning it again must change nothing."""
    decision = plan_pod(pod, namespace, policies)
    if isinstance(decision, Denied):
        versions = {policy.name: policy.version for policy in policies.policies}
        skew = _version_skew(annotations, decision.policy, versions.get(decision.policy or ""))
        if skew:
            return Verdict(True, warnings=(skew,), policy=decision.policy, decision=decision)
        return _denied(decision)
    if isinstance(decision, Untouched):
        return Verdict(True, decision=decision)
    drift = build_patch(pod, decision.edits)
    if drift and APPLIED_ANNOTATION not in annotations:
        return Verdict(
            False,
            reasons=(
                "This pod asks for a GPU share but was never mutated by gpushare: the "
                "mutating webhook was unreachable or skipped it. Check that "
                "mutate.gpushare.io is up and registered, then create the pod again.",
            ),
            code=FORBIDDEN,
            policy=decision.policy.name,
            decision=decision,
        )
    skew = _version_skew(annotations, decision.policy.name, decision.policy.version)
    if drift and skew:
        # Mutated by a replica (or before a reload) serving another version of the policies:
        # what this replica would inject differs for that reason, not because of tampering.
        return Verdict(True, warnings=(skew,), policy=decision.policy.name, decision=decision)
    if drift:
        paths = ", ".join(op["path"] for op in drift[:5])
        return Verdict(
            False,
            reasons=(
                "The GPU-sharing settings injected at admission were changed afterwards "
                f"(at {paths}); remove the webhook or edit that changes them, or drop the "
                f"{FRACTION_ANNOTATION} annotation.",
            ),
            code=FORBIDDEN,
            policy=decision.policy.name,
            decision=decision,
        )
    return Verdict(True, policy=decision.policy.name, decision=decision)


def _version_skew(
    annotations: Mapping[str, Any], name: str | None, version: str | None
) -> str | None:
    """A note when the pod was mutated under another policy or policy version than the one
    (``name``, ``version``) deciding now; None when the same, or never mutated."""
    try:
        record = orjson.loads(annotations.get(APPLIED_ANNOTATION) or "{}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict):
        return None
    applied = (record.get("policy"), record.get("policyVersion"))
    if not record or applied == (name, version):
        return None
    return (
        f"mutated under policy {applied[0]!r} version {applied[1]}, while this webhook now "
        f"serves {name!r} version {version}: not re-checked (the policies changed between "
        "mutation and validation)"
    )


def _validate_direct_requests(pod: Mapping[str, Any], policy: Policy) -> Verdict:
    """A pod without annotation, under a policy that denies asking for its resource by hand."""
    spec = pod.get("spec") or {}
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        resources = container.get("resources") or {}
        for section in ("limits", "requests"):
            if policy.resource_name in (resources.get(section) or {}):
                return Verdict(
                    False,
                    reasons=(
                        f"container {container.get('name')!r} asks for {policy.resource_name} "
                        f"directly, which policy {policy.name!r} does not allow: remove it and "
                        f'annotate the pod with {FRACTION_ANNOTATION}: "0.5" (or the share '
                        "you need) instead.",
                    ),
                    code=FORBIDDEN,
                    policy=policy.name,
                )
    return Verdict(True, policy=policy.name)
