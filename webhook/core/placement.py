"""Which pool serves a request, and how many slots of its shared resource the pod takes.

A slot is 1/R of a GPU (NVIDIA device plugin replicas). Time-slicing gives no isolation and
several slots of one pod may come from different GPUs, so a fraction maps to one slot of the
pool with the smallest slice 1/R >= f ("replica-class"); only where every node has one GPU
may a pod take ceil(f*R) slots ("count").

A gpu-memory ask is a share of the GPU memory a pool declares (``gpuMemory``). Where no pool
that could take it declares any, the nodes say it: GPU Feature Discovery labels each node
with ``nvidia.com/gpu.memory``, the memory of one GPU in MiB (k8s-device-plugin v0.20.0,
``internal/lm/resource.go``: ``GetTotalMemoryMiB``, NVML's total / 2^20). The ask then takes
one slot of the pool with the largest slice, and a node affinity ``nvidia.com/gpu.memory Gt
N-1`` lets the scheduler bind it only where one slot, memory / R, holds the ask (and the ask
is within the policy's largest share): N = ceil(ask x max(R, 1/fraction.max)). The share the
pod's env is computed from (framework fractions, MPS thread share) is ask / N = min(1/R,
fraction.max): on every node the affinity admits, that share of the GPU is at least the ask
and never more than the pod's slot.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from webhook.constants import (
    FRACTION_ANNOTATION,
    GFD_MEMORY_LABEL,
    MEMORY_ANNOTATION,
)
from webhook.core.policy.model import Allocation, Policy, Pool
from webhook.core.request import (
    GpuRequest,
)

# Float slack so that "0.25" fits a 1/4 slot and "0.3333" a 1/3 slot.
_EPSILON = 1e-9
# gpu-fraction and gpu-memory agree when they differ by at most this share of the memory.
_AGREEMENT_TOLERANCE = 0.01
# No GPU has a pebibyte; a node-memory bound above it (an absurd ask) is refused, so the
# affinity's integer stays far inside the int64 Kubernetes parses Gt values into.
_LARGEST_GPU_MEMORY_MIB = 2**30


@dataclass(frozen=True)
class Placement:
    pool: Pool
    slots: int
    fraction: float  # the share of one GPU the pod asked for (from gpu-memory where given)
    # The GPU memory (MiB) a node must have, by GFD's label, where the pool declares none.
    node_gpu_memory_mib: int | None = None
    # The gpu-memory ask as read (MiB, not rounded), for modes that hand out memory units
    # themselves; None for a gpu-fraction ask.
    asked_memory_mib: float | None = None
    # False where a memory ask's share of a GPU is unknown (a scheme counting memory itself,
    # no gpuMemory declared): ``fraction`` is then 0 and means nothing.
    share_known: bool = True
    # Several GPUs each holding the share (gpu-fraction-num-devices), where a mode allows it.
    devices: int = 1
    # How a mode other than the NVIDIA device plugin's came to this share, for ``explain``.
    note: str = ""

    @property
    def reason(self) -> str:
        """Why this placement, for ``gpushare explain`` (built on demand: not on the hot path)."""
        if self.note:
            return self.note
        slots, pool = self.slots, self.pool
        taken = (
            f"pool {pool.name!r} (1/{pool.replicas} of a GPU per slot) takes {slots} slot"
            f"{'s' if slots > 1 else ''} = {format_fraction(self.granted)} of a GPU"
        )
        if self.node_gpu_memory_mib is None:
            return f"{taken} >= {format_fraction(self.fraction)} asked"
        return (
            f"{taken}, on a node whose GPUs have at least {self.node_gpu_memory_mib}Mi "
            f"({GFD_MEMORY_LABEL}; the pool declares no gpuMemory), where "
            f"{format_fraction(self.fraction)} of a GPU holds the ask"
        )

    @property
    def granted(self) -> float:
        """The share of one GPU the pod's slots stand for."""
        return self.slots / self.pool.replicas

    @property
    def memory_mib(self) -> int | None:
        if self.pool.gpu_memory_mib is None:
            return None
        return math.floor(self.fraction * self.pool.gpu_memory_mib)


@functools.lru_cache(maxsize=4096)
def format_fraction(value: float) -> str:
    """Up to four decimals, no trailing zeros: 0.5 → "0.5", 1/3 → "0.3333"."""
    text = f"{math.floor(value * 10000 + _EPSILON) / 10000:.4f}".rstrip("0").rstrip(".")
    return text or "0"


def _requested_fraction(request: GpuRequest, pool: Pool) -> float | None:
    if request.fraction is not None:
        return request.fraction
    if request.memory_mib is None or pool.gpu_memory_mib is None:
        return None
    return request.memory_mib / pool.gpu_memory_mib


def _slots(policy: Policy, pool: Pool, fraction: float) -> int | None:
    if policy.allocation is Allocation.COUNT:
        slots = max(1, math.ceil(fraction * pool.replicas - _EPSILON))
        return slots if slots <= pool.replicas else None
    return 1 if pool.slice_fraction + _EPSILON >= fraction else None


def place(policy: Policy, request: GpuRequest) -> Placement | list[str]:
    """The placement with the least GPU granted beyond the request; problems if none fits."""
    candidates: list[Placement] = []
    for pool in policy.pools:
        fraction = _requested_fraction(request, pool)
        if fraction is None:
            continue
        slots = _slots(policy, pool, fraction)
        if slots is None:
            continue
        candidates.append(Placement(pool, slots, fraction))
    # A gpu-memory request is a different share in pools of different GPU memory: prefer
    # the pools where it is within the policy's bounds, and report bounds only if none is.
    within = [c for c in candidates if not _bounds_problems(policy, request, c)]
    if not within and _sized_by_nodes(policy, request):
        return _place_by_node_memory(policy, request)
    if not candidates:
        return [_nothing_fits(policy, request)]
    best = min(within or candidates, key=lambda c: c.granted)  # min keeps order on ties
    problems = _bounds_problems(policy, request, best) + _agreement_problems(request, best)
    return problems or best


def _sized_by_nodes(policy: Policy, request: GpuRequest) -> bool:
    """A memory-only ask, and pools that leave their GPU memory to the nodes' labels."""
    return (
        request.fraction is None
        and request.memory_mib is not None
        and any(p.gpu_memory_mib is None for p in policy.pools)
    )


def _place_by_node_memory(policy: Policy, request: GpuRequest) -> Placement | list[str]:
    """One slot of the largest slice among the pools without gpuMemory, on nodes whose GPU
    memory (GFD's label) makes that slot hold the ask: see the module docstring."""
    assert request.memory_mib is not None  # _sized_by_nodes
    pools = [p for p in policy.pools if p.gpu_memory_mib is None]
    pool = max(pools, key=lambda p: p.slice_fraction)  # max keeps the first on ties
    share = min(pool.slice_fraction, policy.max_fraction)
    node_memory = math.ceil(request.memory_mib / share - _EPSILON)
    if node_memory > _LARGEST_GPU_MEMORY_MIB:
        return [
            f'{MEMORY_ANNOTATION} "{request.memory_text}" is more than any GPU has: ask for '
            "less, or for whole GPUs with "
            f'{FRACTION_ANNOTATION}: "1".'
        ]
    # No bounds check: the share is the slot, at most fraction.max by construction, and
    # fraction.min does not apply to an ask sized by the nodes (policies/README.md).
    return Placement(pool, 1, share, node_memory)


def _nothing_fits(policy: Policy, request: GpuRequest) -> str:
    asked = (
        f'{FRACTION_ANNOTATION} "{request.fraction_text}"'
        if request.fraction is not None
        else f'{MEMORY_ANNOTATION} "{request.memory_text}"'
    )
    largest = max(policy.pools, key=lambda p: p.slice_fraction)
    offer = (
        f"the largest slice policy {policy.name!r} offers is 1/{largest.replicas} of a GPU "
        f"(pool {largest.name!r})"
    )
    if policy.allocation is Allocation.COUNT:
        offer = f"no pool of policy {policy.name!r} has that much of one GPU"
    return (
        f"{asked} does not fit any GPU pool: {offer}. Ask for less, or for a whole GPU "
        f'with {FRACTION_ANNOTATION}: "1".'
    )


def _bounds_problems(policy: Policy, request: GpuRequest, placement: Placement) -> list[str]:
    if placement.fraction + _EPSILON < policy.min_fraction:
        return [
            f"{_asked(request, placement)} is below the smallest share policy {policy.name!r} "
            f"allows ({format_fraction(policy.min_fraction)}): ask for at least that much."
        ]
    if placement.fraction > policy.max_fraction + _EPSILON:
        return [
            f"{_asked(request, placement)} is above the largest share policy {policy.name!r} "
            f"allows ({format_fraction(policy.max_fraction)}): ask for less, or for whole GPUs."
        ]
    return []


def _asked(request: GpuRequest, placement: Placement) -> str:
    if request.fraction is not None:
        return f'{FRACTION_ANNOTATION} "{request.fraction_text}"'
    return (
        f'{MEMORY_ANNOTATION} "{request.memory_text}" '
        f"({format_fraction(placement.fraction)} of a GPU in pool {placement.pool.name!r})"
    )


def _agreement_problems(request: GpuRequest, placement: Placement) -> list[str]:
    if request.fraction is None or request.memory_mib is None:
        return []
    pool = placement.pool
    if pool.gpu_memory_mib is None:
        return [
            f'{FRACTION_ANNOTATION} "{request.fraction_text}" and {MEMORY_ANNOTATION} '
            f'"{request.memory_text}" cannot be checked against each other: pool {pool.name!r} '
            "declares no GPU memory. Keep only one of the two annotations."
        ]
    implied = request.fraction * pool.gpu_memory_mib
    if abs(implied - request.memory_mib) > _AGREEMENT_TOLERANCE * request.memory_mib:
        return [
            f'{FRACTION_ANNOTATION} "{request.fraction_text}" means {math.floor(implied)}Mi '
            f"on pool {pool.name!r} ({pool.gpu_memory_mib}Mi per GPU), but {MEMORY_ANNOTATION} "
            f'says "{request.memory_text}": keep only one of the two annotations.'
        ]
    return []
