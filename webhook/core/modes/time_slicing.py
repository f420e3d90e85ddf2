"""NVIDIA device plugin time-slicing: slots of a GPU, no memory or compute isolation."""

from __future__ import annotations

from webhook.core.modes.base import ModeChanges, pool_selector
from webhook.core.placement import Placement
from webhook.core.policy.model import Mode, Policy, frozen_map


class TimeSlicing:
    mode = Mode.TIME_SLICING

    def changes(self, policy: Policy, placement: Placement) -> ModeChanges:
        return ModeChanges(node_selector=frozen_map(pool_selector(placement, "time-slicing")))
