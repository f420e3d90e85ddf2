"""The memos planning keeps per policy set: one per planning step that is a pure function of
a policy and a request or placement, each named for what it holds.

They are kept here, per ``PolicySet`` (``plan_memos(policies)``), and live and die with the
policies they were computed from: keys hold ``id(policy)``, which stays unique while the set
is alive. The set itself does not hold them, so the policy model imports nothing of the
planner. Only the container-dependent rest of a plan is computed per pod.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

from webhook.core.frameworks import FrameworkEnv
from webhook.core.memo import BoundedMemo, PerObject
from webhook.core.modes import EnvSetting, ModeChanges
from webhook.core.placement import Placement
from webhook.core.policy.model import Policy, PolicySet
from webhook.core.request import GpuRequest

# id(policy), pool name, slots, fraction, node GPU memory, memory asked, devices: everything
# a mode or the framework knobs read.
PlacementKey: TypeAlias = tuple[int, str, int, float, int | None, float | None, int]


def placement_key(policy: Policy, placement: Placement) -> PlacementKey:
    return (
        id(policy),
        placement.pool.name,
        placement.slots,
        placement.fraction,
        placement.node_gpu_memory_mib,
        placement.asked_memory_mib,
        placement.devices,
    )


def _is_placement(value: Placement | list[str]) -> bool:
    return isinstance(value, Placement)


def _placements() -> BoundedMemo[tuple[int, GpuRequest], Placement | list[str]]:
    # Denials are not kept: a request that does not fit costs no memory.
    return BoundedMemo(keep=_is_placement)


@dataclass(frozen=True, slots=True)
class PlanMemos:
    """One ``BoundedMemo`` per memoized planning step."""

    # ``place`` by policy and request.
    placements: BoundedMemo[tuple[int, GpuRequest], Placement | list[str]] = field(
        default_factory=_placements
    )
    # ``mode_changes`` by policy and placement.
    mode_changes: BoundedMemo[PlacementKey, ModeChanges] = field(default_factory=BoundedMemo)
    # ``image_framework_env`` by policy, placement and the GPU container's image.
    framework_envs: BoundedMemo[tuple[PlacementKey, str], FrameworkEnv] = field(
        default_factory=BoundedMemo
    )
    # The policy's ``inject.env`` as env settings, by policy.
    inject_env: BoundedMemo[int, tuple[EnvSetting, ...]] = field(default_factory=BoundedMemo)


_BY_POLICY_SET: PerObject[PlanMemos] = PerObject(PlanMemos)


def plan_memos(policies: PolicySet) -> PlanMemos:
    """The memos of the planning steps for these policies; they go when the set goes."""
    return _BY_POLICY_SET.of(policies)
