"""Tencent (tkestack) gpu-manager: a share is ``tencent.com/vcuda-core`` (100 = one GPU:
pkg/device/nvidia/tree.go HundredCore) plus ``tencent.com/vcuda-memory`` (1 = 256 MiB:
pkg/types/types.go MemoryBlockSize 268435456), in requests and limits alike (README).

gpu-manager refuses a share with cores or memory at zero (pkg/services/allocator/nvidia/
allocator.go: "cores or memory is zero is not permitted in share mode"), so both are always
set: cores = ceil(f x 100), memory = ceil(MiB / 256) blocks, rounded up; an ask under one
256 MiB block is refused rather than more than doubled. Above 100 cores only multiples of
100 are valid (allocator.go), so a share is one GPU; whole GPUs are 100 cores each.

The vcuda library enforces both limits and reports the memory limit as the device's total
(tkestack/vcuda-controller src/hijack_call.c: cuMemGetInfo_v2, cuDeviceTotalMem_v2), so
frameworks already size themselves to the share: gpushare adds no framework fraction (it
would be a fraction of the share). ``tencent.com/vcuda-core-limit`` (a pod annotation,
pkg/services/virtual-manager/manager.go) turns the hard core limit into a soft one with that
ceiling, where the policy sets ``tencentVcuda.coreLimit``.
"""

from __future__ import annotations

from webhook.core.modes.base import ModeChanges, ModeProfile, frozen_record
from webhook.core.modes.scheme_share import (
    SchemeMode,
    asked,
    read_share,
    scheme_placement,
    settings,
    units_up,
)
from webhook.core.placement import Placement, format_fraction
from webhook.core.policy.model import Mode, Policy, frozen_map
from webhook.core.policy.schemes import (
    VCUDA_CORE_LIMIT_ANNOTATION,
    VCUDA_CORE_RESOURCE,
    VCUDA_CORES_PER_GPU,
    VCUDA_MEMORY_RESOURCE,
    VCUDA_MEMORY_UNIT_MIB,
)
from webhook.core.request import GpuRequest


class TencentVcuda(SchemeMode):
    mode = Mode.TENCENT_VCUDA

    def place(self, policy: Policy, request: GpuRequest) -> Placement | list[str]:
        problems = self.device_problem(policy, request)
        if problems:
            return problems
        share = read_share(policy, request)
        if isinstance(share, list):
            return share
        # The rules require gpuMemory, so both sides of the share are known.
        assert share.fraction is not None and share.memory_mib is not None
        if share.memory_mib < VCUDA_MEMORY_UNIT_MIB:
            return [
                f"{asked(request)} is {format_fraction(share.memory_mib)}Mi, under one "
                f"tencent.com/vcuda-memory block ({VCUDA_MEMORY_UNIT_MIB}Mi), the smallest "
                "memory gpu-manager can give: ask for at least "
                f"{VCUDA_MEMORY_UNIT_MIB}Mi."
            ]
        cores = units_up(share.fraction * VCUDA_CORES_PER_GPU, 1)
        note = (
            f"{cores} vcuda-core (ceil({format_fraction(share.fraction)} x 100)) and "
            f"{units_up(share.memory_mib, VCUDA_MEMORY_UNIT_MIB)} vcuda-memory blocks "
            f"(ceil({format_fraction(share.memory_mib)}Mi / {VCUDA_MEMORY_UNIT_MIB}Mi))"
        )
        return scheme_placement(policy, share, cores, VCUDA_CORES_PER_GPU, note)

    def changes(self, policy: Policy, placement: Placement) -> ModeChanges:
        assert placement.asked_memory_mib is not None or placement.memory_mib is not None
        memory = (
            placement.asked_memory_mib
            if placement.asked_memory_mib is not None
            else float(placement.memory_mib or 0)
        )
        resources = (
            (VCUDA_CORE_RESOURCE, placement.slots),
            (VCUDA_MEMORY_RESOURCE, units_up(memory, VCUDA_MEMORY_UNIT_MIB)),
        )
        annotations = {}
        limit = settings(policy).tencent_vcuda.core_limit
        if limit is not None:
            annotations[VCUDA_CORE_LIMIT_ANNOTATION] = str(max(limit, placement.slots))
        return ModeChanges(
            resources=resources,
            annotations=frozen_map(annotations),
            record=frozen_record({"resources": dict(resources)}),
            frameworks=False,
        )

    def whole_gpu_changes(self, policy: Policy, count: int) -> ModeChanges | str:
        # gpu-manager nodes advertise no nvidia.com/gpu: a whole GPU is 100 cores.
        resources = ((VCUDA_CORE_RESOURCE, count * VCUDA_CORES_PER_GPU),)
        return ModeChanges(resources=resources)

    def profile(self, policy: Policy) -> ModeProfile:
        limit = settings(policy).tencent_vcuda.core_limit
        compute = (
            f"soft, may burst to {limit} cores ({VCUDA_CORE_LIMIT_ANNOTATION})"
            if limit is not None
            else "hard limit at vcuda-core"
        )
        return ModeProfile(
            isolation=f"memory: hard (vcuda library, reports the limit as the GPU's memory); "
            f"compute: {compute}",
            node_requirements="tkestack gpu-manager DaemonSet (vcuda library) on nodes "
            "labelled nvidia-device-enable=enable, and the gpu-admission scheduler extender; "
            "not beside the NVIDIA device plugin",
        )
