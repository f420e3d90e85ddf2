"""The driver-enforced memory limit the pool modes write: ``NVIDIA_GPU_MEMORY_REQUEST`` and
``NVIDIA_GPU_MEMORY_LIMIT`` in whole MiB, and the node label that places a pod only where the
node enforces them (policy ``enforcement``, docs/enforcement.md).

nvidia-container-toolkit's ``apply-cuda-memory-limits`` CDI hook reads both from the
container's OCI spec and has the driver cap the container's cgroup; the process cannot lift
it. The limit is the share of what a GPU leaves to pods: its memory less what the driver and
the CUDA context keep (``enforcement.reservedMemory``), so pods sized to exact fractions all
fit on one GPU; a ``gpu-memory`` ask is placed as its share of that usable memory, so it takes
slots that hold it. The request equals the limit: a share is a fixed slice, not a burstable
one.
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
from webhook.core.placement import Placement, format_fraction, place
from webhook.core.policy.enforcement import DriverMemoryLimit
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
        memory = f"{pool.gpu_memory_mib}Mi of pool {pool.name!r}"
        if reserved:
            memory = f"({memory} - {reserved}Mi reserved)"
        derivation = f"floor({format_fraction(placement.fraction)} x {memory})"
    value = str(limit)
    return (
        EnvSetting(DRIVER_MEMORY_REQUEST_VAR, value, enforced=True, derivation=derivation),
        EnvSetting(DRIVER_MEMORY_LIMIT_VAR, value, enforced=True, derivation=derivation),
    )


def driver_limit_notes(policy: Policy, placement: Placement) -> tuple[str, ...]:
    """``gpushare explain`` lines: the driver limit (or why there is none) and, under
    ``require``, the placement on nodes that enforce it."""
    setting = policy.enforcement.driver_memory_limit
    where = f"enforcement.driverMemoryLimit: {setting.value} of policy {policy.name!r}"
    limit = driver_limit_mib(policy, placement) if setting is not DriverMemoryLimit.OFF else None
    if limit is not None:
        notes = [
            f"driver memory limit: {limit}Mi in {DRIVER_MEMORY_REQUEST_VAR} and "
            f"{DRIVER_MEMORY_LIMIT_VAR}, which nvidia-container-toolkit's CDI hook has the "
            f"driver enforce where the node supports it ({where})"
        ]
    elif setting is DriverMemoryLimit.OFF:
        notes = [f"driver memory limit: none ({where})"]
    else:
        notes = [
            f"driver memory limit: none, since pool {placement.pool.name!r} declares no "
            f"gpuMemory and the share's size is unknown ({where}; declare gpuMemory to have "
            "the driver cap the pod)"
        ]
    if policy.enforcement.requires_enforcing_nodes:
        notes.append(
            f"placement: only nodes labelled {DRIVER_LIMIT_LABEL}=true, where the node agent "
            f"found the driver limit enforced ({where}: with no such node the pod stays "
            "Pending rather than run uncapped)"
        )
    return tuple(notes)


def enforcing_warnings(policy: Policy, placement: Placement) -> tuple[str, ...]:
    """Under ``require``, the developer's word on where the pod may run: a Pending pod's
    scheduler event only says the node selector matched no free node, so the admission
    warning names the label and what it stands for (< 120 characters)."""
    if not policy.enforcement.requires_enforcing_nodes:
        return ()
    limit = driver_limit_mib(policy, placement)
    capped = f"its {limit}Mi" if limit is not None else "the limit"
    return (f"runs only on nodes labelled {DRIVER_LIMIT_LABEL}=true (driver enforces {capped})",)


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


def _reserving(policy: Policy, request: GpuRequest) -> bool:
    """A memory-only ask under a policy whose driver limit keeps a reservation on a pool."""
    return (
        request.fraction is None
        and request.memory_mib is not None
        and policy.enforcement.writes_driver_limit
        and any(
            pool.gpu_memory_mib is not None
            and usable_memory_mib(policy, pool) != pool.gpu_memory_mib
            for pool in policy.pools
        )
    )


def _place_against_usable_memory(policy: Policy, request: GpuRequest) -> Placement | list[str]:
    """A memory ask placed as its share of what each pool's GPUs leave to pods, so it takes
    the slots that hold it once the reservation is kept (under ``count``, one more slot
    rather than a refusal); the placement keeps the policy's own pool."""
    usable = tuple(
        replace(pool, gpu_memory_mib=max(1, usable_memory_mib(policy, pool) or 0))
        if pool.gpu_memory_mib is not None
        else pool
        for pool in policy.pools
    )
    placement = place(replace(policy, pools=usable), request)
    if isinstance(placement, list):
        return placement
    index = next(i for i, pool in enumerate(usable) if pool is placement.pool)
    return replace(placement, pool=policy.pools[index])


class EnforcedSlots(DevicePluginSlots):
    """The pool modes: the device plugin's slots, whose share the driver limit covers."""

    def place(self, policy: Policy, request: GpuRequest) -> Placement | list[str]:
        if request.devices <= 1 and _reserving(policy, request):
            placement = _place_against_usable_memory(policy, request)
        else:
            placement = super().place(policy, request)
        if isinstance(placement, list) or not policy.enforcement.writes_driver_limit:
            return placement
        if request.memory_mib is not None and placement.asked_memory_mib is None:
            # The limit of a memory ask is the ask itself, not its share of a pool's GPU.
            placement = replace(placement, asked_memory_mib=request.memory_mib)
        return unenforceable(policy, request, placement) or placement
