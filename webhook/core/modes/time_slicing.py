"""NVIDIA device plugin time-slicing: slots of a GPU, no memory or compute isolation."""

from __future__ import annotations

from webhook.core.modes.base import ModeChanges, ModeProfile, pool_selector
from webhook.core.modes.driver_limits import (
    EnforcedSlots,
    driver_limit_notes,
    driver_limits,
    enforcing_selector,
    enforcing_warnings,
)
from webhook.core.placement import Placement
from webhook.core.policy.model import Mode, Policy, frozen_map


class TimeSlicing(EnforcedSlots):
    mode = Mode.TIME_SLICING

    def changes(self, policy: Policy, placement: Placement) -> ModeChanges:
        return ModeChanges(
            resources=self.slot_resources(policy, placement),
            node_selector=frozen_map(
                {**pool_selector(placement, "time-slicing"), **enforcing_selector(policy)}
            ),
            env=driver_limits(policy, placement),
            explanation=driver_limit_notes(policy, placement),
            warnings=enforcing_warnings(policy, placement),
            record=self.slot_record(policy, placement),
        )

    def profile(self, policy: Policy) -> ModeProfile:
        return ModeProfile(
            isolation="none: time-sliced, any pod can use all memory and SMs (framework "
            "env asks apps to stay within their share)",
            node_requirements="NVIDIA device plugin with sharing.timeSlicing replicas per "
            "pool (gpushare device-plugin-config), GPU Feature Discovery labels",
        )
