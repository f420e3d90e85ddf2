"""gpushare's safety net inside the apiserver: a ValidatingAdmissionPolicy and its binding.

Owns the CEL (admissionregistration.k8s.io/v1, in process in every apiserver since 1.30)
that re-checks pods after every mutator, in place of a second webhook call. It carries the
checks of the validating webhook (``webhook.core.verdict.validate``) that CEL can express,
with the webhook's messages:

- ``never-mutated``: a pod carrying ``gpu-fraction``/``gpu-memory`` in a namespace some
  policy governs, without the ``gpushare.io/applied`` record (the mutating webhook was
  down under failurePolicy Ignore, or skipped it).
- ``direct-request``: a pod without the annotations whose governing policy denies asking
  for its shared resource by hand, with a container or init container asking for it.
- ``record-container``, ``record-resources``, ``record-node-selector``, ``record-limits``:
  a mutated pod whose settings were changed afterwards, as far as the record and the
  policies say: the record's container still exists and still asks for the record's
  count of its resource; the node selector the policy's pool put there is still there;
  the hard limits the mode enforces in the env (MPS thread percentage and pinned memory,
  the MPS daemon's pipe directory) are present and no looser than the pod's slots allow.

The checks run twice in one policy: as its last matchCondition (``fails-a-check``, with the
variables bound inline, as matchConditions see none), so that only a pod some check refuses
reaches the validations, whose messageExpressions name what is wrong. A pod that passes
costs the checks once; the apiserver would otherwise evaluate the checks, then every
messageExpression in a context of its own, evaluating the variables again.

What CEL cannot do, the opt-in pod validating webhook still does: plan the pod again and
compare every field (annotation values against the policy's bounds, framework and
inference-server env, volumes, tolerations, affinity, a limit tightened rather than
loosened), and admit with a note a pod mutated under another policy version.

Policy facts reach the CEL baked in at generation from ``--policies``, not through a params
object: CEL has no YAML or JSON decoder, so it could not read the policy files the webhook's
ConfigMap holds, and a derived params ConfigMap would need its own writer (the admin, with
the same staleness, or the webhook, with write access to ConfigMaps). Baked facts are made
safe against staleness instead: the tamper checks that use them are keyed by the policy
version each pod's record carries, so a pod mutated under a version this object was not
generated for is not checked (as the webhook admits version skew), and the versions are
listed in the ``gpushare.io/policy-versions`` annotation for admins to compare. Only the
selection (which policy governs a namespace, for ``never-mutated`` and ``direct-request``)
goes stale with a policy change; regenerate after editing policies.

CEL libraries used (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/cel/library:
regex.go ``find``, lists.go ``indexOf``; cel-go strings ext; optionals ``.?``/``[?]``): every
optional field is read through them, as a missing one is an evaluation error (a denial).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.cel_inlining import bind_all, fold_variables
from webhook.constants import APPLIED_ANNOTATION, FRACTION_ANNOTATION, REQUEST_ANNOTATIONS
from webhook.core import KAI_SCHEDULER, PolicySet
from webhook.errors import GpushareError
from webhook.install.policy_facts import (
    ENV_LIMIT,
    LIMIT_HELD,
    POOL_MODES,
    SELECTOR_HELD,
    WHOLE_GPU_KEY,
    PolicyFacts,
    cel_list,
    cel_map,
    cel_string,
    concat,
    limits_literal,
    policy_facts,
    record_field,
    selector_literal,
)

API_VERSION = "admissionregistration.k8s.io/v1"
VALIDATION_ACTIONS = ("Deny", "Warn", "Audit")
DEFAULT_VALIDATION_ACTIONS: tuple[str, ...] = ("Deny",)
VERSIONS_ANNOTATION = "gpushare.io/policy-versions"

# The webhook's words (webhook/core/verdict.py), so a denial reads the same either way.
NEVER_MUTATED_MESSAGE = (
    "This pod asks for a GPU share but was never mutated by gpushare: the mutating webhook "
    "was unreachable or skipped it. Check that mutate.gpushare.io is up and registered, "
    "then create the pod again."
)
CHANGED_PREFIX = "The GPU-sharing settings injected at admission were changed afterwards"
CHANGED_SUFFIX = (
    f"; remove the webhook or edit that changes them, or drop the {FRACTION_ANNOTATION} annotation."
)


class SafetyNetError(GpushareError):
    """The safety-net policy cannot be built; the message says what to change."""


@dataclass(frozen=True)
class SafetyNetSettings:
    name: str
    failure_policy: str
    namespace_selector: Mapping[str, Any]
    match_conditions: Sequence[Mapping[str, str]]
    validation_actions: tuple[str, ...] = DEFAULT_VALIDATION_ACTIONS
    labels: Mapping[str, str] = field(default_factory=dict)


# -- The objects ----------------------------------------------------------------------------


def _variables(facts: PolicyFacts) -> list[dict[str, str]]:
    """The named CEL values the checks share; long because each is one line of CEL."""
    annotated = " || ".join(
        f"{cel_string(k)} in variables.annotations" for k in REQUEST_ANNOTATIONS
    )
    denied = cel_map({k: cel_string(v) for k, v in sorted(facts.denied_resources.items())})
    resource_asked = (
        "(has(c.resources) && ((has(c.resources.limits) && variables.deniedResource in "
        "c.resources.limits) || (has(c.resources.requests) && variables.deniedResource in "
        "c.resources.requests)))"
    )
    limit = ENV_LIMIT
    pairs = [
        ("podNamespace", "request.namespace"),
        ("annotations", "object.metadata.?annotations.orValue({})"),
        ("labels", "object.metadata.?labels.orValue({})"),
        ("annotated", annotated),
        ("policy", facts.selection),
        ("applied", f"variables.annotations[?{cel_string(APPLIED_ANNOTATION)}].orValue('')"),
        ("deniedResource", f"{denied}[?variables.policy].orValue('')"),
        (
            "handAsking",
            "variables.annotated || variables.deniedResource == '' ? [] : "
            f"object.spec.containers.filter(c, {resource_asked}).map(c, c.name) + "
            f"object.spec.?initContainers.orValue([]).filter(c, {resource_asked}).map(c, c.name)",
        ),
        ("checksRecord", "variables.annotated && variables.applied != ''"),
        # The record's fields are read only from a record the checks read: the matchCondition
        # evaluates every field (bind_all), and a pod nobody mutated may carry anything.
        ("record", "variables.checksRecord ? variables.applied : ''"),
        ("recordContainer", record_field("container")),
        ("recordResource", record_field("resource")),
        ("recordSlots", record_field("slots", number=True)),
        (
            "recordCount",
            "variables.recordSlots != '' ? variables.recordSlots : "
            f"{record_field('gpus', number=True)}",
        ),
        ("recordMode", record_field("mode")),
        ("recordVersion", f"{record_field('policy')} + '@' + {record_field('policyVersion')}"),
        (
            "recordKey",
            f"variables.recordVersion + '/' + (variables.recordMode == {cel_string(WHOLE_GPU_KEY)}"
            f" ? {cel_string(WHOLE_GPU_KEY)} : {record_field('pool')})",
        ),
        (
            # The record's count is the container's count of its resource: slots for the
            # device plugin's modes, GPUs where the policy's whole GPUs are counted so.
            "countsResource",
            f"variables.recordMode in {cel_list(sorted(m.value for m in POOL_MODES))} || "
            f"(variables.recordMode == {cel_string(WHOLE_GPU_KEY)} && "
            f"variables.recordVersion in {cel_list(facts.whole_counted)})",
        ),
        (
            "gpuIndex",
            "object.spec.containers.map(c, c.name).indexOf(variables.recordContainer)",
        ),
        (
            "gpuLimit",
            "variables.gpuIndex < 0 ? '' : string(object.spec.containers[variables.gpuIndex]"
            ".?resources.?limits[?variables.recordResource].orValue('none'))",
        ),
        ("nodeSelector", "object.spec.?nodeSelector.orValue({})"),
        (
            "selector",
            f"!variables.checksRecord ? {{}} : {selector_literal(facts)}"
            "[?variables.recordKey].orValue({})",
        ),
        (
            "selectorDrift",
            f"variables.selector.filter(k, !({SELECTOR_HELD}))"
            ".map(k, k + '=' + variables.selector[k])",
        ),
        (
            "limits",
            f"!variables.checksRecord || variables.gpuIndex < 0 ? {{}} : {limits_literal(facts)}"
            "[?variables.recordKey + '/' + variables.recordCount].orValue({})",
        ),
        (
            "limitDrift",
            f"variables.limits.filter(name, !({LIMIT_HELD}))"
            f".map(name, 'exact' in {limit} ? name + '=' + {limit}.exact : "
            f"name + ' at most ' + {limit}.prefix + {limit}.bound + {limit}.suffix)",
        ),
    ]
    return [{"name": name, "expression": expression} for name, expression in pairs]


def _escaped_key(expression: str) -> str:
    """CEL: a JSON Pointer token of ``expression`` (RFC 6901), as the webhook's paths are."""
    return f"{expression}.replace('~', '~0').replace('/', '~1')"


def _changed(detail: Sequence[str]) -> str:
    return concat(CHANGED_PREFIX + " (", *detail, ")" + CHANGED_SUFFIX)


def _only_when_failing(validation: dict[str, str]) -> dict[str, str]:
    """The message built only for a pod its check refuses. The apiserver evaluates every
    messageExpression on every admission, whether its check held or not, and in a context
    of its own that evaluates the variables again (k8s.io/apiserver v0.37.2,
    admission/plugin/policy/validating/validator.go: ``messageFilter.ForInput`` after the
    checks; admission/plugin/cel/composition.go: a new context per ``ForInput``)."""
    if "messageExpression" not in validation:
        return validation
    expression, message = validation["expression"], validation["messageExpression"]
    return {**validation, "messageExpression": f"({expression}) ? '' : ({message})"}


def _validations() -> list[dict[str, str]]:
    """The checks, with the webhook's messages."""
    return [_only_when_failing(v) for v in _checks()]


def _checks() -> list[dict[str, str]]:
    """The checks and their messages; long because each is one literal."""
    container = "='/spec/containers/' + string(variables.gpuIndex)"
    return [
        {
            # A pod sent to kai-scheduler is KAI's: gpushare leaves it alone (it reads the
            # same annotations), so it is never mutated on purpose.
            # The record first: a mutated pod then never evaluates the selection.
            "expression": "!variables.annotated || variables.applied != '' || "
            "variables.policy == '' || "
            f"object.spec.?schedulerName.orValue('') == {cel_string(KAI_SCHEDULER)}",
            "message": NEVER_MUTATED_MESSAGE,
            "reason": "Forbidden",
        },
        {
            "expression": "size(variables.handAsking) == 0",
            "messageExpression": concat(
                "container '",
                "=variables.handAsking[0]",
                "' asks for ",
                "=variables.deniedResource",
                " directly, which policy '",
                "=variables.policy",
                "' does not allow: remove it and annotate the pod with "
                f'{FRACTION_ANNOTATION}: "0.5" (or the share you need) instead.',
            ),
            "message": "A container asks for the shared GPU resource directly, which the "
            f"policy does not allow: annotate the pod with {FRACTION_ANNOTATION} instead.",
            "reason": "Forbidden",
        },
        {
            "expression": "!variables.checksRecord || variables.gpuIndex >= 0",
            "messageExpression": "variables.recordContainer == '' ? "
            + _changed([f"the {APPLIED_ANNOTATION} record is not one gpushare wrote"])
            + " : "
            + _changed(
                [
                    f"the {APPLIED_ANNOTATION} record names container '",
                    "=variables.recordContainer",
                    "', which the pod no longer has",
                ]
            ),
            "message": f"{CHANGED_PREFIX} (the container named in {APPLIED_ANNOTATION} is "
            f"gone){CHANGED_SUFFIX}",
            "reason": "Forbidden",
        },
        {
            "expression": "!variables.checksRecord || variables.gpuIndex < 0 || "
            "!variables.countsResource || variables.recordResource == '' || "
            "variables.recordCount == '' || variables.gpuLimit == variables.recordCount",
            "messageExpression": _changed(
                [
                    "at ",
                    container,
                    "/resources/limits/",
                    "=" + _escaped_key("variables.recordResource"),
                    f": {APPLIED_ANNOTATION} records ",
                    "=variables.recordCount",
                    ", the container asks for ",
                    "=variables.gpuLimit",
                ]
            ),
            "message": f"{CHANGED_PREFIX} (the GPU resource of the container){CHANGED_SUFFIX}",
            "reason": "Forbidden",
        },
        {
            "expression": f"variables.selector.all(k, {SELECTOR_HELD})",
            "messageExpression": _changed(
                [
                    "at /spec/nodeSelector: policy version ",
                    "=variables.recordKey.split('/')[0]",
                    " selects ",
                    "=variables.selectorDrift.join(', ')",
                ]
            ),
            "message": f"{CHANGED_PREFIX} (the node selector){CHANGED_SUFFIX}",
            "reason": "Forbidden",
        },
        {
            "expression": f"variables.limits.all(name, {LIMIT_HELD})",
            "messageExpression": _changed(
                [
                    "at ",
                    container,
                    "/env: policy version ",
                    "=variables.recordKey.split('/')[0]",
                    " sets ",
                    "=variables.limitDrift.join(', ')",
                    " for ",
                    "=variables.recordCount",
                    " slot(s) of pool ",
                    "=variables.recordKey.split('/')[1]",
                ]
            ),
            "message": f"{CHANGED_PREFIX} (the hard limits in the env){CHANGED_SUFFIX}",
            "reason": "Forbidden",
        },
    ]


def validating_policy(settings: SafetyNetSettings, facts: PolicyFacts) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy: pods, CREATE, the webhooks' filters, the checks."""
    metadata: dict[str, Any] = {"name": settings.name, "labels": dict(settings.labels)}
    metadata["annotations"] = {VERSIONS_ANNOTATION: ",".join(facts.versions)}
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": metadata,
        "spec": {
            "failurePolicy": settings.failure_policy,
            "matchConstraints": {
                "matchPolicy": "Equivalent",
                "namespaceSelector": dict(settings.namespace_selector),
                # Written out although it is the default: matchConstraints is an atomic
                # struct, so a second field manager applying it without the defaulted
                # selector would conflict with the stored one (server-side apply).
                "objectSelector": {},
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
            },
            "matchConditions": [
                *(dict(c) for c in settings.match_conditions),
                _failing_gate(settings, facts),
            ],
            **_folded(_variables(facts), _validations()),
        },
    }


def _failing_gate(settings: SafetyNetSettings, facts: PolicyFacts) -> dict[str, str]:
    """A matchCondition true only for a pod some check refuses, so that a pod passing them
    all costs the checks once: the apiserver evaluates the validations, then every
    messageExpression in a context of its own (``_only_when_failing``), which for a pod
    that passes was about 40% of the policy's cost (bench/cel_cost.py). A refused pod
    costs the checks three times instead; the decision and the messages are unchanged.
    matchConditions see no variables, so each one the checks need is evaluated once and
    bound (``bind_all``); the pod filters come first, as the apiserver evaluates every
    matchCondition, so a pod that is not a GPU-share pod evaluates none of them."""
    checks = " && ".join(f"({v['expression']})" for v in _checks())
    filters = " && ".join(f"({c['expression']})" for c in settings.match_conditions)
    variables = [(v["name"], v["expression"]) for v in _variables(facts)]
    expression = bind_all(variables, f"!({checks})")
    return {
        "name": "fails-a-check",
        "expression": f"{filters} && {expression}" if filters else expression,
    }


def _folded(
    variables: list[dict[str, str]], validations: list[dict[str, str]]
) -> dict[str, list[dict[str, str]]]:
    """The variables, each short or single-use one folded into its users (the apiserver
    evaluates every variable as a program of its own: ``webhook.compile.inlining``)."""
    fields = ("expression", "messageExpression")
    users = [v[f] for v in validations for f in fields if f in v]
    kept, texts = fold_variables([(v["name"], v["expression"]) for v in variables], users)
    rest = iter(texts)
    checks = [dict(v) for v in validations]
    for check in checks:
        for name in (f for f in fields if f in check):
            check[name] = next(rest)
    return {
        "variables": [{"name": name, "expression": text} for name, text in kept],
        "validations": checks,
    }


def policy_binding(settings: SafetyNetSettings) -> dict[str, Any]:
    """The binding that puts the policy in force, cluster-wide, with its actions."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": settings.name, "labels": dict(settings.labels)},
        "spec": {
            "policyName": settings.name,
            "validationActions": list(settings.validation_actions),
        },
    }


def check_actions(actions: Sequence[str]) -> tuple[str, ...]:
    """The binding's validationActions, checked as the apiserver checks them."""
    unknown = [a for a in actions if a not in VALIDATION_ACTIONS]
    if unknown:
        raise SafetyNetError(
            f"validation action {unknown[0]!r} is not one of {', '.join(VALIDATION_ACTIONS)}."
        )
    if "Deny" in actions and "Warn" in actions:
        raise SafetyNetError(
            "validationActions Deny and Warn together are refused by the apiserver: use Deny "
            "(enforce), or Warn and Audit (try the policy out first)."
        )
    if not actions:
        raise SafetyNetError("Name at least one validation action: Deny, Warn or Audit.")
    return tuple(dict.fromkeys(actions))


def safety_net(settings: SafetyNetSettings, policies: PolicySet) -> list[dict[str, Any]]:
    """The policy and its binding, in the order to apply them."""
    check_actions(settings.validation_actions)
    facts = policy_facts(policies)
    return [validating_policy(settings, facts), policy_binding(settings)]
