"""Which pools have a node that enforces the driver memory limit: per policy and pool, the
nodes that match the pool's ``nodeSelector`` and carry ``gpushare.io/driver-memory-limit:
"true"`` (the label the node agent keeps, docs/enforcement.md), and what it means where none
does.

Nodes are plain dicts as ``kubectl get nodes -o yaml`` lists them (``metadata.name``,
``.labels``, ``.annotations``). Only the pool modes (time-slicing, mps, mps-daemon) write the
driver limit, and only while ``enforcement.driverMemoryLimit`` is not ``off``:

- ``require``: the pods also select the label, so a pool with no such node is an error: its
  pods stay Pending (never uncapped);
- ``auto``, ``inject``: the pods run anyway, and on a node without the label without the
  driver's limit: a warning, for a pool with no such node and for one some of whose nodes
  lack it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.constants import DRIVER_LIMIT_LABEL, DRIVER_LIMIT_REASON_ANNOTATION
from webhook.core.policy.enforcement import DriverMemoryLimit
from webhook.core.policy.model import Mode, Policy, PolicySet, Pool
from webhook.core.policy.set_checks import SetFinding, Severity

# The modes whose pods get NVIDIA_GPU_MEMORY_REQUEST/LIMIT (modes/driver_limits.py); the
# other schemes enforce in their own way and refuse a driverMemoryLimit but the default.
DRIVER_LIMIT_MODES = frozenset({Mode.TIME_SLICING, Mode.MPS, Mode.MPS_DAEMON})
ENFORCING = "true"
# Node names quoted in one finding; the rest are counted.
_NAMES_SHOWN = 3


def writes_driver_limit(policy: Policy) -> bool:
    """Whether the policy's pods get the driver memory limit (where their memory is known)."""
    return policy.mode in DRIVER_LIMIT_MODES and policy.enforcement.writes_driver_limit


@dataclass(frozen=True)
class NodeFacts:
    """What a node says about the limit: its name, labels, and why it does not enforce."""

    name: str
    labels: Mapping[str, str]
    reason: str = ""

    @property
    def enforcing(self) -> bool:
        return self.labels.get(DRIVER_LIMIT_LABEL) == ENFORCING


def node_facts(node: Mapping[str, Any]) -> NodeFacts | None:
    """A Node object's facts; None for what is not one (no metadata.name)."""
    metadata = node.get("metadata") if isinstance(node, Mapping) else None
    if not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
        return None
    labels = metadata.get("labels")
    annotations = metadata.get("annotations")
    return NodeFacts(
        metadata["name"],
        {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {},
        str(annotations.get(DRIVER_LIMIT_REASON_ANNOTATION, ""))
        if isinstance(annotations, Mapping)
        else "",
    )


@dataclass(frozen=True)
class PoolCoverage:
    """One pool of a policy that writes the driver limit, against the nodes given."""

    policy: Policy
    pool: Pool
    index: int  # the pool's position in spec.pools
    matching: tuple[NodeFacts, ...]  # nodes its nodeSelector selects
    enforcing: tuple[str, ...]  # of those, the ones labelled gpushare.io/driver-memory-limit

    @property
    def lacking(self) -> tuple[NodeFacts, ...]:
        return tuple(node for node in self.matching if not node.enforcing)


def _selects(selector: Mapping[str, str], node: NodeFacts) -> bool:
    return all(node.labels.get(key) == value for key, value in selector.items())


def pool_coverage(policies: PolicySet, nodes: Iterable[Mapping[str, Any]]) -> list[PoolCoverage]:
    """Every pool of every policy that writes the driver limit, with the nodes that serve it
    and those of them that enforce the limit; policies in file order."""
    facts = [found for node in nodes if (found := node_facts(node)) is not None]
    coverage = []
    for policy in policies.policies:
        if not writes_driver_limit(policy):
            continue
        for index, pool in enumerate(policy.pools):
            matching = tuple(node for node in facts if _selects(pool.node_selector, node))
            enforcing = tuple(node.name for node in matching if node.enforcing)
            coverage.append(PoolCoverage(policy, pool, index, matching, enforcing))
    return coverage


def _names(nodes: Iterable[NodeFacts]) -> str:
    """Up to three nodes, each with the node agent's reason where it gave one."""
    listed = list(nodes)
    shown = [f"{n.name}: {n.reason}" if n.reason else n.name for n in listed[:_NAMES_SHOWN]]
    more = len(listed) - _NAMES_SHOWN
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _selector(pool: Pool) -> str:
    text = ",".join(f"{k}={v}" for k, v in sorted(pool.node_selector.items()))
    return f"its nodeSelector ({text})" if text else "it (no nodeSelector: every node)"


def _no_enforcing_node(item: PoolCoverage) -> str:
    """Why no node of the pool enforces the limit, in a clause."""
    label = f"{DRIVER_LIMIT_LABEL}={ENFORCING}"
    if not item.matching:
        return f"no node given matches {_selector(item.pool)}, so none carries {label}"
    return (
        f"none of the {len(item.matching)} node(s) matching {_selector(item.pool)} carries "
        f"{label} ({_names(item.matching)})"
    )


_FIX = "run `gpushare node-agent` on the pool's nodes (docs/enforcement.md)"


def coverage_finding(item: PoolCoverage) -> SetFinding | None:
    """The finding about one pool's coverage; None where every node serving it enforces."""
    policy, pool = item.policy, item.pool
    at = ("spec", "pools", item.index)
    setting = policy.enforcement.driver_memory_limit
    if setting is DriverMemoryLimit.REQUIRE and not item.enforcing:
        message = (
            f"pods of pool {pool.name!r} will stay Pending (driverMemoryLimit: require): "
            f"{_no_enforcing_node(item)}: {_FIX}."
        )
        return SetFinding(Severity.ERROR, policy, at, message)
    if setting is DriverMemoryLimit.REQUIRE or (item.matching and not item.lacking):
        return None
    if not item.enforcing:
        message = (
            f"pods of pool {pool.name!r} run without the driver memory limit "
            f"(driverMemoryLimit: {setting.value}): {_no_enforcing_node(item)}: {_FIX}, or "
            "set driverMemoryLimit: require to keep them Pending instead."
        )
    else:
        message = (
            f"pods of pool {pool.name!r} placed on {len(item.lacking)} of its "
            f"{len(item.matching)} nodes run without the driver memory limit "
            f"(driverMemoryLimit: {setting.value}), which lack {DRIVER_LIMIT_LABEL}="
            f"{ENFORCING} ({_names(item.lacking)}): {_FIX}."
        )
    return SetFinding(Severity.WARNING, policy, at, message)


def enforcing_node_findings(
    policies: PolicySet, nodes: Iterable[Mapping[str, Any]]
) -> list[SetFinding]:
    """Per pool of a policy that writes the driver limit: an error where ``require`` leaves
    its pods no node, a warning where its pods may run uncapped (module docstring)."""
    findings = (coverage_finding(item) for item in pool_coverage(policies, nodes))
    return [finding for finding in findings if finding is not None]
