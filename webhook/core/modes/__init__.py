"""Sharing modes, one module each, all behind ``base.SharingMode``."""

from webhook.core.modes.base import EnvSetting, ModeChanges, SharingMode
from webhook.core.modes.mps import (
    DevicePluginMps,
)
from webhook.core.modes.mps_daemon import GpushareMpsDaemon
from webhook.core.modes.time_slicing import TimeSlicing
from webhook.core.policy.model import Mode

MODES: dict[Mode, SharingMode] = {
    Mode.TIME_SLICING: TimeSlicing(),
    Mode.MPS: DevicePluginMps(),
    Mode.MPS_DAEMON: GpushareMpsDaemon(),
}

__all__ = ["MODES", "MPS_LIMIT_VARS", "EnvSetting", "ModeChanges", "SharingMode"]
