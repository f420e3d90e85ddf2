"""Which policy governs a pod, as one CEL condition per policy.

The same precedence as ``webhook.core.policy.selection`` (excluded namespaces; matching
policies ranked by priority, then match specificity, then name; the default policy only
where none matches), written so that exactly one policy's condition holds for a pod: each
compiled policy is independent of the others, as the apiserver requires (the order among
admission policies is not guaranteed).

Priorities and names are known when compiling, so only namespace globs and pod labels are
left to evaluate: the namespace is ``request.namespace``, the labels ``object.metadata``'s.
"""

from __future__ import annotations

from webhook.compile import cel
from webhook.core import Policy, PolicySet

NAMESPACE = "request.namespace"


def _namespace_in(patterns: tuple[str, ...]) -> str:
    """The namespace matches one of ``patterns`` (fnmatch globs)."""
    exact = [p for p in patterns if not any(c in p for c in "*?[")]
    globs = [p for p in patterns if p not in exact]
    conditions = []
    if exact:
        conditions.append(f"{NAMESPACE} in {cel.strings(exact)}")
    if "*" in globs:
        return "true"
    if globs:
        conditions.append(f"{NAMESPACE}.matches({cel.string(cel.globs_regex(globs))})")
    return cel.any_of(conditions)


def excluded(policies: PolicySet) -> str:
    """The namespaces no policy may touch (settings ``excludeNamespaces``, globs allowed)."""
    return _namespace_in(tuple(sorted(policies.excluded_namespaces)))


def _labels(policy: Policy) -> str:
    checks = [
        f"{cel.string(k)} in object.metadata.labels && "
        f"object.metadata.labels[{cel.string(k)}] == {cel.string(v)}"
        for k, v in sorted(policy.match.pod_labels.items())
    ]
    if not checks:
        return "true"
    return "(has(object.metadata.labels) && " + " && ".join(checks) + ")"


def _eligible(policy: Policy) -> str:
    """Not excluded by the policy's own ``excludeNamespaces``, and its pod labels hold."""
    parts = [_labels(policy)]
    if policy.match.exclude_namespaces:
        parts.insert(0, f"!{_namespace_in(policy.match.exclude_namespaces)}")
    return cel.all_of(parts)


def _matches(policy: Policy) -> str:
    if not policy.match.namespaces:
        return "false"
    return cel.all_of([_eligible(policy), _namespace_in(policy.match.namespaces)])


def _specificity(policy: Policy) -> str:
    """``selection._specificity``: 2 for an exact name, 1 for a glob other than ``*``,
    times ten, plus the number of pod labels the policy needs."""
    patterns = policy.match.namespaces
    exact = [p for p in patterns if not any(c in p for c in "*?[")]
    globs = [p for p in patterns if p not in exact and p != "*"]
    score = "0"
    if globs:
        score = f"({NAMESPACE}.matches({cel.string(cel.globs_regex(globs))}) ? 10 : 0)"
    if exact:
        score = f"({NAMESPACE} in {cel.strings(exact)} ? 20 : {score})"
    return f"({score} + {len(policy.match.pod_labels)})"


def _outranks(other: Policy, policy: Policy) -> str:
    """``other`` wins over ``policy`` when both match: (-priority, -specificity, name)."""
    if other.priority != policy.priority:
        return "true" if other.priority > policy.priority else "false"
    operator = ">=" if other.name < policy.name else ">"
    return f"{_specificity(other)} {operator} {_specificity(policy)}"


def governs(policy: Policy, policies: PolicySet) -> str:
    """The CEL condition under which ``policy`` is the one that decides for the pod."""
    others = [p for p in policies.policies if p is not policy]
    if policy.match.namespaces:
        beaten = [
            cel.all_of([_matches(o), _outranks(o, policy)])
            for o in others
            if o.match.namespaces and _outranks(o, policy) != "false"
        ]
        own = cel.all_of([_matches(policy), f"!{cel.any_of(beaten)}" if beaten else "true"])
    else:
        own = "false"
    if policy.default:
        earlier = [
            o
            for o in others
            if o.default and (-o.priority, o.name) < (-policy.priority, policy.name)
        ]
        as_default = cel.all_of(
            [
                _eligible(policy),
                f"!{_namespace_in(policy.match.namespaces)}" if policy.match.namespaces else "true",
                *(f"!{_matches(o)}" for o in others),
                *(
                    f"!{cel.all_of([_eligible(o), '!' + _namespace_in(o.match.namespaces)])}"
                    if o.match.namespaces
                    else f"!{_eligible(o)}"
                    for o in earlier
                ),
            ]
        )
        own = cel.any_of([own, as_default]) if own != "false" else as_default
    return cel.all_of([f"!{excluded(policies)}", own])
