"""gpushare's YAML policies compiled to Kubernetes admission policies: no webhook in the pod
path (``gpushare compile``).

    plan        one policy's decision as CEL variables (request, container, pool, problems)
    selection   which policy governs a pod, as one CEL condition per policy
    mutating    the MutatingAdmissionPolicy and binding: the webhook's patch as JSONPatch
    validating  the ValidatingAdmissionPolicies and bindings: the webhook's denials
    refusals    what cannot be compiled (refused, naming the field), and what is left out
    cel         CEL text: literals, globs, the number formatting the webhook uses
    (webhook.cel_inlining, shared with the safety net: fewer CEL variables, short and
    single-use ones folded into their users)

Pure: a ``PolicySet`` in, a list of Kubernetes objects (plain dicts) out, or
``CompileRefusedError``. The webhook stays the reference; tests/e2e/test_compiled_policies.py holds
the two equal through a real kube-apiserver.
"""

from __future__ import annotations

import re
from typing import Any

from webhook.compile.mutating import MutatingPolicy
from webhook.compile.plan import s
from webhook.compile.refusals import CompileRefusedError, Refusal, notes, refusals
from webhook.compile.validating import denials, direct_requests
from webhook.constants import (
    ALWAYS_EXCLUDED_NAMESPACES,
    MIRROR_POD_ANNOTATION,
    OPT_OUT_LABEL,
    OPT_OUT_VALUE,
    REQUEST_ANNOTATIONS,
)
from webhook.core import PolicySet

__all__ = ["CompileRefusedError", "Refusal", "compile_policies", "notes", "object_name"]

PREFIX = "gpushare-"


def object_name(policy_name: str) -> str:
    """The admission policies' name for a gpushare policy (DNS subdomain, <= 253)."""
    return PREFIX + re.sub(r"[^a-z0-9.-]", "-", policy_name.lower())[:200]


def _namespace_selector(policies: PolicySet) -> dict[str, Any]:
    """Exact excluded names and the admins' opt-out label, as the webhook configurations
    (globs are left to the CEL selection)."""
    names = list(ALWAYS_EXCLUDED_NAMESPACES)
    names += sorted(n for n in policies.excluded_namespaces if not any(c in n for c in "*?["))
    return {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": list(dict.fromkeys(names)),
            },
            {"key": OPT_OUT_LABEL, "operator": "NotIn", "values": [OPT_OUT_VALUE]},
        ]
    }


def compile_policies(policies: PolicySet) -> list[dict[str, Any]]:
    """Every policy as a MutatingAdmissionPolicy (and a ValidatingAdmissionPolicy for asking
    by hand where it denies that), one ValidatingAdmissionPolicy for the denials, and their
    bindings; ``CompileRefusedError`` naming each field that cannot be compiled."""
    refused = refusals(policies)
    if refused:
        raise CompileRefusedError(refused)
    not_mirror = {
        "name": "not-mirror-pod",
        "expression": "!has(object.metadata.annotations) || "
        f"!({s(MIRROR_POD_ANNOTATION)} in object.metadata.annotations)",
    }
    annotated_test = " || ".join(
        f"{s(k)} in object.metadata.annotations" for k in REQUEST_ANNOTATIONS
    )
    annotated = {
        "name": "requests-gpu-share",
        "expression": f"has(object.metadata.annotations) && ({annotated_test})",
    }
    selector = _namespace_selector(policies)
    documents: list[dict[str, Any]] = []
    for policy in policies.policies:
        name = object_name(policy.name)
        mutating = MutatingPolicy(policy, policies, name)
        documents += mutating.documents([annotated, not_mirror], selector)
        documents += direct_requests(policy, policies, name, [not_mirror], selector)
    return [*documents, *denials(selector)]
