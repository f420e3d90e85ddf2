"""NVIDIA device plugin MPS: the plugin runs the daemon and sets per-slot limits; each pod
gets client limits that can only tighten them (CUDA MPS docs, "client limits").

The plugin itself injects CUDA_MPS_PIPE_DIRECTORY and the /dev/shm mount, so this mode adds
neither (k8s-device-plugin ``cmd/mps-control-daemon``; #843: pods need no hostIPC).
"""

from __future__ import annotations

from webhook.core.modes.base import ModeChanges, ModeProfile, pool_selector
from webhook.core.modes.client_limits import mps_limits
from webhook.core.modes.driver_limits import (
    EnforcedSlots,
    driver_limit_notes,
    driver_limits,
    enforcing_selector,
    enforcing_warnings,
)
from webhook.core.placement import Placement
from webhook.core.policy.model import Mode, Policy, frozen_map


class DevicePluginMps(EnforcedSlots):
    mode = Mode.MPS

    def changes(self, policy: Policy, placement: Placement) -> ModeChanges:
        return ModeChanges(
            resources=self.slot_resources(policy, placement),
            node_selector=frozen_map(
                {**pool_selector(placement, "mps"), **enforcing_selector(policy)}
            ),
            env=(*mps_limits(policy, placement), *driver_limits(policy, placement)),
            explanation=driver_limit_notes(policy, placement),
            warnings=enforcing_warnings(policy, placement),
            record=self.slot_record(policy, placement),
        )

    def profile(self, policy: Policy) -> ModeProfile:
        return ModeProfile(
            isolation="memory: hard (MPS pinned device memory limit); compute: capped "
            "(MPS active thread percentage); one MPS server per GPU shares fault domain",
            node_requirements="NVIDIA device plugin with sharing.mps replicas per pool and "
            "its mps-control-daemon (gpushare device-plugin-config), GPU Feature Discovery",
        )
