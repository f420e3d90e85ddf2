"""Sharing modes, one module each, all behind ``base.SharingMode``.

This is the package's face: the rest of the core imports only the names below.
"""

from webhook.core.modes.aliyun_gpushare import AliyunGpushare
from webhook.core.modes.aws_vgpu import AwsVirtualGpu
from webhook.core.modes.base import (
    ContainerResource,
    EnvSetting,
    ModeChanges,
    ModeProfile,
    SharingMode,
)
from webhook.core.modes.dra import DraConsumableMemory, namespace_templates, share_of_claim
from webhook.core.modes.hami import Hami
from webhook.core.modes.kai import KaiHandOver
from webhook.core.modes.mps import DevicePluginMps
from webhook.core.modes.mps_daemon import PIPE_VOLUME, GpushareMpsDaemon
from webhook.core.modes.scheme_share import SchemeMode
from webhook.core.modes.tencent_vcuda import TencentVcuda
from webhook.core.modes.time_slicing import TimeSlicing
from webhook.core.placement import Placement
from webhook.core.policy.model import Mode, Policy
from webhook.core.request import GpuRequest

MODES: dict[Mode, SharingMode] = {
    Mode.TIME_SLICING: TimeSlicing(),
    Mode.MPS: DevicePluginMps(),
    Mode.MPS_DAEMON: GpushareMpsDaemon(),
    Mode.AWS_VGPU: AwsVirtualGpu(),
    Mode.TENCENT_VCUDA: TencentVcuda(),
    Mode.ALIYUN_GPUSHARE: AliyunGpushare(),
    Mode.HAMI: Hami(),
    Mode.KAI: KaiHandOver(),
    Mode.DRA: DraConsumableMemory(),
}


def place_request(policy: Policy, request: GpuRequest) -> Placement | list[str]:
    """The share the policy's sharing mode makes of a request for part of a GPU."""
    return MODES[policy.mode].place(policy, request)


def mode_changes(policy: Policy, placement: Placement) -> ModeChanges:
    """What the policy's sharing mode needs for a pod with this placement."""
    return MODES[policy.mode].changes(policy, placement)


def whole_gpu_resources(policy: Policy, count: int) -> tuple[ContainerResource, ...]:
    """The container resources of ``count`` whole GPUs under the policy's sharing mode."""
    return MODES[policy.mode].whole_gpus(policy, count)


def whole_gpu_changes(policy: Policy, count: int) -> ModeChanges | str:
    """What ``count`` whole GPUs are under the policy's mode, or why it refuses them:
    the other schemes may need more than resources (a scheduler, a label)."""
    mode = MODES[policy.mode]
    if isinstance(mode, SchemeMode):
        return mode.whole_gpu_changes(policy, count)
    return ModeChanges(resources=mode.whole_gpus(policy, count))


def shares_several_gpus(policy: Policy) -> bool:
    """Whether the policy's mode gives a share on each of several GPUs
    (gpu-fraction-num-devices above 1); the others give a share of one GPU."""
    mode = MODES[policy.mode]
    return isinstance(mode, SchemeMode) and mode.several_devices


def mode_profile(policy: Policy) -> ModeProfile:
    """What the policy's sharing mode isolates and needs on the nodes."""
    return MODES[policy.mode].profile(policy)


__all__ = [
    "MODES",
    "PIPE_VOLUME",
    "ContainerResource",
    "EnvSetting",
    "ModeChanges",
    "ModeProfile",
    "SharingMode",
    "mode_changes",
    "mode_profile",
    "namespace_templates",
    "place_request",
    "share_of_claim",
    "shares_several_gpus",
    "whole_gpu_changes",
    "whole_gpu_resources",
]
