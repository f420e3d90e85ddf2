"""What each sharing mode isolates between the pods on one GPU: memory, compute, faults.

Facts, with sources:
- Time-slicing: no memory or compute isolation; pods take turns on the GPU, each in its own
  CUDA context, so a fault ends only the faulting process (NVIDIA k8s-device-plugin README,
  "Shared Access to GPUs": "no memory or fault-isolation between replicas"; the framework
  knobs gpushare sets only ask frameworks to stay in their share: soft).
- MPS (device plugin or gpushare's daemon): CUDA_MPS_PINNED_DEVICE_MEM_LIMIT caps device
  memory and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE the SMs, both hard; all clients of a GPU
  share one MPS server, and a fatal fault in one faults every client on that GPU (CUDA MPS
  documentation, "Memory Protection and Error Containment" for Volta+).
- Whole GPUs: the pod owns its GPUs.
- AWS vGPU: one MPS daemon per node with a daemon-wide thread percentage, no memory limit
  from the plugin (awslabs/aws-virtual-gpu-device-plugin README); gpushare adds an MPS client
  memory limit where the policy declares gpuMemory. MPS: one fault domain per GPU.
- Tencent vcuda: vcuda-controller, preloaded into the container, caps memory and throttles
  to vcuda-core (a hard cap with ``tencent.com/vcuda-core-limit``) (tkestack/gpu-manager).
- Aliyun gpushare: the scheduler counts memory, the application is told its share in env
  and must keep to it: soft (AliyunContainerService/gpushare-device-plugin README).
- HAMi: HAMi-core, preloaded, enforces gpumem and gpucores (Project-HAMi/HAMi-core README).
- DRA consumable capacity: the scheduler accounts the claim's memory; NVIDIA's driver does
  not enforce it on the GPU (kubernetes-sigs/dra-driver-nvidia-gpu, consumable shares);
  compute as its GpuConfig says (time-slicing by default, or MPS).
- KAI-Scheduler: its GPU sharing places pods, it enforces no limit (NVIDIA/KAI-Scheduler
  docs/gpu-sharing).

A mode the table does not know is said to be "not modelled", as capacity does.
"""

from __future__ import annotations

from dataclasses import dataclass

from webhook.plan.capacity import WHOLE_GPU_MODE


@dataclass(frozen=True)
class Isolation:
    memory: str
    compute: str
    fault_domain: str


_OWN_CONTEXT = "per process (own CUDA context)"
NOT_MODELLED = Isolation("not modelled", "not modelled", "not modelled")
_MPS = Isolation(
    memory="hard (MPS pinned memory limit)",
    compute="capped (MPS active thread %)",
    fault_domain="shared: a fatal fault in one client faults all on the GPU",
)
ISOLATION: dict[str, Isolation] = {
    "time-slicing": Isolation(
        memory="none (framework knobs: soft)",
        compute="none (time-sliced)",
        fault_domain=_OWN_CONTEXT,
    ),
    "mps": _MPS,
    "mps-daemon": _MPS,
    WHOLE_GPU_MODE: Isolation("whole GPU", "whole GPU", "own GPU"),
    "aws-vgpu": Isolation(
        memory="none from the plugin (MPS client limit where gpuMemory is set)",
        compute="daemon-wide MPS thread %, the same for every pod",
        fault_domain=_MPS.fault_domain,
    ),
    "tencent-vcuda": Isolation(
        memory="hard (vcuda-controller)",
        compute="vcuda-core share (hard with vcuda-core-limit)",
        fault_domain=_OWN_CONTEXT,
    ),
    "aliyun-gpushare": Isolation(
        memory="soft (the app reads its share from env)",
        compute="none (time-sliced)",
        fault_domain=_OWN_CONTEXT,
    ),
    "hami": Isolation(
        memory="hard (HAMi-core)", compute="capped (HAMi-core gpucores)", fault_domain=_OWN_CONTEXT
    ),
    "dra": Isolation(
        memory="scheduler accounting only, not enforced on the GPU",
        compute="per the driver's GpuConfig (time-sliced by default, or MPS)",
        fault_domain="per process, or shared under MPS",
    ),
    "kai": Isolation(
        memory="none (KAI places, enforces no limit)",
        compute="none (time-sliced)",
        fault_domain=_OWN_CONTEXT,
    ),
}


def isolation(mode: str) -> Isolation:
    return ISOLATION.get(mode, NOT_MODELLED)
