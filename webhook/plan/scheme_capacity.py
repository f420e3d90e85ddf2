"""Capacity models of the other schemes (issue 12): what a pod takes of one GPU, read from
the resources the core gave it (the record's ``resources``) and the policy's scheme section.

Each scheme's own scheduler (or device plugin) places a share on ONE GPU, so a bin is a GPU:

- ``aws-vgpu``: vGPUs, N per GPU (``awsVgpu.vgpusPerGpu``). The kube-scheduler counts
  GPUs x N per node, and the plugin gives more than one vGPU to a pod only on one-GPU nodes
  (awslabs/aws-virtual-gpu-device-plugin README, "Limitations"), where node and GPU agree.
- ``tencent-vcuda``: vcuda-core (100 = one GPU) and vcuda-memory (256 MiB units) of one GPU,
  which gpu-manager's scheduler extender packs per GPU (tkestack/gpu-manager README).
- ``aliyun-gpushare``: aliyun.com/gpu-mem (GiB, or MiB) of one GPU, packed per GPU by its
  scheduler extender (AliyunContainerService/gpushare-scheduler-extender, binpack).
- ``hami``: nvidia.com/gpumem (MiB) or gpumem-percentage, nvidia.com/gpucores (percent) and
  one of the GPU's task slots (deviceSplitCount, 10 by default: Project-HAMi/HAMi
  charts/hami/values.yaml), per GPU, as hami-scheduler accounts them.
- ``dra``: the claim's consumable ``memory`` of one device (KEP-5075): the kube-scheduler
  itself accounts it per device.
- ``kai``: handed over to KAI-Scheduler, whose placement is its own: not modelled.

Where the GPU's memory is needed and the policy does not declare it (``gpuMemory``), the
pods are "not modelled" and the reason says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from webhook.core import Policy
from webhook.plan.demand import Demand, Model, NotModelled

VCUDA_CORES_PER_GPU = 100
VCUDA_MEMORY_UNIT_MIB = 256
HAMI_TASKS_PER_GPU = 10  # deviceSplitCount's default
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Gi|Mi)$")


def _resources(record: Mapping[str, Any]) -> dict[str, int]:
    resources = record.get("resources")
    if not isinstance(resources, Mapping):
        return {}
    return {str(k): int(v) for k, v in resources.items() if isinstance(v, int)}


def _scheme(policy: Policy, section: str) -> Any:
    return getattr(getattr(policy, "schemes", None), section, None)


def _gpu_memory(policy: Policy) -> int | None:
    memory = getattr(getattr(policy, "schemes", None), "gpu_memory_mib", None)
    return memory if isinstance(memory, int) and memory > 0 else None


def _share(record: Mapping[str, Any], default: float) -> float:
    try:
        return float(record.get("fraction", default))
    except (TypeError, ValueError):
        return default


def _demand(
    policy: Policy,
    record: Mapping[str, Any],
    gpus_per_node: int,
    capacity: tuple[int, ...],
    size: tuple[int, ...],
    unit: str,
    memory: tuple[int | None, float | None],
) -> Demand:
    gpu_memory, asked = memory
    share = _share(record, size[0] / capacity[0])
    if asked is None and gpu_memory is not None:
        asked = share * gpu_memory
    return Demand(
        group=f"{policy.name}/{record.get('mode')}",
        capacity=capacity,
        size=size,
        unit=unit,
        gpus_per_node=gpus_per_node,
        share=share,
        gpu_memory_mib=gpu_memory,
        memory_mib=asked,
    )


def aws_vgpu(policy: Policy, record: Mapping[str, Any], gpus_per_node: int) -> Demand | NotModelled:
    settings = _scheme(policy, "aws_vgpu")
    resources = _resources(record)
    per_gpu = getattr(settings, "vgpus_per_gpu", None)
    vgpus = resources.get(getattr(settings, "resource_name", ""), 0)
    if not isinstance(per_gpu, int) or vgpus < 1:
        return NotModelled(f"policy {policy.name!r}: no vGPU count in the record")
    memory = _gpu_memory(policy)
    return _demand(policy, record, gpus_per_node, (per_gpu,), (vgpus,), "vGPUs", (memory, None))


def tencent_vcuda(
    policy: Policy, record: Mapping[str, Any], gpus_per_node: int
) -> Demand | NotModelled:
    resources = _resources(record)
    cores = resources.get("tencent.com/vcuda-core", 0)
    units = resources.get("tencent.com/vcuda-memory", 0)
    memory = _gpu_memory(policy)
    if cores > VCUDA_CORES_PER_GPU:
        return NotModelled(f"{cores} vcuda-cores span several GPUs: not modelled")
    if memory is None:
        return NotModelled(
            f"policy {policy.name!r} declares no gpuMemory: the vcuda-memory units of a GPU "
            "are unknown"
        )
    capacity = (VCUDA_CORES_PER_GPU, memory // VCUDA_MEMORY_UNIT_MIB)
    asked = float(units * VCUDA_MEMORY_UNIT_MIB)
    return _demand(
        policy, record, gpus_per_node, capacity, (cores, units), "cores/256Mi", (memory, asked)
    )


def aliyun_gpushare(
    policy: Policy, record: Mapping[str, Any], gpus_per_node: int
) -> Demand | NotModelled:
    resources = _resources(record)
    amount = resources.get("aliyun.com/gpu-mem", 0)
    unit_mib = getattr(_scheme(policy, "aliyun"), "unit_mib", 1024)
    memory = _gpu_memory(policy)
    if memory is None or amount < 1:
        return NotModelled(
            f"policy {policy.name!r} declares no gpuMemory: the aliyun.com/gpu-mem of a GPU "
            "is unknown"
        )
    unit = "GiB" if unit_mib == 1024 else "MiB"
    capacity = (memory // unit_mib,)
    return _demand(
        policy, record, gpus_per_node, capacity, (amount,), unit, (memory, float(amount * unit_mib))
    )


def hami(policy: Policy, record: Mapping[str, Any], gpus_per_node: int) -> Demand | NotModelled:
    resources = _resources(record)
    if resources.get("nvidia.com/gpu", 1) > 1:
        return NotModelled("HAMi vGPUs on several GPUs of a node: not modelled")
    cores = resources.get("nvidia.com/gpucores", 0)
    memory = _gpu_memory(policy)
    if "nvidia.com/gpumem-percentage" in resources:
        percent = resources["nvidia.com/gpumem-percentage"]
        asked = None if memory is None else percent / 100 * memory
        capacity, size, unit = (100, 100, HAMI_TASKS_PER_GPU), (percent, cores, 1), "%"
    elif memory is not None:
        mib = resources.get("nvidia.com/gpumem", 0)
        asked = float(mib)
        capacity, size, unit = (memory, 100, HAMI_TASKS_PER_GPU), (mib, cores, 1), "MiB"
    else:
        return NotModelled(
            f"policy {policy.name!r} declares no gpuMemory: a GPU's MiB for gpumem are unknown"
        )
    return _demand(
        policy, record, gpus_per_node, capacity, size, f"{unit}/cores/tasks", (memory, asked)
    )


def _mib(text: object) -> int | None:
    match = _QUANTITY.match(str(text))
    if match is None:
        return None
    value = float(match.group(1)) * (1024 if match.group(2) == "Gi" else 1)
    return math.ceil(value)


def dra(policy: Policy, record: Mapping[str, Any], gpus_per_node: int) -> Demand | NotModelled:
    settings = getattr(policy, "dra", None)
    capacity_name = getattr(settings, "capacity", "memory")
    device_mib = getattr(settings, "gpu_memory_mib", 0)
    claimed = _mib(record.get(capacity_name))
    if not device_mib or claimed is None:
        return NotModelled(
            f"policy {policy.name!r}: the claim's {capacity_name} or the device's is unknown"
        )
    share = claimed / device_mib
    return Demand(
        group=f"{policy.name}/dra",
        capacity=(device_mib,),
        size=(claimed,),
        unit="MiB",
        gpus_per_node=gpus_per_node,
        share=_share(record, share),
        gpu_memory_mib=device_mib,
        memory_mib=float(claimed),
    )


def kai(policy: Policy, record: Mapping[str, Any], gpus_per_node: int) -> NotModelled:
    return NotModelled(
        f"policy {policy.name!r} hands these pods to KAI-Scheduler, which places GPU shares "
        "itself (reservation pods, its own binpacking): not modelled"
    )


SCHEME_MODELS: dict[str, Model] = {
    "aws-vgpu": aws_vgpu,
    "tencent-vcuda": tencent_vcuda,
    "aliyun-gpushare": aliyun_gpushare,
    "hami": hami,
    "dra": dra,
    "kai": kai,
}
