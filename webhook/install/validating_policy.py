"""gpushare's safety net inside the apiserver: a ValidatingAdmissionPolicy and its binding.

Owns the CEL (admissionregistration.k8s.io/v1, in process in every apiserver since 1.30)
that re-checks pods after every mutator, in place of a second webhook call. It carries the
checks of the validating webhook (``webhook.core.verdict.validate``) that CEL can express,
with the webhook's messages:

- ``never-mutated``, under failurePolicy Fail only: a pod carrying
  ``gpu-fraction``/``gpu-memory`` in a namespace some policy governs, without the
  ``gpushare.io/applied`` record (the webhook skipped it, or was registered apart from this
  policy). Under Ignore the admin chose that a pod goes on unmutated while the webhook does
  not answer, so the net does not refuse it for that (``SafetyNetSettings.refuse_unmutated``
  follows ``--failure-policy``): it asks for no GPU, the annotation alone holds nothing.
- ``direct-request``: a pod without the annotations (under Ignore: or with them, unmutated)
  whose governing policy denies asking for its shared resource by hand, with a container or
  init container asking for it. Ignore excuses the webhook's absence, not a share taken by
  hand without the limits gpushare would have set.
- ``record-container``, ``record-resources``, ``record-node-selector``, ``record-limits``:
  a mutated pod whose settings were changed afterwards, as far as the record and the
  policies say: the record's container still exists and still asks for the record's
  count of its resource; the node selector the policy's pool put there is still there;
  the hard limits the mode enforces in the env (MPS thread percentage and pinned memory,
  the MPS daemon's pipe directory) are present and no looser than the pod's slots allow.

The checks run twice in one policy: as its one matchCondition (``fails-a-check``, with the
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

from webhook.cel_inlining import bind_all
from webhook.core import PolicySet
from webhook.errors import GpushareError
from webhook.install.device_checks import DEVICE_FILTER, device_check
from webhook.install.known_records import KnownRecord, fast_gate, known_records
from webhook.install.policy_facts import PolicyFacts, policy_facts
from webhook.install.safety_checks import checks, validations, variables

API_VERSION = "admissionregistration.k8s.io/v1"
VALIDATION_ACTIONS = ("Deny", "Warn", "Audit")
DEFAULT_VALIDATION_ACTIONS: tuple[str, ...] = ("Deny",)
VERSIONS_ANNOTATION = "gpushare.io/policy-versions"
# cel-go's parser refuses a longer expression (its ExpressionSizeCodePointLimit default, which
# kube-apiserver keeps: "expression code point size exceeds limit ... limit 100000").
MAX_EXPRESSION_CODE_POINTS = 100_000


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
    # Refuse an annotated pod the mutating webhook never mutated (failurePolicy Fail); off,
    # it goes on as written, as failurePolicy Ignore says (``safety_checks.checks``).
    refuse_unmutated: bool = True


# -- The objects ----------------------------------------------------------------------------


def validating_policy(
    settings: SafetyNetSettings, facts: PolicyFacts, known: Mapping[str, KnownRecord]
) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy: pods, CREATE, the webhooks' filters, the checks."""
    unmutated = settings.refuse_unmutated
    named = variables(facts, refuse_unmutated=unmutated)
    refused = checks(refuse_unmutated=unmutated)
    filters = " && ".join(f"({c['expression']})" for c in settings.match_conditions)
    if facts.device_denied and filters:
        # Pods the webhooks never see are checked too where a policy refuses the device
        # variables in every pod it governs.
        filters = f"(({filters}) || ({DEVICE_FILTER}))"
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
            # One condition holding the webhooks' pod filters too: the apiserver evaluates
            # every matchCondition of a policy, also after one has come out false.
            "matchConditions": [_failing_gate(filters, named, refused, known)],
            "validations": _bound(named, validations(refused)),
        },
    }


def _failing_gate(
    filters: str,
    named: list[dict[str, str]],
    refused: list[dict[str, str]],
    known: Mapping[str, KnownRecord],
) -> dict[str, str]:
    """A matchCondition true only for a pod some check refuses, so that a pod passing them
    all costs the checks once: the apiserver evaluates the validations, then every
    messageExpression in a context of its own (``safety_checks.validations``), which for a pod
    that passes was about 40% of the policy's cost (bench/cel_cost.py). A refused pod
    costs the checks three times instead; the decision and the messages are unchanged.
    matchConditions see no variables, so each one the checks need is evaluated once and
    bound (``bind_all``); the webhooks' pod filters come first, so a pod that is not a
    GPU-share pod (or is a mirror pod) and sets no device variable evaluates none of them.
    A pod carrying a record the webhook writes for a pool is checked against that record's
    facts, looked up rather than parsed (``known_records``)."""
    every_check = " && ".join(f"({v['expression']})" for v in refused)
    pairs = [(v["name"], v["expression"]) for v in named]
    general = bind_all(pairs, f"!({every_check})")
    device_ok = bind_all(pairs, device_check()["expression"])
    for expression in (fast_gate(known, device_ok, general), general):
        condition = f"{filters} && {expression}" if filters else expression
        # Many pools and slots make the lookup's maps long; past CEL's bound the policy
        # could not be created, so such a set is checked by the general path alone.
        if len(condition) <= MAX_EXPRESSION_CODE_POINTS:
            break
    return {"name": "fails-a-check", "expression": condition}


def _bound(
    variables: list[dict[str, str]], validations: list[dict[str, str]]
) -> list[dict[str, str]]:
    """The validations, each expression and message with the variables it needs folded
    or bound inline (``_failing_gate``), and no variables declared: the apiserver builds
    an accessor for every declared variable on each evaluation, the matchCondition's
    included, so declared variables cost every pod, while the validations run only for a
    pod the matchCondition found failing."""
    pairs = [(v["name"], v["expression"]) for v in variables]
    checks = []
    for validation in validations:
        check = dict(validation)
        for name in ("expression", "messageExpression"):
            if name in check:
                check[name] = bind_all(pairs, check[name], boolean=name == "expression")
        checks.append(check)
    return checks


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
    known = known_records(policies, facts)
    return [validating_policy(settings, facts, known), policy_binding(settings)]
