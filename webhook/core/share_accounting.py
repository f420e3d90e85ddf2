"""What a pod holds in GPU terms, for the cluster's quotas and for showback (``policy.quota``).

The unit is the thousandth of a GPU (``gpushare.io/milligpu``), the same under every scheme:
the share a pod's slots or units stand for (a 0.3 ask on a pool of halves holds 500), the
memory its DRA claim asks as a share of the declared GPU memory, 1000 per whole GPU, times
the GPUs it shares (``gpu-fraction-num-devices``). Thousandths are rounded down, so that the
slots of one GPU never add up to more than the 1000 a node advertises for it (six sixths
hold 166 each, 996 in all).

With ``quota.shareResource`` the GPU container gets the resource (requests equal to limits),
overwriting a value the pod already holds there: it is gpushare's to set, and a workload
template Kueue manages carries it already. With ``quota.showbackLabels`` the pod gets labels
a cost tool groups by (share, pool, GPU model and memory where known). Either way the applied
record says ``milliGpus`` (and ``gpuMemoryMiB``, ``gpuModel`` where known).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from webhook.constants import (
    FRACTION_ANNOTATION,
    GFD_PRODUCT_LABEL,
    GKE_ACCELERATOR_LABEL,
    GPU_MEMORY_LABEL,
    GPU_MODEL_LABEL,
    MEMORY_ANNOTATION,
    MILLI_GPUS_PER_GPU,
    POOL_LABEL,
    SHARE_LABEL,
    SHARE_RESOURCE,
)
from webhook.core.draft import PlanDraft, as_mapping
from webhook.core.modes import share_of_claim
from webhook.core.placement import Placement
from webhook.core.policy.model import Mode, Policy

# Float slack before rounding down: 0.29 * 1000 is 289.99999999999994 in doubles.
_EPSILON = 1e-9
# GFD's product label ends so where a resource is shared under its own name.
_SHARED_SUFFIX = "-SHARED"
# A label value (k8s.io/apimachinery validation IsValidLabelValue).
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Schemes that give a pod exactly its share (HAMi's memory, KAI's fraction): their
# placement's slots count vGPUs, not parts of one.
_EXACT_SHARE_MODES = frozenset({Mode.HAMI, Mode.KAI})
# The modes whose pools are the policy's own (elsewhere a placement's pool is synthetic).
_POOL_MODES = frozenset({Mode.TIME_SLICING, Mode.MPS, Mode.MPS_DAEMON})


def held_milli_gpus(policy: Policy, placement: Placement) -> int | None:
    """Thousandths of a GPU the placement holds; None where its share is unknown (a memory
    ask under a scheme counting memory itself, no gpuMemory declared)."""
    if not placement.share_known:
        return None
    if policy.mode is Mode.DRA:
        held = share_of_claim(policy, placement)
    elif policy.mode in _EXACT_SHARE_MODES:
        held = placement.fraction
    else:
        held = placement.granted
    return max(1, math.floor(held * placement.devices * MILLI_GPUS_PER_GPU + _EPSILON))


def whole_milli_gpus(count: int) -> int:
    return count * MILLI_GPUS_PER_GPU


def share_resources(policy: Policy, milli: int | None) -> tuple[tuple[str, int], ...]:
    """The share resource for the GPU container, where the policy counts shares."""
    if not policy.quota.share_resource or milli is None:
        return ()
    return ((SHARE_RESOURCE, milli),)


def unknown_share_problem(policy: Policy) -> str:
    return (
        f"policy {policy.name!r} counts GPU shares in quota (quota.shareResource), but a "
        f"{MEMORY_ANNOTATION} ask under mode {policy.mode.value} is a share of a GPU only "
        f"where the policy declares gpuMemory: declare it, or ask with {FRACTION_ANNOTATION}."
    )


def record_share(
    draft: PlanDraft, record: dict[str, Any], milli: int | None, placement: Placement | None
) -> None:
    """``milliGpus`` in the applied record, and the showback labels, where the policy asks."""
    quota = draft.policy.quota
    if not quota.records_share:
        return
    if milli is None:
        if quota.share_resource:
            draft.problems.append(unknown_share_problem(draft.policy))
        return
    record["milliGpus"] = milli
    memory = _memory_mib(draft, placement, milli)
    if memory is not None:
        record["gpuMemoryMiB"] = memory
    model = _gpu_model(draft, placement)
    if model is not None:
        record["gpuModel"] = model
    if not quota.showback_labels:
        return
    labels = {SHARE_LABEL: str(milli)}
    if placement is not None and draft.policy.mode in _POOL_MODES:
        labels[POOL_LABEL] = placement.pool.name
    if model is not None:
        labels[GPU_MODEL_LABEL] = model
    if memory is not None:
        labels[GPU_MEMORY_LABEL] = str(memory)
    for key, value in labels.items():
        # gpushare's own labels: a value the pod brought is overwritten, never trusted.
        draft.edits.set(("metadata", "labels", key), value)
        if draft.explaining:
            draft.explanation.append(f"label: {key}={value} (showback)")


def _memory_mib(draft: PlanDraft, placement: Placement | None, milli: int) -> int | None:
    """The GPU memory the share stands for, where the policy declares the GPUs' memory."""
    if placement is None:
        return None
    memory = placement.pool.gpu_memory_mib
    if memory is None and draft.policy.mode is Mode.DRA:
        memory = draft.policy.dra.gpu_memory_mib or None
    return None if memory is None else milli * memory // MILLI_GPUS_PER_GPU


def _gpu_model(draft: PlanDraft, placement: Placement | None) -> str | None:
    """The GPU model where the pool or the pod selects one by a model label."""
    selectors: list[Mapping[str, Any]] = [as_mapping(draft.spec.get("nodeSelector"))]
    if placement is not None and draft.policy.mode in _POOL_MODES:
        selectors.insert(0, placement.pool.node_selector)
    for selector in selectors:
        for key in (GFD_PRODUCT_LABEL, GKE_ACCELERATOR_LABEL):
            value = selector.get(key)
            if isinstance(value, str) and value:
                model = value.removesuffix(_SHARED_SUFFIX)
                return model if len(model) <= 63 and _LABEL_VALUE.match(model) else None
    return None
