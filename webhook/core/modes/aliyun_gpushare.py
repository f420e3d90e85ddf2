"""Aliyun gpushare (AliyunContainerService/gpushare-device-plugin with
gpushare-scheduler-extender): a share is ``aliyun.com/gpu-mem`` (pkg/gpu/nvidia/const.go),
GPU memory in the unit the plugin was started with, ``--memory-unit`` GiB by default or
MiB (cmd/nvidia/main.go), on nodes labelled ``gpushare=true`` (device-plugin-ds.yaml).

Nothing is isolated: the plugin tells the container its share through env it sets itself
at Allocate (pkg/gpu/nvidia/allocate.go): ``ALIYUN_COM_GPU_MEM_CONTAINER`` (the container's
units), ``ALIYUN_COM_GPU_MEM_DEV`` (units of the whole GPU), ``ALIYUN_COM_GPU_MEM_POD`` and
``ALIYUN_COM_GPU_MEM_IDX`` (the GPU index), and applications are expected to keep within
CONTAINER / DEV of the GPU. gpushare cannot set those (the plugin does, per allocation)
but gives frameworks the same share through their own knobs, which they do read.

Memory rounds UP to whole units; an ask under one unit is refused (with GiB: ask 1Gi, or
configure the cluster's unit as MiB). A gpu-fraction needs the policy's gpuMemory.
"""

from __future__ import annotations

from webhook.core.modes.base import ModeChanges, ModeProfile, frozen_record
from webhook.core.modes.scheme_share import (
    EPSILON,
    SchemeMode,
    asked,
    read_share,
    scheme_placement,
    settings,
    units_up,
)
from webhook.core.placement import Placement, format_fraction
from webhook.core.policy.model import Mode, Policy, frozen_map
from webhook.core.policy.schemes import ALIYUN_MEMORY_RESOURCE, ALIYUN_NODE_LABEL
from webhook.core.request import GpuRequest


class AliyunGpushare(SchemeMode):
    mode = Mode.ALIYUN_GPUSHARE

    def place(self, policy: Policy, request: GpuRequest) -> Placement | list[str]:
        problems = self.device_problem(policy, request)
        if problems:
            return problems
        aliyun = settings(policy).aliyun
        unit = aliyun.unit_mib
        share = read_share(policy, request)
        if isinstance(share, list):
            return share
        if share.memory_mib is None:
            return [
                f"{asked(request)} cannot be turned into {ALIYUN_MEMORY_RESOURCE}: policy "
                f"{policy.name!r} declares no gpuMemory (the memory of one GPU). Ask with "
                "gpu-memory, or set gpuMemory in the policy."
            ]
        if share.memory_mib + EPSILON < unit:
            return [
                f"{asked(request)} is {format_fraction(share.memory_mib)}Mi, under one "
                f"{aliyun.memory_unit.value} of {ALIYUN_MEMORY_RESOURCE} (the unit policy "
                f"{policy.name!r} says the plugin counts in): ask for at least 1"
                f"{aliyun.memory_unit.value[:2]}, or set aliyunGpushare.memoryUnit: MiB if the "
                "plugin runs with --memory-unit=MiB."
            ]
        units = units_up(share.memory_mib, unit)
        gpu_memory = settings(policy).gpu_memory_mib
        per_gpu = max(1, gpu_memory // unit) if gpu_memory is not None else units
        note = (
            f"{units} {aliyun.memory_unit.value} of {ALIYUN_MEMORY_RESOURCE} "
            f"(ceil({format_fraction(share.memory_mib)}Mi / {unit}Mi))"
        )
        return scheme_placement(policy, share, units, per_gpu, note)

    def changes(self, policy: Policy, placement: Placement) -> ModeChanges:
        resources = ((ALIYUN_MEMORY_RESOURCE, placement.slots),)
        return ModeChanges(
            resources=resources,
            node_selector=frozen_map({ALIYUN_NODE_LABEL: "true"}),
            record=frozen_record({"resources": dict(resources)}),
            frameworks=placement.share_known,
        )

    def profile(self, policy: Policy) -> ModeProfile:
        return ModeProfile(
            isolation="none: apps are expected to keep to ALIYUN_COM_GPU_MEM_CONTAINER of "
            "ALIYUN_COM_GPU_MEM_DEV (the plugin's env); gpushare adds framework env where "
            "the share of a GPU is known",
            node_requirements="gpushare-device-plugin (--memory-unit="
            f"{settings(policy).aliyun.memory_unit.value}) on nodes labelled gpushare=true, "
            "and gpushare-scheduler-extender in kube-scheduler's configuration",
        )
