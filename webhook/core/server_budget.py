"""The largest value an inference server's memory flag may take in a pod: vLLM's
``--gpu-memory-utilization`` and SGLang's ``--mem-fraction-static`` are fractions of what
CUDA reports, so the value depends on the pod's limits and on what CUDA reports under them.

What the servers read (docs/frameworks.md cites the lines):

- vLLM 0.34.0 (``vllm/v1/worker/utils.py`` ``request_memory``): it asks for
  ``ceil(total x utilization)``, total from ``torch.cuda.mem_get_info`` (cudaMemGetInfo) at
  startup, and refuses to start where free memory is below that;
- SGLang 0.5.23 (``sglang/srt/mem_cache/kv_cache_configurator.py``): its static pool is
  about ``mem_fraction_static x`` the free memory at startup (``torch.cuda.mem_get_info``),
  which is at most the total.

What CUDA reports as total:

- no limit: the whole GPU;
- the driver limit (``NVIDIA_GPU_MEMORY_LIMIT``, applied by the toolkit's hook on the
  container's cgroup): NVIDIA's MPS v3 memory partitioning page ("How Limits Are
  Reported"): ``cuMemGetInfo`` reports total and free capped to the hard limit. That holds
  only on a node that applies it, which ``driverMemoryLimit: require`` makes sure of (the
  pod selects the node agent's label); under ``auto`` and ``inject`` the node may not;
- the MPS pinned limit (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``): NVIDIA's MPS documentation
  says it limits what a client can allocate, not what cudaMemGetInfo reports; not found in
  any NVIDIA source. With MPS the server's memory is the MPS server's, so whether the
  driver limit on the pod's cgroup reaches it is not documented either.

So with L the smallest limit the pod gets (MiB; without one, its share of the GPU), h the
policy's headroom in MiB (the CUDA context and what no allocator counts) and T the total:

    flag = floor((L - h) / T x 1000) / 1000

T is the limit itself only where it is known to be what CUDA reports (the driver limit
under ``require``, no MPS limit); everywhere else the whole GPU. Sized against the whole
GPU, the server fits whichever CUDA reports: it asks for at most ``L - h`` when total is the
GPU, and for less (``(L - h) x L / GPU``), so never more than is free, when total is the
limit. Sized against the limit where it is not what CUDA reports, it would ask for more than
its limit. Without any limit and a GPU of known memory, this is the share less the headroom,
as the framework knobs compute it (``frameworks.framework_fraction``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from webhook.constants import DRIVER_MEMORY_LIMIT_VAR, MPS_MEMORY_LIMIT_VAR
from webhook.core.frameworks import framework_fraction
from webhook.core.modes import EnvSetting, mode_changes
from webhook.core.placement import Placement, format_fraction
from webhook.core.plan_memos import placement_key, plan_memos
from webhook.core.policy.model import Policy, PolicySet

# What the limit variables are called in the explanations.
_LIMIT_NAMES = {DRIVER_MEMORY_LIMIT_VAR: "driver limit", MPS_MEMORY_LIMIT_VAR: "MPS limit"}


@dataclass(frozen=True)
class ServerBudget:
    """The flag's largest value, how it was computed, and the limit it was computed from
    where the pod has one (MiB), with what CUDA reports as total (MiB; None: not known in
    MiB)."""

    share: float
    derivation: str
    limit_mib: int | None = None
    reported_total_mib: int | None = None

    @property
    def against_limit(self) -> bool:
        """Whether the flag is a fraction of the limit itself (CUDA reports the limit)."""
        return self.limit_mib is not None and self.reported_total_mib == self.limit_mib


def _limit_mib(setting: EnvSetting) -> int | None:
    """MiB of a limit variable: ``NNN`` (driver) or ``0=NNNM`` (MPS, device 0)."""
    text = setting.value.partition("=")[2] if "=" in setting.value else setting.value
    text = text.removesuffix("M")
    return int(text) if text.isdigit() else None


def pod_limits(policies: PolicySet, policy: Policy, placement: Placement) -> dict[str, int]:
    """The limit variables the pod's mode writes (name -> MiB), from the plan's own memo."""
    key = placement_key(policy, placement)
    changes = plan_memos(policies).mode_changes.get_or_compute(key, mode_changes, policy, placement)
    limits = {}
    for setting in changes.env:
        if setting.name in _LIMIT_NAMES and (mib := _limit_mib(setting)) is not None:
            limits[setting.name] = mib
    return limits


def _floor_share(value: float) -> float:
    return math.floor(value * 1000 + 1e-9) / 1000


def server_budget(policies: PolicySet, policy: Policy, placement: Placement) -> ServerBudget | str:
    """The flag's largest value for this placement (module docstring); a problem text where
    the share leaves no memory once the headroom is kept."""
    limits = pod_limits(policies, policy, placement)
    # The pool's memory, not the node label's lower bound: a larger GPU would take more.
    gpu = placement.pool.gpu_memory_mib
    headroom = _headroom_mib(policy, gpu)
    driver_reported = (
        policy.enforcement.requires_enforcing_nodes
        and DRIVER_MEMORY_LIMIT_VAR in limits
        and MPS_MEMORY_LIMIT_VAR not in limits
    )
    total = limits[DRIVER_MEMORY_LIMIT_VAR] if driver_reported else gpu
    if not limits or headroom is None or total is None:
        # No limit, or no MiB to compute in: the share of the GPU less the headroom.
        plain = framework_fraction(policy, placement)
        if isinstance(plain, str):
            return plain
        return ServerBudget(plain, f"the share less the headroom, floored to 1/1000: {plain:g}")
    name, limit = min(limits.items(), key=lambda item: item[1])
    share = _floor_share((limit - headroom) / total)
    if share <= 0:
        return (
            f"The {limit}Mi {_LIMIT_NAMES[name]} of this share leaves no memory once policy "
            f"{policy.name!r} keeps its {headroom}Mi headroom for the CUDA context: ask for more."
        )
    reported = (
        "what CUDA reports as total under the driver limit (driverMemoryLimit: require)"
        if driver_reported
        else "the whole GPU, so that it fits whether CUDA reports the GPU or the limit"
    )
    derivation = (
        f"floor(({limit}Mi {_LIMIT_NAMES[name]} - {headroom}Mi headroom) / {total}Mi, "
        f"{reported}) = {format_fraction(share)}"
    )
    return ServerBudget(share, derivation, limit, total)


def _headroom_mib(policy: Policy, gpu_mib: int | None) -> int | None:
    """The policy's headroom in MiB (a share of the GPU's memory, rounded up); None where it
    is a share of a GPU whose memory nobody declared."""
    headroom = policy.headroom
    if headroom.memory_mib:
        return headroom.memory_mib
    if gpu_mib is None:
        return None if headroom.fraction else 0
    return math.ceil(headroom.fraction * gpu_mib - 1e-9)
