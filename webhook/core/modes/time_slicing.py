"""NVIDIA device plugin time-slicing: slots of a GPU, no memory or compute isolation."""

from __future__ import annotations

from webhook.constants import (
    GFD_REPLICAS_LABEL,
    GFD_STRATEGY_LABEL,
)
from webhook.core.modes.base import ModeChanges
from webhook.core.placement import Placement
from webhook.core.policy.model import (
    Mode,
    Policy,
    frozen_map,
)


def pool_selector(placement: Placement, strategy: str) -> dict[str, str]:
    """GPU Feature Discovery labels of the pool's nodes, plus the pool's own selector."""
    return {
        GFD_REPLICAS_LABEL: str(placement.pool.replicas),
        GFD_STRATEGY_LABEL: strategy,
        **placement.pool.node_selector,
    }


class TimeSlicing:
    mode = Mode.TIME_SLICING

    def changes(self, policy: Policy, placement: Placement) -> ModeChanges:
        return ModeChanges(node_selector=frozen_map(pool_selector(placement, "time-slicing")))
