"""Capacity models: what one admitted pod takes of a GPU (or node) under each sharing mode.

The core decides (``webhook.core.mutate``); a model reads the decision's record (the
``gpushare.io/applied`` annotation: mode, pool, slots, fraction, gpus) and the policy, and
says which bins the pod competes for and how much of each it takes, in the units the
scheduler (or the scheme's own scheduler) counts:

- ``time-slicing``, ``mps``, ``mps-daemon``: slots of the pool's GPUs. The device plugin
  advertises GPUs x replicas of one extended resource per node and the kube-scheduler counts
  that sum per node (NodeResourcesFit); a replica-class pod takes one slot, a ``count`` pod
  ceil(f x R) slots on pools of one-GPU nodes (the only place the policy allows it), so
  per-GPU packing and the scheduler's per-node count agree (webhook/core/placement.py).
- ``whole-gpu``: GPUs of a node: a pod asking k GPUs needs k free GPUs on one node.

The other schemes' models live in ``scheme_capacity``. A mode added to the core without a
model in ``MODELS`` (keyed by the mode's value as the record names it) is reported as "not
modelled" for the pods it admits, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core import Policy, Pool
from webhook.plan.demand import Demand, Model, NotModelled
from webhook.plan.scheme_capacity import SCHEME_MODELS

WHOLE_GPU_MODE = "whole-gpu"


def _pool(policy: Policy, name: object) -> Pool | None:
    return next((pool for pool in policy.pools if pool.name == name), None)


def _share(record: Mapping[str, Any], pool: Pool) -> float:
    try:
        return float(record.get("fraction", 1 / pool.replicas))
    except (TypeError, ValueError):
        return 1 / pool.replicas


def replica_slots(
    policy: Policy, record: Mapping[str, Any], gpus_per_node: int
) -> Demand | NotModelled:
    """Slots of a device-plugin pool (time-slicing and both MPS modes)."""
    pool = _pool(policy, record.get("pool"))
    slots = record.get("slots")
    if pool is None or not isinstance(slots, int):
        return NotModelled(f"the record names no pool of policy {policy.name!r} and slots")
    share = _share(record, pool)
    memory = pool.gpu_memory_mib
    return Demand(
        group=f"{policy.name}/{pool.name}",
        capacity=(pool.replicas,),
        size=(slots,),
        unit="slots",
        gpus_per_node=pool.gpus_per_node or gpus_per_node,
        share=share,
        gpu_memory_mib=memory,
        memory_mib=share * memory if memory is not None else None,
    )


def whole_gpus(
    policy: Policy, record: Mapping[str, Any], gpus_per_node: int
) -> Demand | NotModelled:
    """k whole GPUs of one node (the device plugin's nvidia.com/gpu, no sharing)."""
    count = record.get("gpus")
    if not isinstance(count, int):
        return NotModelled("the record says no whole GPU count")
    return Demand(
        group=f"{policy.name}/whole GPUs",
        capacity=(gpus_per_node,),
        size=(count,),
        unit="GPUs",
        gpus_per_node=gpus_per_node,
        share=float(count),
        node_bins=True,
    )


MODELS: dict[str, Model] = {
    "time-slicing": replica_slots,
    "mps": replica_slots,
    "mps-daemon": replica_slots,
    WHOLE_GPU_MODE: whole_gpus,
    **SCHEME_MODELS,
}


def demand(policy: Policy, record: Mapping[str, Any], gpus_per_node: int) -> Demand | NotModelled:
    """The pod's demand under the mode its record names, or why it is not modelled."""
    mode = str(record.get("mode", ""))
    model = MODELS.get(mode)
    if model is None:
        return NotModelled(
            f"mode {mode!r} (policy {policy.name!r}) is not modelled by gpushare plan yet: "
            "its pods are admitted but not packed"
        )
    return model(policy, record, gpus_per_node)
