"""HAMi: a share is ``nvidia.com/gpu`` (the number of physical GPUs the container gets: README
"Notes") with ``nvidia.com/gpumem`` (MiB per GPU) or ``nvidia.com/gpumem-percentage``
(0-100: pkg/device/nvidia/device.go validateMemoryPercentage) and ``nvidia.com/gpucores``
(percent of a GPU's compute), scheduled by ``hami-scheduler`` (charts/hami/values.yaml).

HAMi's own mutating webhook (pkg/scheduler/webhook.go) acts on every pod with those
resources: it sets ``schedulerName: hami-scheduler``, gives an exclusive ``gpucores: 100``
to a GPU asked without memory (defaultExclusiveCoreIfNeeded), adds env from its config and
checks quotas. So the two never both act on one pod, gpushare does the part a share needs
itself and labels the pod ``hami.io/webhook: ignore``, which HAMi's webhook configuration
skips (charts/hami/templates/scheduler/webhook.yaml objectSelector) - unless the policy
sets ``hami.skipHamiWebhook: false``, leaving HAMi's webhook its later pass (quota checks).

Memory as MiB (rounded up) where the share's memory is known, else as a percentage (rounded
up); cores as ceil(f x 100). HAMi-core, preloaded into the container, enforces both and
virtualizes device memory (Project-HAMi/HAMi-core README), so frameworks see their limit as
the GPU: gpushare adds no framework fraction. ``gpu-fraction-num-devices: N`` is N GPUs each
with the share, as HAMi's per-GPU gpumem and gpucores mean.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from webhook.core.modes.base import ModeChanges, ModeProfile, frozen_record
from webhook.core.modes.scheme_share import (
    EPSILON,
    SchemeMode,
    read_share,
    scheme_placement,
    settings,
    units_up,
)
from webhook.core.placement import Placement, format_fraction
from webhook.core.policy.model import Mode, Policy, frozen_map
from webhook.core.policy.schemes import (
    HAMI_CORES_RESOURCE,
    HAMI_GPU_RESOURCE,
    HAMI_MEMORY_PERCENTAGE_RESOURCE,
    HAMI_MEMORY_RESOURCE,
    HAMI_WEBHOOK_IGNORE,
    HAMI_WEBHOOK_LABEL,
    HamiMemory,
)
from webhook.core.request import GpuRequest


class Hami(SchemeMode):
    mode = Mode.HAMI
    several_devices = True

    def place(self, policy: Policy, request: GpuRequest) -> Placement | list[str]:
        share = read_share(policy, request)
        if isinstance(share, list):
            return share
        note = f"{request.devices} HAMi vGPU(s), each with " + (
            f"{format_fraction(share.fraction)} of a GPU"
            if share.fraction is not None
            else f"{format_fraction(share.memory_mib or 0)}Mi"
        )
        return scheme_placement(policy, share, request.devices, 1, note, request.devices)

    def changes(self, policy: Policy, placement: Placement) -> ModeChanges:
        hami = settings(policy).hami
        memory = placement.asked_memory_mib
        if memory is None and placement.pool.gpu_memory_mib is not None:
            memory = placement.fraction * placement.pool.gpu_memory_mib
        by_percentage = placement.share_known and (
            hami.memory is HamiMemory.PERCENTAGE or memory is None
        )
        resources: list[tuple[str, int]] = [(HAMI_GPU_RESOURCE, placement.devices)]
        if by_percentage:
            percent = min(100, units_up(placement.fraction * 100, 1))
            resources.append((HAMI_MEMORY_PERCENTAGE_RESOURCE, percent))
        else:
            assert memory is not None  # a memory ask, or a fraction of a known gpuMemory
            resources.append((HAMI_MEMORY_RESOURCE, max(1, math.ceil(memory - EPSILON))))
        if hami.cores and placement.share_known:
            resources.append((HAMI_CORES_RESOURCE, min(100, units_up(placement.fraction * 100, 1))))
        return ModeChanges(
            resources=tuple(resources),
            scheduler_name=hami.scheduler_name,
            labels=self._labels(policy),
            record=frozen_record({"resources": dict(resources)}),
            frameworks=False,
            explanation=self._explanation(policy),
        )

    def whole_gpu_changes(self, policy: Policy, count: int) -> ModeChanges | str:
        # What HAMi's webhook would do: a GPU asked without memory is exclusive (gpucores
        # 100: device.go defaultExclusiveCoreIfNeeded).
        resources = ((HAMI_GPU_RESOURCE, count), (HAMI_CORES_RESOURCE, 100))
        return ModeChanges(
            resources=resources,
            scheduler_name=settings(policy).hami.scheduler_name,
            labels=self._labels(policy),
        )

    @staticmethod
    def _labels(policy: Policy) -> Mapping[str, str]:
        if not settings(policy).hami.skip_hami_webhook:
            return frozen_map()
        return frozen_map({HAMI_WEBHOOK_LABEL: HAMI_WEBHOOK_IGNORE})

    @staticmethod
    def _explanation(policy: Policy) -> tuple[str, ...]:
        if settings(policy).hami.skip_hami_webhook:
            return (
                f"{HAMI_WEBHOOK_LABEL}={HAMI_WEBHOOK_IGNORE}: HAMi's own webhook skips this pod "
                "(gpushare set what it would)",
            )
        return ("HAMi's own webhook may still act on this pod (hami.skipHamiWebhook: false)",)

    def profile(self, policy: Policy) -> ModeProfile:
        hami = settings(policy).hami
        return ModeProfile(
            isolation="memory: hard-ish (HAMi-core in the container virtualizes device "
            "memory); compute: "
            + ("gpucores throttle" if hami.cores else "none (hami.cores: false)"),
            node_requirements="HAMi (device plugin with HAMi-core, hami-scheduler, "
            f"scheduler name {hami.scheduler_name}) instead of the NVIDIA device plugin",
            scheduler=hami.scheduler_name,
        )
