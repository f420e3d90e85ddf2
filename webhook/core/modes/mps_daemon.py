"""gpushare's own node-side MPS daemon: the device plugin time-slices (it only counts slots)
and ``gpushare mps-daemon`` runs MPS on the node, so the pod must reach the daemon's pipe
directory and carry the client limits itself.
"""

from __future__ import annotations

from webhook.constants import MPS_PIPE_DIRECTORY_VAR
from webhook.core.modes.base import (
    EnvSetting,
    ModeChanges,
    ModeProfile,
    pool_selector,
)
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

PIPE_VOLUME = "gpushare-mps-pipe"


class GpushareMpsDaemon(EnforcedSlots):
    mode = Mode.MPS_DAEMON

    def changes(self, policy: Policy, placement: Placement) -> ModeChanges:
        daemon = policy.mps_daemon
        selector = pool_selector(placement, "time-slicing")
        selector[daemon.ready_label] = "true"
        selector.update(enforcing_selector(policy))
        warnings: tuple[str, ...] = ()
        if daemon.host_ipc:
            warnings = (
                "hostIPC set for the MPS daemon; it breaks the Baseline Pod Security level",
            )
        pipe = EnvSetting(
            MPS_PIPE_DIRECTORY_VAR,
            daemon.pipe_directory,
            enforced=True,
            derivation=f"policy {policy.name!r} mpsDaemon.pipeDirectory",
        )
        return ModeChanges(
            resources=self.slot_resources(policy, placement),
            node_selector=frozen_map(selector),
            env=(*mps_limits(policy, placement), *driver_limits(policy, placement), pipe),
            explanation=driver_limit_notes(policy, placement),
            volumes=(
                {
                    "name": PIPE_VOLUME,
                    "hostPath": {"path": daemon.pipe_directory, "type": "Directory"},
                },
            ),
            volume_mounts=({"name": PIPE_VOLUME, "mountPath": daemon.pipe_directory},),
            host_ipc=daemon.host_ipc,
            record=self.slot_record(policy, placement),
            warnings=(*warnings, *enforcing_warnings(policy, placement)),
        )

    def profile(self, policy: Policy) -> ModeProfile:
        return ModeProfile(
            isolation="memory: hard (MPS client pinned device memory limit); compute: capped "
            "(MPS client active thread percentage); one MPS server per GPU shares fault domain",
            node_requirements="NVIDIA device plugin time-slicing replicas per pool, and "
            "gpushare mps-daemon (it labels ready nodes "
            f"{policy.mps_daemon.ready_label}=true)",
        )
