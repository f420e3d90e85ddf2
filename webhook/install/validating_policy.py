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

Kubernetes facts relied on (kubernetes/kubernetes, staging/src/k8s.io/apiserver/pkg/cel/library:
regex.go ``find``, lists.go ``indexOf``; cel-go ext strings ``replace``/``substring``/``join``;
optional ``.?`` and ``[?]`` since 1.29): every optional field is read through ``.?``/``has()``,
because a missing one is an evaluation error that failurePolicy Fail turns into a denial.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.constants import (
    APPLIED_ANNOTATION,
    FRACTION_ANNOTATION,
    REQUEST_ANNOTATIONS,
)
from webhook.core.modes import mode_changes, whole_gpu_changes
from webhook.core.placement import Placement
from webhook.core.policy.model import DirectRequests, Mode, Policy, PolicySet
from webhook.core.policy.schemes import KAI_SCHEDULER
from webhook.errors import GpushareError

API_VERSION = "admissionregistration.k8s.io/v1"
VALIDATION_ACTIONS = ("Deny", "Warn", "Audit")
DEFAULT_VALIDATION_ACTIONS: tuple[str, ...] = ("Deny",)
VERSIONS_ANNOTATION = "gpushare.io/policy-versions"
# The modes whose pods are placed on pools of device-plugin replicas: their record names the
# pool and slots, and their node selector and env limits follow from the pool alone.
POOL_MODES = frozenset({Mode.TIME_SLICING, Mode.MPS, Mode.MPS_DAEMON})
WHOLE_GPU_KEY = "whole-gpu"
_GLOB_CHARS = "*?["

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
class EnvLimit:
    """An env value a mode enforces: a number no larger than ``bound`` between ``prefix``
    and ``suffix`` (``0=20480M``), or, with ``exact``, that very string."""

    prefix: str = ""
    suffix: str = ""
    bound: int = 0
    exact: str | None = None


@dataclass(frozen=True)
class PolicyFacts:
    """What the policies tell the CEL, computed once at generation."""

    # The governing policy's name for a namespace and pod labels, as a CEL expression.
    selection: str
    # Policies that deny asking for their resource by hand: name -> resource.
    denied_resources: Mapping[str, str]
    # "policy@version/pool" (or ".../whole-gpu") -> the node selector mutation puts there.
    node_selectors: Mapping[str, Mapping[str, str]]
    # "policy@version/pool/slots" -> env name -> its limit.
    env_limits: Mapping[str, Mapping[str, EnvLimit]]
    # "policy@version" of the policies whose whole GPUs are the record's count of its
    # resource (not so where a scheme counts in other units: 100 vcuda cores per GPU).
    whole_counted: tuple[str, ...] = ()
    versions: tuple[str, ...] = ()


@dataclass(frozen=True)
class SafetyNetSettings:
    name: str
    failure_policy: str
    namespace_selector: Mapping[str, Any]
    match_conditions: Sequence[Mapping[str, str]]
    validation_actions: tuple[str, ...] = DEFAULT_VALIDATION_ACTIONS
    labels: Mapping[str, str] = field(default_factory=dict)


# -- CEL text --------------------------------------------------------------------------


def cel_string(value: str) -> str:
    """A CEL string literal in single quotes."""
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def _cel_list(values: Iterable[str]) -> str:
    return "[" + ", ".join(cel_string(value) for value in values) + "]"


def _cel_map(entries: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{cel_string(k)}: {v}" for k, v in entries.items()) + "}"


def _concat(*parts: str) -> str:
    """A CEL string concatenation; parts starting with ``=`` are expressions, others text."""
    return " + ".join(part[1:] if part.startswith("=") else cel_string(part) for part in parts)


def glob_regex(pattern: str) -> str:
    """An RE2 regex matching exactly the names ``fnmatch.fnmatchcase(name, pattern)`` does
    (``*``, ``?``, ``[seq]``, ``[!seq]``; an unclosed ``[`` is literal, as in fnmatch)."""
    out = ["^"]
    i = 0
    while i < len(pattern):
        char = pattern[i]
        i += 1
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            end = i + 1 if pattern[i : i + 1] in ("!", "]") else i
            end = end + 1 if pattern[end : end + 1] == "]" else end
            close = pattern.find("]", end)
            if close < 0:
                out.append(re.escape(char))
                continue
            body = pattern[i:close]
            i = close + 1
            negate = body.startswith("!")
            body = body[1:] if negate else body
            escaped = body.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")
            out.append(f"[{'^' if negate else ''}{escaped}]")
        else:
            out.append(re.escape(char))
    out.append("$")
    return "".join(out)


def _is_glob(pattern: str) -> bool:
    return any(char in pattern for char in _GLOB_CHARS)


def _namespace_in(patterns: Iterable[str]) -> str:
    """CEL: the request's namespace matches one of ``patterns``; 'false' for none."""
    patterns = list(dict.fromkeys(patterns))
    exact = [p for p in patterns if not _is_glob(p)]
    tests = [f"variables.podNamespace in {_cel_list(exact)}"] if exact else []
    tests += [
        f"variables.podNamespace.matches({cel_string(glob_regex(p))})"
        for p in patterns
        if p and _is_glob(p)
    ]
    return " || ".join(tests) or "false"


# -- Facts from the policies -------------------------------------------------------------


def _policy_base(policy: Policy) -> list[str]:
    """The conditions every way of matching ``policy`` shares: its excludes, its labels."""
    conditions = []
    if policy.match.exclude_namespaces:
        conditions.append(f"!({_namespace_in(policy.match.exclude_namespaces)})")
    for key, value in sorted(policy.match.pod_labels.items()):
        conditions.append(
            f"({cel_string(key)} in variables.labels && "
            f"variables.labels[{cel_string(key)}] == {cel_string(value)})"
        )
    return conditions


def selection_expression(policies: PolicySet) -> str:
    """``webhook.core.policy.selection.select_policy`` as CEL: the governing policy's name,
    '' when none. Each way a policy can match (exact name, glob, ``*``) is one candidate,
    ranked as selection ranks them (priority, specificity, name); default policies follow,
    used only when no candidate matched."""
    candidates: list[tuple[tuple[int, int, str], str, str]] = []
    defaults: list[tuple[tuple[int, str], str, str]] = []
    for policy in policies.policies:
        base = _policy_base(policy)
        labels = len(policy.match.pod_labels)
        patterns = policy.match.namespaces
        exact = [p for p in patterns if not _is_glob(p)]
        globs = [p for p in patterns if _is_glob(p) and p != "*"]
        levels = [(2, _namespace_in(exact) if exact else "")]
        levels.append(
            (1, f"!({_namespace_in(exact)}) && ({_namespace_in(globs)})" if globs else "")
        )
        if "*" in patterns:
            levels.append((0, f"!({_namespace_in([*exact, *globs])})"))
        for level, condition in levels:
            if condition:
                rank = (-policy.priority, -(level * 10 + labels), policy.name)
                candidates.append((rank, policy.name, " && ".join([*base, f"({condition})"])))
        if policy.default:
            defaults.append(((-policy.priority, policy.name), policy.name, " && ".join(base)))
    chain = "''"
    ordered = [
        *(c[1:] for c in sorted(defaults, key=lambda c: c[0], reverse=True)),
        *(c[1:] for c in sorted(candidates, key=lambda c: c[0], reverse=True)),
    ]
    for name, condition in ordered:
        chain = f"({condition or 'true'}) ? {cel_string(name)} : {chain}"
    excluded = sorted(policies.excluded_namespaces)
    if excluded:
        chain = f"({_namespace_in(excluded)}) ? '' : {chain}"
    return chain


def _record_key(policy: Policy, place: str) -> str:
    return f"{policy.name}@{policy.version}/{place}"


def _env_limit(value: str) -> EnvLimit:
    if value.isdigit():
        return EnvLimit(bound=int(value))
    found = re.fullmatch(r"(0=)([0-9]+)(M)", value)
    if found:
        return EnvLimit(found.group(1), found.group(3), int(found.group(2)))
    return EnvLimit(exact=value)


def policy_facts(policies: PolicySet) -> PolicyFacts:
    """The facts the CEL needs, from the policies the webhook serves."""
    selectors: dict[str, Mapping[str, str]] = {}
    limits: dict[str, Mapping[str, EnvLimit]] = {}
    whole_counted: list[str] = []
    for policy in policies.policies:
        # Two GPUs: a count that tells "the GPU count" from a fixed number of units.
        whole = whole_gpu_changes(policy, 2)
        if not isinstance(whole, str) and whole.resources[:1] == ((whole.resources[0][0], 2),):
            whole_counted.append(f"{policy.name}@{policy.version}")
        if policy.whole_gpus.node_selector:
            selectors[_record_key(policy, WHOLE_GPU_KEY)] = dict(policy.whole_gpus.node_selector)
        if policy.mode not in POOL_MODES:
            continue
        for pool in policy.pools:
            for slots in range(1, pool.replicas + 1):
                # The pod's fraction is at most its slots' share, and enforced limits grow
                # with the fraction: their values at that share bound the pod's.
                changes = mode_changes(policy, Placement(pool, slots, slots / pool.replicas))
                if slots == 1 and changes.node_selector:
                    selectors[_record_key(policy, pool.name)] = dict(changes.node_selector)
                enforced = {env.name: _env_limit(env.value) for env in changes.env if env.enforced}
                if enforced:
                    limits[_record_key(policy, f"{pool.name}/{slots}")] = enforced
    return PolicyFacts(
        selection=selection_expression(policies),
        denied_resources={
            p.name: p.resource_name
            for p in policies.policies
            if p.direct_requests is DirectRequests.DENY
        },
        node_selectors=selectors,
        env_limits=limits,
        versions=tuple(sorted(f"{p.name}@{p.version}" for p in policies.policies)),
        whole_counted=tuple(whole_counted),
    )


# -- The objects ----------------------------------------------------------------------------


def _record_field(name: str, *, number: bool = False) -> str:
    """CEL: one field of the applied record ('' when absent). The record is the compact,
    key-sorted JSON the core writes, and its values (DNS names, resource names, digits)
    hold no quotes, so a regex finds them."""
    key = '"' + name + '":'
    value = "[0-9]+" if number else '"[^"]*"'
    found = f"variables.applied.find({cel_string(key + value)})"
    return f"{found}.replace({cel_string(key)}, '').replace('\"', '')"


def _selector_literal(facts: PolicyFacts) -> str:
    return _cel_map(
        {
            key: _cel_map({k: cel_string(v) for k, v in sel.items()})
            for key, sel in sorted(facts.node_selectors.items())
        }
    )


def _limit_literal(limit: EnvLimit) -> str:
    if limit.exact is not None:
        return _cel_map({"exact": cel_string(limit.exact)})
    return _cel_map(
        {
            "prefix": cel_string(limit.prefix),
            "suffix": cel_string(limit.suffix),
            "bound": cel_string(str(limit.bound)),
        }
    )


def _limits_literal(facts: PolicyFacts) -> str:
    return _cel_map(
        {
            key: _cel_map({name: _limit_literal(limit) for name, limit in sorted(env.items())})
            for key, env in sorted(facts.env_limits.items())
        }
    )


def _variables(facts: PolicyFacts) -> list[dict[str, str]]:
    annotated = " || ".join(
        f"{cel_string(k)} in variables.annotations" for k in REQUEST_ANNOTATIONS
    )
    denied = _cel_map({k: cel_string(v) for k, v in sorted(facts.denied_resources.items())})
    resource_asked = (
        "(has(c.resources) && ((has(c.resources.limits) && variables.deniedResource in "
        "c.resources.limits) || (has(c.resources.requests) && variables.deniedResource in "
        "c.resources.requests)))"
    )
    limit = "variables.limits[name]"
    digits = f"e.value.substring(size({limit}.prefix), size(e.value) - size({limit}.suffix))"
    env_ok = (
        f"has(e.value) && ('exact' in {limit} ? e.value == {limit}.exact : "
        f"(e.value.startsWith({limit}.prefix) && e.value.endsWith({limit}.suffix) && "
        f"{digits}.matches('^[0-9]{{1,18}}$') && int({digits}) <= int({limit}.bound)))"
    )
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
        ("recordContainer", _record_field("container")),
        ("recordResource", _record_field("resource")),
        (
            "recordCount",
            f"{_record_field('slots', number=True)} != '' ? {_record_field('slots', number=True)}"
            f" : {_record_field('gpus', number=True)}",
        ),
        ("recordMode", _record_field("mode")),
        ("recordVersion", f"{_record_field('policy')} + '@' + {_record_field('policyVersion')}"),
        (
            "recordKey",
            f"variables.recordVersion + '/' + (variables.recordMode == {cel_string(WHOLE_GPU_KEY)}"
            f" ? {cel_string(WHOLE_GPU_KEY)} : {_record_field('pool')})",
        ),
        (
            # The record's count is the container's count of its resource: slots for the
            # device plugin's modes, GPUs where the policy's whole GPUs are counted so.
            "countsResource",
            f"variables.recordMode in {_cel_list(sorted(m.value for m in POOL_MODES))} || "
            f"(variables.recordMode == {cel_string(WHOLE_GPU_KEY)} && "
            f"variables.recordVersion in {_cel_list(facts.whole_counted)})",
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
            f"!variables.checksRecord ? {{}} : {_selector_literal(facts)}"
            "[?variables.recordKey].orValue({})",
        ),
        (
            "selectorDrift",
            "variables.selector.filter(k, !(k in variables.nodeSelector) || "
            "variables.nodeSelector[k] != variables.selector[k]).map(k, k + '=' + "
            "variables.selector[k])",
        ),
        (
            "limits",
            f"!variables.checksRecord || variables.gpuIndex < 0 ? {{}} : {_limits_literal(facts)}"
            "[?variables.recordKey + '/' + variables.recordCount].orValue({})",
        ),
        (
            "limitDrift",
            "variables.limits.filter(name, "
            "!object.spec.containers[variables.gpuIndex].?env.orValue([]).exists(e, e.name == name)"
            " || !object.spec.containers[variables.gpuIndex].?env.orValue([])"
            f".all(e, e.name != name || ({env_ok})))"
            f".map(name, 'exact' in {limit} ? name + '=' + {limit}.exact : "
            f"name + ' at most ' + {limit}.prefix + {limit}.bound + {limit}.suffix)",
        ),
    ]
    return [{"name": name, "expression": expression} for name, expression in pairs]


def _escaped_key(expression: str) -> str:
    """CEL: a JSON Pointer token of ``expression`` (RFC 6901), as the webhook's paths are."""
    return f"{expression}.replace('~', '~0').replace('/', '~1')"


def _changed(detail: Sequence[str]) -> str:
    return _concat(CHANGED_PREFIX + " (", *detail, ")" + CHANGED_SUFFIX)


def _validations() -> list[dict[str, str]]:
    container = "='/spec/containers/' + string(variables.gpuIndex)"
    return [
        {
            # A pod sent to kai-scheduler is KAI's: gpushare leaves it alone (it reads the
            # same annotations), so it is never mutated on purpose.
            "expression": "!variables.annotated || variables.policy == '' || "
            "variables.applied != '' || "
            f"object.spec.?schedulerName.orValue('') == {cel_string(KAI_SCHEDULER)}",
            "message": NEVER_MUTATED_MESSAGE,
            "reason": "Forbidden",
        },
        {
            "expression": "size(variables.handAsking) == 0",
            "messageExpression": _concat(
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
            "expression": "size(variables.selectorDrift) == 0",
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
            "expression": "size(variables.limitDrift) == 0",
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
            "matchConditions": [dict(c) for c in settings.match_conditions],
            "variables": _variables(facts),
            "validations": _validations(),
        },
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
