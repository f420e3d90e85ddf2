"""The small interface every sharing mode implements, the values it returns, and the node
labels every mode selects.

A mode says what a pod placed on one of its pools needs beyond the shared resource itself:
node labels to select, env (hard limits marked ``enforced``), volumes and pod flags. New
schemes (AWS vGPU, vcuda, HAMi, ...) become one more module behind this interface; what
several modes share lives here or in a module of its own, never in a sibling mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from webhook.constants import GFD_REPLICAS_LABEL, GFD_STRATEGY_LABEL
from webhook.core.placement import Placement
from webhook.core.policy.model import Mode, Policy, frozen_map


@dataclass(frozen=True)
class EnvSetting:
    name: str
    value: str
    # Enforced values overwrite what the user set (MPS hard limits); others never do.
    enforced: bool = False
    # How the value was computed, for ``gpushare explain``.
    derivation: str = ""


@dataclass(frozen=True)
class ModeChanges:
    node_selector: Mapping[str, str] = field(default_factory=frozen_map)
    env: tuple[EnvSetting, ...] = ()
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    host_ipc: bool = False
    warnings: tuple[str, ...] = ()


class SharingMode(Protocol):
    mode: Mode

    def changes(self, policy: Policy, placement: Placement) -> ModeChanges:
        """What a pod with this placement needs, beyond the shared resource."""
        ...


def pool_selector(placement: Placement, strategy: str) -> dict[str, str]:
    """GPU Feature Discovery labels of the pool's nodes, plus the pool's own selector."""
    return {
        GFD_REPLICAS_LABEL: str(placement.pool.replicas),
        GFD_STRATEGY_LABEL: strategy,
        **placement.pool.node_selector,
    }
