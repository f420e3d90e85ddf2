"""The quotas on GPU shares a plan checks its workloads against, from manifests or a cluster.

A quota here limits ``gpushare.io/milligpu``, the share in thousandths of a GPU that pods of
a policy with ``quota.shareResource`` carry (docs/quotas.md):

- a ResourceQuota whose ``spec.hard`` has ``requests.gpushare.io/milligpu`` (extended
  resources are limited under their ``requests.`` name only), with ``status.used`` where the
  object has one (a cluster's always does; a manifest's rarely); ``spec.scopes`` and
  ``spec.scopeSelector`` are not evaluated: every pod of the namespace counts;
- a Kueue ClusterQueue (kueue.x-k8s.io/v1beta1 or v1beta2) whose flavors give
  ``gpushare.io/milligpu`` a ``nominalQuota`` (summed over the flavors), for the namespaces
  its ``namespaceSelector`` names by ``kubernetes.io/metadata.name`` (``{}``: every one) and
  the LocalQueues that point at it. Only workloads with a ``kueue.x-k8s.io/queue-name``
  label are Kueue's to charge; borrowing within a cohort is not counted. ClusterQueues are
  read from manifests only.

``held_now`` is what a cluster's pods, the very pods the plan re-plans, hold of the quota
already (``used`` counts them); a quota's room for the plan is ``hard - used + held_now``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

from webhook.constants import SHARE_RESOURCE

QUOTA_KEY = f"requests.{SHARE_RESOURCE}"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSIONS = frozenset({"v1beta1", "v1beta2"})
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
EVERY_NAMESPACE = "*"
# Kubernetes quantities: a decimal number and a suffix (resource.Quantity).
_QUANTITY = re.compile(r"^(\+?[0-9]*\.?[0-9]+|\+?[0-9]+\.)([eE][+-]?[0-9]+|[KMGTPE]i|[mkMGTPE]?)$")
_SUFFIXES = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_MAX_MILLI = 10**15  # past any cluster's GPUs; keeps a hostile quantity from growing
_MAX_EXPONENT = 30


@dataclass(frozen=True)
class ShareQuota:
    """One quota on GPU shares, in thousandths of a GPU."""

    kind: str  # ResourceQuota or ClusterQueue
    name: str  # namespace/name of a ResourceQuota, the name of a ClusterQueue
    namespaces: tuple[str, ...]  # whose pods it charges; EVERY_NAMESPACE for all
    hard: int
    used: int | None
    source: str  # file:line, or cluster
    # A ClusterQueue's LocalQueues (namespace, name); empty: any queue of its namespaces.
    queues: tuple[tuple[str, str], ...] = ()
    held_now: int = 0
    note: str = ""  # what the check cannot see (scopes, a selector on other labels)

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def room(self) -> int:
        """What the plan's workloads may take: hard - used, plus what they hold already."""
        return self.hard - (self.used or 0) + self.held_now

    def covers(self, namespace: str) -> bool:
        return EVERY_NAMESPACE in self.namespaces or namespace in self.namespaces


def milli_of(value: Any, *, round_up: bool = False) -> int | None:
    """A quantity of ``gpushare.io/milligpu`` as a whole number (hard rounded down, used
    up); None for what is not a quantity."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = Decimal(value)
    else:
        match = _QUANTITY.match(str(value).strip()) if isinstance(value, str | float) else None
        if match is None:
            return None
        digits, suffix = match.groups()
        factor = _SUFFIXES.get(suffix)
        if factor is None:  # an exponent: e3
            exponent = int(suffix[1:])
            if abs(exponent) > _MAX_EXPONENT:
                return None
            factor = Decimal(10) ** exponent
        try:
            number = Decimal(digits) * factor
        except ArithmeticError:  # decimal's InvalidOperation, Overflow
            return None
    if not number.is_finite() or not 0 <= number <= _MAX_MILLI:
        return None
    return int(number.to_integral_value(ROUND_CEILING if round_up else ROUND_FLOOR))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def resource_quota(
    content: Mapping[str, Any], namespace: str | None, source: str
) -> ShareQuota | None:
    """A ResourceQuota's limit on shares, or None where it sets none."""
    hard = milli_of(_mapping(_mapping(content.get("spec")).get("hard")).get(QUOTA_KEY))
    if hard is None:
        return None
    metadata = _mapping(content.get("metadata"))
    where = str(namespace or metadata.get("namespace") or "default")
    name = f"{where}/{metadata.get('name') or '(no name)'}"
    used_value = _mapping(_mapping(content.get("status")).get("used")).get(QUOTA_KEY)
    used = None if used_value is None else milli_of(used_value, round_up=True)
    spec = _mapping(content.get("spec"))
    scoped = bool(spec.get("scopes") or spec.get("scopeSelector"))
    note = "its scopes are not evaluated: every pod of the namespace counts" if scoped else ""
    return ShareQuota("ResourceQuota", name, (where,), hard, used, source, note=note)


def _is_kueue(content: Mapping[str, Any], kind: str) -> bool:
    group, _, version = str(content.get("apiVersion") or "").partition("/")
    return content.get("kind") == kind and group == KUEUE_GROUP and version in KUEUE_VERSIONS


def _selected_namespaces(selector: Any) -> tuple[tuple[str, ...], str]:
    """The namespaces a ClusterQueue's namespaceSelector admits, and a note where it selects
    by labels other than the name (then: every namespace)."""
    if not isinstance(selector, dict):
        return (), ""  # null admits no namespace
    chosen: set[str] | None = None
    other = False
    labels = _mapping(selector.get("matchLabels"))
    for key, value in labels.items():
        if key == NAMESPACE_NAME_LABEL and isinstance(value, str):
            chosen = {value} if chosen is None else chosen & {value}
        else:
            other = True
    expressions = selector.get("matchExpressions")
    for item in expressions if isinstance(expressions, list) else ():
        term = _mapping(item)
        values = term.get("values")
        if term.get("key") == NAMESPACE_NAME_LABEL and term.get("operator") == "In":
            named = {v for v in values if isinstance(v, str)} if isinstance(values, list) else set()
            chosen = named if chosen is None else chosen & named
        else:
            other = True
    note = "its namespaceSelector's other labels are not evaluated" if other else ""
    if chosen is None:
        return (EVERY_NAMESPACE,), note
    return tuple(sorted(chosen)), note


def cluster_queue(content: Mapping[str, Any], source: str) -> ShareQuota | None:
    """A ClusterQueue's nominal quota on shares, summed over its flavors, or None."""
    if not _is_kueue(content, "ClusterQueue"):
        return None
    spec = _mapping(content.get("spec"))
    total: int | None = None
    groups = spec.get("resourceGroups")
    for group in groups if isinstance(groups, list) else ():
        flavors = _mapping(group).get("flavors")
        for flavor in flavors if isinstance(flavors, list) else ():
            resources = _mapping(flavor).get("resources")
            for item in resources if isinstance(resources, list) else ():
                resource = _mapping(item)
                if resource.get("name") != SHARE_RESOURCE:
                    continue
                nominal = milli_of(resource.get("nominalQuota"))
                if nominal is not None:
                    total = nominal + (total or 0)
    if total is None:
        return None
    namespaces, note = _selected_namespaces(spec.get("namespaceSelector"))
    name = str(_mapping(content.get("metadata")).get("name") or "(no name)")
    return ShareQuota("ClusterQueue", name, namespaces, total, None, source, note=note)


def local_queue(content: Mapping[str, Any], namespace: str | None) -> tuple[str, str, str] | None:
    """A LocalQueue as (namespace, name, its ClusterQueue), or None."""
    if not _is_kueue(content, "LocalQueue"):
        return None
    metadata = _mapping(content.get("metadata"))
    target = _mapping(content.get("spec")).get("clusterQueue")
    name = metadata.get("name")
    if not isinstance(target, str) or not isinstance(name, str):
        return None
    return str(namespace or metadata.get("namespace") or "default"), name, target


def quotas_of(
    documents: Iterable[tuple[Mapping[str, Any], str]], namespace: str | None = None
) -> tuple[ShareQuota, ...]:
    """The share quotas among (content, source) documents, in order; each ClusterQueue with
    the LocalQueues that point at it."""
    quotas: list[ShareQuota] = []
    queues: list[tuple[str, str, str]] = []
    for content, source in documents:
        if not isinstance(content, dict):
            continue
        if content.get("kind") == "ResourceQuota" and content.get("apiVersion") == "v1":
            found = resource_quota(content, namespace, source)
        else:
            found = cluster_queue(content, source)
            local = local_queue(content, namespace)
            if local is not None:
                queues.append(local)
        if found is not None:
            quotas.append(found)
    return tuple(_with_queues(quota, queues) for quota in quotas)


def _with_queues(quota: ShareQuota, queues: Iterable[tuple[str, str, str]]) -> ShareQuota:
    if quota.kind != "ClusterQueue":
        return quota
    mine = tuple(
        (namespace, name)
        for namespace, name, target in queues
        if target == quota.name and quota.covers(namespace)
    )
    return replace(quota, queues=mine) if mine else quota


def pod_share(pod: Mapping[str, Any]) -> int:
    """The share a pod is charged now: its containers' requests of the share resource (or
    limits, which requests default to)."""
    total = 0
    containers = _mapping(pod.get("spec")).get("containers")
    for container in containers if isinstance(containers, list) else ():
        resources = _mapping(_mapping(container).get("resources"))
        value = _mapping(resources.get("requests")).get(SHARE_RESOURCE)
        if value is None:
            value = _mapping(resources.get("limits")).get(SHARE_RESOURCE)
        if value is not None:
            total += milli_of(value, round_up=True) or 0
    return total


def with_held_now(quotas: Iterable[ShareQuota], held: Mapping[str, int]) -> tuple[ShareQuota, ...]:
    """Each ResourceQuota with what the cluster's pods of its namespace hold already."""
    return tuple(
        replace(quota, held_now=held.get(quota.namespaces[0], 0))
        if quota.kind == "ResourceQuota"
        else quota
        for quota in quotas
    )
