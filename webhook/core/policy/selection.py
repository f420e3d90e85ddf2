"""Which policy governs a pod.

Precedence, in order:
1. Namespaces excluded by the settings (kube-system always) are never touched.
2. Policies whose ``match`` selects the pod (namespace name or glob, minus
   ``excludeNamespaces``, and every ``podLabels`` entry) compete; the highest ``priority``
   wins, then the most specific match (exact name > glob > ``*``; pod labels add to it),
   then the name in alphabetical order, so the choice never depends on file order.
3. Only when no policy matches, the ``default: true`` policy with the highest priority.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TypeAlias

from webhook.core.memo import BoundedMemo, PerObject
from webhook.core.policy.model import Policy, PolicySet

# A namespace and the values of the pod labels any policy's match looks at.
SelectionKey: TypeAlias = tuple[str, tuple[str | None, ...]]


@dataclass(frozen=True)
class Selection:
    policy: Policy | None
    reason: str
    # One line per policy that did not win, saying why: for ``gpushare explain``.
    others: tuple[str, ...] = ()


# ``select_policy``'s answers per policy set, by namespace and the pod labels policies look at.
_SELECTIONS: PerObject[BoundedMemo[SelectionKey, Selection]] = PerObject(BoundedMemo)


def namespace_excluded(policies: PolicySet, namespace: str) -> bool:
    return any(fnmatchcase(namespace, pattern) for pattern in policies.excluded_namespaces)


def _specificity(policy: Policy, namespace: str) -> int:
    score = 0
    for pattern in policy.match.namespaces:
        if pattern == namespace:
            score = max(score, 2)
        elif pattern != "*" and fnmatchcase(namespace, pattern):
            score = max(score, 1)
    return score * 10 + len(policy.match.pod_labels)


def _why_not(policy: Policy, namespace: str, labels: Mapping[str, str]) -> str | None:
    """None when ``policy`` matches; else the reason it does not."""
    excluded = [p for p in policy.match.exclude_namespaces if fnmatchcase(namespace, p)]
    if excluded:
        return f"excludes namespace {namespace!r} (pattern {excluded[0]!r})"
    missing = [f"{k}={v}" for k, v in policy.match.pod_labels.items() if labels.get(k) != v]
    if missing:
        return f"needs pod labels {', '.join(missing)}"
    if not any(fnmatchcase(namespace, p) for p in policy.match.namespaces):
        if policy.default:
            return None
        return f"matches namespaces {list(policy.match.namespaces)}, not {namespace!r}"
    return None


def select_policy(
    policies: PolicySet, namespace: str, pod_labels: Mapping[str, str] | None = None
) -> Selection:
    """The governing policy; memoized per policy set, namespace and the labels policies use."""
    labels = pod_labels or {}
    key = (namespace, tuple(labels.get(k) for k in policies.selecting_label_keys))
    memo = _SELECTIONS.of(policies)
    return memo.get_or_compute(key, _select, policies, namespace, labels)


def _select(policies: PolicySet, namespace: str, labels: Mapping[str, str]) -> Selection:
    if namespace_excluded(policies, namespace):
        return Selection(None, f"namespace {namespace!r} is excluded from GPU sharing")
    others: list[str] = []
    matching: list[Policy] = []
    defaults: list[Policy] = []
    for policy in policies.policies:
        reason = _why_not(policy, namespace, labels)
        if reason is not None:
            others.append(f"{policy.name}: {reason}")
        elif any(fnmatchcase(namespace, p) for p in policy.match.namespaces):
            matching.append(policy)
        else:
            defaults.append(policy)
    if matching:
        ranked = sorted(matching, key=lambda p: (-p.priority, -_specificity(p, namespace), p.name))
        winner = ranked[0]
        others += [
            f"{p.name}: also matches but loses on priority/specificity/name to {winner.name}"
            for p in ranked[1:]
        ]
        others += [f"{p.name}: default policy, not used because a policy matches" for p in defaults]
        patterns = [p for p in winner.match.namespaces if fnmatchcase(namespace, p)]
        return Selection(
            winner,
            f"policy {winner.name!r} ({winner.source}) matches namespace {namespace!r} "
            f"through {patterns} with priority {winner.priority}",
            tuple(others),
        )
    if defaults:
        ranked = sorted(defaults, key=lambda p: (-p.priority, p.name))
        winner = ranked[0]
        others += [f"{p.name}: default with lower priority" for p in ranked[1:]]
        return Selection(
            winner,
            f"no policy names namespace {namespace!r}, so the default policy {winner.name!r} "
            f"({winner.source}) applies",
            tuple(others),
        )
    return Selection(
        None, f"no policy matches namespace {namespace!r} and none is default", tuple(others)
    )
