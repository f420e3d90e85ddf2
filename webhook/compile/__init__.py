"""gpushare's YAML policies compiled to Kubernetes admission policies: no webhook in the pod
path (``gpushare compile``).

Pure: a ``PolicySet`` in, a list of Kubernetes objects (plain dicts) out, or
``CompileRefusedError``. The webhook stays the reference; tests/e2e/test_compiled_policies.py holds
the two equal through a real kube-apiserver. This is the package's face: other packages
import only the names in ``__all__``. Layout: docs/architecture.md.
"""

from __future__ import annotations

import re
from typing import Any

from webhook.compile.mutating import MutatingPolicy
from webhook.compile.plan import s
from webhook.compile.refusals import CompileRefusedError, Refusal, notes, refusals
from webhook.compile.validating import ANNOTATED_CONDITION, denials
from webhook.compile.validating import annotated as annotated_expression
from webhook.constants import (
    ALWAYS_EXCLUDED_NAMESPACES,
    MIRROR_POD_ANNOTATION,
    OPT_OUT_LABEL,
    OPT_OUT_VALUE,
)
from webhook.core import PolicySet

__all__ = [
    "REINVOCATION_POLICIES",
    "CompileRefusedError",
    "Refusal",
    "compile_policies",
    "notes",
    "object_name",
]

PREFIX = "gpushare-"
# The MutatingAdmissionPolicies' reinvocationPolicy, default first. Never: the apiserver
# (k8s.io/apiserver v0.37.2, policy/mutating/dispatcher.go) calls an IfNeeded policy a second
# time after its own change, even when nothing else changed the pod, which doubles the CEL
# work for every annotated pod; IfNeeded is for clusters whose later mutating webhooks
# change a GPU pod's containers, annotations or node selection.
REINVOCATION_POLICIES = ("Never", "IfNeeded")


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


def compile_policies(
    policies: PolicySet, reinvocation: str = REINVOCATION_POLICIES[0]
) -> list[dict[str, Any]]:
    """Every policy as a MutatingAdmissionPolicy (which also refuses asking by hand for its
    shared resource where it denies that), one ValidatingAdmissionPolicy for the denials, and
    their bindings; ``CompileRefusedError`` naming each field that cannot be compiled.
    ``reinvocation`` is the mutating policies' reinvocationPolicy."""
    if reinvocation not in REINVOCATION_POLICIES:
        raise ValueError(f"reinvocation must be one of {', '.join(REINVOCATION_POLICIES)}")
    refused = refusals(policies)
    if refused:
        raise CompileRefusedError(refused)
    not_mirror = {
        "name": "not-mirror-pod",
        "expression": "!has(object.metadata.annotations) || "
        f"!({s(MIRROR_POD_ANNOTATION)} in object.metadata.annotations)",
    }
    annotated = {"name": ANNOTATED_CONDITION, "expression": annotated_expression()}
    selector = _namespace_selector(policies)
    documents: list[dict[str, Any]] = []
    for policy in policies.policies:
        name = object_name(policy.name)
        mutating = MutatingPolicy(policy, policies, name)
        documents += mutating.documents([annotated, not_mirror], selector, reinvocation)
    return [*documents, *denials(selector)]
