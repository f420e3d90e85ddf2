"""The driver-enforced memory limit the pool modes write: ``NVIDIA_GPU_MEMORY_REQUEST`` and
``NVIDIA_GPU_MEMORY_LIMIT`` in whole MiB, and the node label that places a pod only where the
node enforces them (policy ``enforcement``, docs/enforcement.md).

nvidia-container-toolkit's ``apply-cuda-memory-limits`` CDI hook reads both from the
container's OCI spec and has the driver cap the container's cgroup; the process cannot lift
it. The limit is the share of what a GPU leaves to pods: its memory less what the driver and
the CUDA context keep (``enforcement.reservedMemory``), so pods sized to exact fractions all
fit on one GPU. The request equals the limit: a share is a fixed slice, not a burstable one.
"""

from __future__ import annotations

import math
from dataclasses import replace

from webhook.constants import (
    DRIVER_LIMIT_LABEL,
    DRIVER_MEMORY_LIMIT_VAR,
    DRIVER_MEMORY_REQUEST_VAR,
    FRACTION_ANNOTATION,
    GFD_PRODUCT_LABEL,
    MEMORY_ANNOTATION,
)
from webhook.core.modes.base import DevicePluginSlots, EnvSetting
from webhook.core.placement import Placement, format_fraction
from webhook.core.policy.model import Policy, Pool
from webhook.core.request import GpuRequest

# The node selector of a policy whose pods run only where the driver limit is enforced.
ENFORCING_NODES = {DRIVER_LIMIT_LABEL: "true"}


def usable_memory_mib(policy: Policy, pool: Pool) -> int | None:
    """What one GPU of the pool leaves to pods: its memory less the reservation of its
    model (the pool's ``nvidia.com/gpu.product`` selector); None where the pool declares no
    memory."""
    if pool.gpu_memory_mib is None:
        return None
    product = pool.node_selector.get(GFD_PRODUCT_LABEL)
    return pool.gpu_memory_mib - policy.enforcement.reserved_mib(product)


def slot_limit_mib(policy: Policy, placement: Placement) -> int | None:
    """The most a pod's slots may hold: their share of the GPU's usable memory."""
    usable = usable_memory_mib(policy, placement.pool)
    if usable is None:
        return None
    return math.floor(placement.granted * usable)


def driver_limit_mib(policy: Policy, placement: Placement) -> int | None:
    """Whole MiB of the pod's limit; None where its memory is unknown.

    A ``gpu-memory`` ask is its own size (rounded up to a MiB, never above its slots' share);
    a fraction is that fraction of the GPU's usable memory, rounded down.
    """
    bound = slot_limit_mib(policy, placement)
    if placement.asked_memory_mib is not None:
        asked = max(1, math.ceil(placement.asked_memory_mib - 1e-9))
        return asked if bound is None else min(asked, bound)
    usable = usable_memory_mib(policy, placement.pool)
    if usable is None or not placement.share_known:
        return None
    return max(1, math.floor(placement.fraction * usable + 1e-9))


def driver_limits(policy: Policy, placement: Placement) -> tuple[EnvSetting, ...]:
    """The two variables, enforced (a user's value is replaced), or none."""
    enforcement = policy.enforcement
    if not enforcement.writes_driver_limit:
        return ()
    limit = driver_limit_mib(policy, placement)
    if limit is None:
        return ()
    pool = placement.pool
    reserved = (pool.gpu_memory_mib or 0) - (usable_memory_mib(policy, pool) or 0)
    if placement.asked_memory_mib is not None:
        derivation = f"the {MEMORY_ANNOTATION} ask in whole MiB"
    else:
        derivation = (
            f"floor({format_fraction(placement.fraction)} x ({pool.gpu_memory_mib}Mi of pool "
            f"{pool.name!r} - {reserved}Mi reserved))"
        )
    value = str(limit)
    return (
        EnvSetting(DRIVER_MEMORY_REQUEST_VAR, value, enforced=True, derivation=derivation),
        EnvSetting(DRIVER_MEMORY_LIMIT_VAR, value, enforced=True, derivation=derivation),
    )


def enforcing_selector(policy: Policy) -> dict[str, str]:
    """The node label a pod needs where the policy requires enforcement; empty otherwise."""
    return dict(ENFORCING_NODES) if policy.enforcement.requires_enforcing_nodes else {}


def unenforceable(policy: Policy, request: GpuRequest, placement: Placement) -> list[str]:
    """Why the policy cannot give this placement a driver limit it must have: a fraction on
    a pool of unknown memory, or a memory ask larger than its slots' usable share."""
    enforcement = policy.enforcement
    if not enforcement.writes_driver_limit:
        return []
    pool = placement.pool
    bound = slot_limit_mib(policy, placement)
    if placement.asked_memory_mib is not None:
        if bound is not None and math.ceil(placement.asked_memory_mib - 1e-9) > bound:
            return [
                f'{MEMORY_ANNOTATION} "{request.memory_text}" is more than {placement.slots} '
                f"slot(s) of pool {pool.name!r} hold once the driver and CUDA context keep "
                f"their share ({bound}Mi, enforcement.reservedMemory of policy "
                f"{policy.name!r}): ask for at most {bound}Mi."
            ]
        return []
    if not enforcement.needs_known_memory or driver_limit_mib(policy, placement) is not None:
        return []
    asked = (
        f'{FRACTION_ANNOTATION} "{request.fraction_text}"'
        if request.fraction_text is not None
        else f'{MEMORY_ANNOTATION} "{request.memory_text}"'
    )
    return [
        f"{asked} needs a driver memory limit in MiB (policy {policy.name!r}: "
        f"enforcement.driverMemoryLimit: {enforcement.driver_memory_limit.value}), but pool "
        f"{pool.name!r} declares no gpuMemory, so that share's size is unknown: declare the "
        "pool's gpuMemory (or spec.gpuMemory), or ask with gpu-memory instead."
    ]


class EnforcedSlots(DevicePluginSlots):
    """The pool modes: the device plugin's slots, whose share the driver limit covers."""

    def place(self, policy: Policy, request: GpuRequest) -> Placement | list[str]:
        placement = super().place(policy, request)
        if isinstance(placement, list) or not policy.enforcement.writes_driver_limit:
            return placement
        if request.memory_mib is not None and placement.asked_memory_mib is None:
            # The limit of a memory ask is the ask itself, not its share of a pool's GPU.
            placement = replace(placement, asked_memory_mib=request.memory_mib)
        return unenforceable(policy, request, placement) or placement
