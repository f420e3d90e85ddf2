"""MPS client limits: the hard per-pod limits both MPS modes put in the pod's env.

Client limits can only tighten what the MPS daemon allows (CUDA MPS docs, "client limits").
"""

from __future__ import annotations

import math

from webhook.constants import MPS_MEMORY_LIMIT_VAR, MPS_THREAD_PERCENTAGE_VAR
from webhook.core.modes.base import EnvSetting
from webhook.core.placement import Placement, format_fraction
from webhook.core.policy.model import Policy


def mps_limits(policy: Policy, placement: Placement) -> tuple[EnvSetting, ...]:
    """Hard client limits for the fraction asked (not the slot), on device ordinal 0.

    Ordinal 0 because the container sees only the GPU it was given; the format "0=4096M"
    needs CUDA 11.5 or newer.
    """
    limits: list[EnvSetting] = []
    share = format_fraction(placement.fraction)
    if policy.mps.enforce_thread_percentage:
        overprovision = policy.mps.thread_overprovision
        percent = max(1, min(100, math.floor(placement.fraction * 100 * overprovision + 1e-9)))
        limits.append(
            EnvSetting(
                MPS_THREAD_PERCENTAGE_VAR,
                str(percent),
                enforced=True,
                derivation=f"floor({share} x 100 x overprovision {overprovision:g}), 1..100",
            )
        )
    memory = placement.memory_mib
    if policy.mps.enforce_memory_limit and memory is not None:
        limits.append(
            EnvSetting(
                MPS_MEMORY_LIMIT_VAR,
                f"0={max(1, memory)}M",
                enforced=True,
                derivation=f"floor({share} x {placement.pool.gpu_memory_mib}Mi of pool "
                f"{placement.pool.name!r}) on device 0",
            )
        )
    return tuple(limits)
