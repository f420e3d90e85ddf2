"""What the other device plugins' schemes share: the share a request stands for (a part of
one GPU and/or an amount of memory), its bounds, and the base class of their modes.

A scheme counts in its own units (vGPUs, vcuda cores and 256 MiB blocks, GiB, MiB,
percent); every conversion here and in the modes rounds UP, so a pod never gets less than
it asked for, and a mode refuses an ask below its smallest unit instead of silently
doubling it (docs/schemes.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from webhook.constants import FRACTION_ANNOTATION, MEMORY_ANNOTATION
from webhook.core.modes.base import ContainerResource, ModeChanges, ModeProfile, one_device_only
from webhook.core.placement import Placement, format_fraction
from webhook.core.policy.model import Policy, Pool
from webhook.core.policy.schemes import SchemeSettings
from webhook.core.request import GpuRequest

# Float slack, as in ``placement``: "0.25" of 100 cores is 25, not 26.
EPSILON = 1e-9
# gpu-fraction and gpu-memory agree when they differ by at most this share of the memory.
_AGREEMENT_TOLERANCE = 0.01


@dataclass(frozen=True)
class Share:
    """A request as a part of one GPU and as memory; either may be unknown (None)."""

    fraction: float | None
    memory_mib: float | None


def settings(policy: Policy) -> SchemeSettings:
    """The policy's scheme sections (a scheme mode's policy always has them)."""
    assert policy.schemes is not None, "scheme modes are built with their settings"
    return policy.schemes


def asked(request: GpuRequest) -> str:
    """The annotation a request came from, quoted, for messages."""
    if request.fraction is not None:
        return f'{FRACTION_ANNOTATION} "{request.fraction_text}"'
    return f'{MEMORY_ANNOTATION} "{request.memory_text}"'


def read_share(policy: Policy, request: GpuRequest) -> Share | list[str]:
    """The share a request stands for on the policy's GPUs (spec.gpuMemory), with the
    policy's bounds and the two annotations' agreement checked."""
    gpu_memory = settings(policy).gpu_memory_mib
    fraction, memory = request.fraction, request.memory_mib
    if fraction is not None and memory is not None:
        if gpu_memory is None:
            return [
                f'{FRACTION_ANNOTATION} "{request.fraction_text}" and {MEMORY_ANNOTATION} '
                f'"{request.memory_text}" cannot be checked against each other: policy '
                f"{policy.name!r} declares no gpuMemory. Keep only one of the two annotations."
            ]
        implied = fraction * gpu_memory
        if abs(implied - memory) > _AGREEMENT_TOLERANCE * memory:
            return [
                f'{FRACTION_ANNOTATION} "{request.fraction_text}" means {math.floor(implied)}Mi '
                f"of policy {policy.name!r}'s {gpu_memory}Mi GPUs, but {MEMORY_ANNOTATION} "
                f'says "{request.memory_text}": keep only one of the two annotations.'
            ]
    if fraction is None and memory is not None and gpu_memory is not None:
        fraction = memory / gpu_memory
    if memory is None and fraction is not None and gpu_memory is not None:
        memory = fraction * gpu_memory
    if fraction is not None:
        if fraction + EPSILON < policy.min_fraction:
            return [
                f"{_of_gpu(request, fraction)} is below the smallest share policy "
                f"{policy.name!r} allows ({format_fraction(policy.min_fraction)}): ask for at "
                "least that much."
            ]
        if fraction > policy.max_fraction + EPSILON:
            return [
                f"{_of_gpu(request, fraction)} is above the largest share policy "
                f"{policy.name!r} allows ({format_fraction(policy.max_fraction)}): ask for "
                "less, or for whole GPUs."
            ]
    return Share(fraction, memory)


def _of_gpu(request: GpuRequest, fraction: float) -> str:
    if request.fraction is not None:
        return asked(request)
    return f"{asked(request)} ({format_fraction(fraction)} of a GPU)"


def units_up(amount: float, unit: float) -> int:
    """``amount`` in whole ``unit``s, rounded up (never less than asked)."""
    return max(1, math.ceil(amount / unit - EPSILON))


def scheme_placement(
    policy: Policy,
    share: Share,
    units: int,
    units_per_gpu: int,
    note: str,
    devices: int = 1,
) -> Placement:
    """The ``Placement`` a scheme mode hands to planning: its units as slots of a pool named
    after the mode (no device-plugin pool exists), the share and memory asked."""
    pool = Pool(
        name=policy.mode.value,
        replicas=units_per_gpu,
        gpu_memory_mib=settings(policy).gpu_memory_mib,
    )
    return Placement(
        pool,
        units,
        share.fraction if share.fraction is not None else 0.0,
        asked_memory_mib=share.memory_mib,
        share_known=share.fraction is not None,
        devices=devices,
        note=note,
    )


class SchemeMode:
    """Base of the other schemes' modes: one share of one GPU unless the mode overrides
    ``several_devices``; whole GPUs as the policy's ``wholeGpus`` resource (the NVIDIA
    device plugin's, on other nodes) unless the mode overrides ``whole_gpu_changes``."""

    several_devices = False

    def device_problem(self, policy: Policy, request: GpuRequest) -> list[str]:
        if request.devices > 1 and not self.several_devices:
            return [one_device_only(policy, request)]
        return []

    def whole_gpus(self, policy: Policy, count: int) -> tuple[ContainerResource, ...]:
        return ((policy.whole_gpus.resource_name, count),)

    def whole_gpu_changes(self, policy: Policy, count: int) -> ModeChanges | str:
        """What a pod asking for ``count`` whole GPUs gets, or why the mode refuses it."""
        return ModeChanges(resources=self.whole_gpus(policy, count))

    def profile(self, policy: Policy) -> ModeProfile:  # pragma: no cover - every mode has one
        raise NotImplementedError
