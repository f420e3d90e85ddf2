"""What the policies tell the safety-net CEL, computed once when it is generated.

Owns the facts ``validating_policy`` bakes into the ValidatingAdmissionPolicy and the CEL
text they are written in: which policy governs a namespace and pod labels
(``webhook.core.policy.selection`` compiled to one CEL expression, fnmatch globs as RE2
regexes), which policies deny asking for their resource by hand, and, per policy version,
the node selector and the enforced env limits of each pool (from the core's own
``mode_changes``, so they are the webhook's values, not a copy of its formulas: the MPS
client limits and the driver's ``NVIDIA_GPU_MEMORY_*``, whose node label under
``enforcement.driverMemoryLimit: require`` is part of the pool's selector), and which
policies refuse the device variables (``enforcement.deviceVariables: deny``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from webhook.core import (
    DeviceVariables,
    DirectRequests,
    Mode,
    Placement,
    Policy,
    PolicySet,
    mode_changes,
    whole_gpu_changes,
)

# The modes whose pods are placed on pools of device-plugin replicas: their record names the
# pool and slots, and their node selector and env limits follow from the pool alone.
POOL_MODES = frozenset({Mode.TIME_SLICING, Mode.MPS, Mode.MPS_DAEMON})
WHOLE_GPU_KEY = "whole-gpu"
_GLOB_CHARS = "*?["


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
    # Policies refusing NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES set by hand in any pod
    # they govern (enforcement.deviceVariables: deny).
    device_denied: tuple[str, ...] = ()


# -- CEL text --------------------------------------------------------------------------


def cel_string(value: str) -> str:
    """A CEL string literal in single quotes."""
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def cel_list(values: Iterable[str]) -> str:
    return "[" + ", ".join(cel_string(value) for value in values) + "]"


def cel_map(entries: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{cel_string(k)}: {v}" for k, v in entries.items()) + "}"


def concat(*parts: str) -> str:
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
    tests = [f"variables.podNamespace in {cel_list(exact)}"] if exact else []
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
        device_denied=tuple(
            sorted(
                p.name
                for p in policies.policies
                # A policy of mode kai hands its pods to KAI-Scheduler, which sets them.
                if p.enforcement.device_variables is DeviceVariables.DENY and p.mode is not Mode.KAI
            )
        ),
    )


# -- The facts as CEL literals ------------------------------------------------------------


def record_pattern(name: str, *, number: bool = False) -> tuple[str, str]:
    """The regex of one field of the applied record: its key, and its value (digits, or a
    quoted string). The record is the compact, key-sorted JSON the core writes, and its
    values (DNS names, resource names, digits) hold no quotes."""
    return '"' + name + '":', "[0-9]+" if number else '"[^"]*"'


def record_field(name: str, *, number: bool = False) -> str:
    """CEL: one field of the applied record ('' when absent), found by ``record_pattern``."""
    key, value = record_pattern(name, number=number)
    found = f"variables.record.find({cel_string(key + value)})"
    return f"{found}.replace({cel_string(key)}, '').replace('\"', '')"


def selector_map(selector: Mapping[str, str]) -> str:
    """CEL: one node selector, label -> value."""
    return cel_map({k: cel_string(v) for k, v in selector.items()})


def selector_literal(facts: PolicyFacts) -> str:
    return cel_map({key: selector_map(sel) for key, sel in sorted(facts.node_selectors.items())})


def _limit_literal(limit: EnvLimit) -> str:
    if limit.exact is not None:
        return cel_map({"exact": cel_string(limit.exact)})
    return cel_map(
        {
            "prefix": cel_string(limit.prefix),
            "suffix": cel_string(limit.suffix),
            "bound": cel_string(str(limit.bound)),
        }
    )


# One enforced env limit (name -> exact value, or prefix + bound + suffix) and the test of an
# env entry against it, for record-limits.
ENV_LIMIT = "variables.limits[name]"


def limit_held(limit: str, container: str) -> str:
    """CEL: env entry ``name`` is set, and within ``limit`` (a limit literal), in
    ``container``."""
    digits = f"e.value.substring(size({limit}.prefix), size(e.value) - size({limit}.suffix))"
    within = (
        f"has(e.value) && ('exact' in {limit} ? e.value == {limit}.exact : "
        f"(e.value.startsWith({limit}.prefix) && e.value.endsWith({limit}.suffix) && "
        f"{digits}.matches('^[0-9]{{1,18}}$') && int({digits}) <= int({limit}.bound)))"
    )
    env = f"{container}.?env.orValue([])"
    return f"{env}.exists(e, e.name == name) && {env}.all(e, e.name != name || ({within}))"


# record-limits and record-node-selector: one entry (``name``, ``k``) as the policy set it.
# The checks test every entry with all(); the drift lists (the denial's message) keep the
# entries where it fails.
LIMIT_HELD = limit_held(ENV_LIMIT, "object.spec.containers[variables.gpuIndex]")
SELECTOR_HELD = "k in variables.nodeSelector && variables.nodeSelector[k] == variables.selector[k]"


def env_limits_map(limits: Mapping[str, EnvLimit]) -> str:
    """CEL: one pool's enforced env limits, env name -> limit."""
    return cel_map({name: _limit_literal(limit) for name, limit in sorted(limits.items())})


def limits_literal(facts: PolicyFacts) -> str:
    return cel_map({key: env_limits_map(env) for key, env in sorted(facts.env_limits.items())})
