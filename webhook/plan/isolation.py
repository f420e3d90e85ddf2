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
        fault_domain="per process (own CUDA context)",
    ),
    "mps": _MPS,
    "mps-daemon": _MPS,
    WHOLE_GPU_MODE: Isolation("whole GPU", "whole GPU", "own GPU"),
}


def isolation(mode: str) -> Isolation:
    return ISOLATION.get(mode, NOT_MODELLED)
