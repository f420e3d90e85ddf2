"""Sharing modes, one module each, all behind ``base.SharingMode``.

This is the package's face: the rest of the core imports only the names below.
"""

from webhook.core.modes.base import EnvSetting, ModeChanges, SharingMode
from webhook.core.modes.mps import DevicePluginMps
from webhook.core.modes.mps_daemon import GpushareMpsDaemon
from webhook.core.modes.time_slicing import TimeSlicing
from webhook.core.placement import Placement
from webhook.core.policy.model import Mode, Policy

MODES: dict[Mode, SharingMode] = {
    Mode.TIME_SLICING: TimeSlicing(),
    Mode.MPS: DevicePluginMps(),
    Mode.MPS_DAEMON: GpushareMpsDaemon(),
}


def mode_changes(policy: Policy, placement: Placement) -> ModeChanges:
    """What the policy's sharing mode needs for a pod with this placement."""
    return MODES[policy.mode].changes(policy, placement)


__all__ = ["MODES", "EnvSetting", "ModeChanges", "SharingMode", "mode_changes"]
