"""The GPU pools the policies describe, seen from the nodes: each device-plugin config once.

Several policies may name the same pool (say, two teams' policies on one node group); on a
node that is one device-plugin config and one MPS daemon, so their definitions must agree.
``pool_refs`` lists every (policy, pool) pair, ``find_daemon_pool`` picks the pool an MPS
daemon serves, and ``pool_conflicts`` names the disagreements.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from webhook.constants import DEVICE_PLUGIN_CONFIG_LABEL
from webhook.core import Mode, Policy, PolicySet, Pool
from webhook.node.errors import InvalidPoliciesError, NodeSetupError


@dataclass(frozen=True)
class PoolRef:
    """A pool together with the policy that describes it."""

    policy: Policy
    pool: Pool

    @property
    def where(self) -> str:
        return f"pool {self.pool.name!r} of policy {self.policy.name!r} ({self.policy.source})"


def pool_refs(policies: PolicySet) -> list[PoolRef]:
    """Every (policy, pool) pair, in file order."""
    return [PoolRef(p, pool) for p in policies.policies for pool in p.pools]


# What a node needs to agree on for one config name: the device plugin's view, and for
# mps-daemon pools the daemon's view. Each entry: field label, how to read it.
_SHARED_FIELDS: tuple[tuple[str, Callable[[PoolRef], object]], ...] = (
    ("mode", lambda r: r.policy.mode.value),
    ("replicas", lambda r: r.pool.replicas),
    ("resourceName", lambda r: r.policy.resource_name),
    ("allocation", lambda r: r.policy.allocation.value),
)
_DAEMON_FIELDS: tuple[tuple[str, Callable[[PoolRef], object]], ...] = (
    ("gpuMemory", lambda r: r.pool.gpu_memory_mib),
    ("mpsDaemon", lambda r: r.policy.mps_daemon),
    ("mps", lambda r: r.policy.mps),
)


def pool_conflicts(refs: Iterable[PoolRef], key: Callable[[PoolRef], str]) -> list[str]:
    """One sentence per pair of refs with the same ``key`` whose definitions disagree."""
    return [problem for _, problem in pool_conflict_refs(refs, key)]


def pool_conflict_refs(
    refs: Iterable[PoolRef], key: Callable[[PoolRef], str]
) -> list[tuple[PoolRef, str]]:
    """``pool_conflicts`` with the later ref of each pair (``gpushare policy check`` points
    at its pool)."""
    first: dict[str, PoolRef] = {}
    problems: list[tuple[PoolRef, str]] = []
    for ref in refs:
        name = key(ref)
        seen = first.setdefault(name, ref)
        if seen is ref:
            continue
        fields = _SHARED_FIELDS
        if ref.policy.mode is Mode.MPS_DAEMON and seen.policy.mode is Mode.MPS_DAEMON:
            fields = _SHARED_FIELDS + _DAEMON_FIELDS
        for label, read in fields:
            if read(seen) != read(ref):
                problem = (
                    f"{ref.where} and {seen.where} both define device-plugin config "
                    f"{name!r} but disagree on {label} ({read(ref)!r} vs {read(seen)!r}): "
                    "one node group gets one config, so make them agree or give one pool "
                    "its own devicePluginConfig name."
                )
                problems.append((ref, problem))
                break
    return problems


def find_daemon_pool(
    policies: PolicySet, *, pool_name: str | None, node_config_label: str | None
) -> PoolRef:
    """The mps-daemon pool this node serves: ``--pool`` by pool name, else the node's
    ``nvidia.com/device-plugin.config`` label by config name.

    That label is how a node picks a named config of the GPU Operator's
    ``devicePlugin.config`` ConfigMap (GPU Operator docs, "Time-Slicing GPUs"), so the pool
    whose config the node runs is the pool its daemon serves.
    """
    refs = pool_refs(policies)
    if pool_name is not None:
        matches = [r for r in refs if r.pool.name == pool_name]
        asked = f"--pool {pool_name}"
    elif node_config_label is not None:
        matches = [r for r in refs if r.pool.config_name == node_config_label]
        asked = f"node label {DEVICE_PLUGIN_CONFIG_LABEL}={node_config_label}"
    else:
        raise NodeSetupError(
            "Cannot tell which pool this node serves: pass --pool NAME, or label the node "
            f"{DEVICE_PLUGIN_CONFIG_LABEL}=<config name> as for the GPU Operator."
        )
    if not matches:
        known = sorted({r.pool.name for r in refs if r.policy.mode is Mode.MPS_DAEMON})
        raise NodeSetupError(
            f"No policy defines the pool of {asked}. Pools of mps-daemon policies: "
            f"{', '.join(known) or 'none'}; fix the flag or label, or add the pool to a policy."
        )
    daemon = [r for r in matches if r.policy.mode is Mode.MPS_DAEMON]
    if not daemon:
        other = matches[0]
        raise NodeSetupError(
            f"{other.where} is in mode {other.policy.mode.value}, not mps-daemon, so no "
            "gpushare MPS daemon should run for it: keep the DaemonSet off this node or "
            "change the policy's mode to mps-daemon."
        )
    if len(daemon) != len(matches):
        other = next(r for r in matches if r.policy.mode is not Mode.MPS_DAEMON)
        raise NodeSetupError(
            f"{asked} matches {daemon[0].where} (mps-daemon) and {other.where} (mode "
            f"{other.policy.mode.value}); one node group cannot be both: rename one pool."
        )
    problems = pool_conflicts(daemon, key=lambda r: r.pool.config_name)
    if problems:
        raise InvalidPoliciesError(" ".join(problems))
    return daemon[0]
