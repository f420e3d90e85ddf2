"""The rules one built policy must follow, each a small function returning its findings:
values ``build`` could not read, and rules across fields (mode and allocation, bounds and
headroom, pools and memory, ...).

``check`` applies ``RULES`` in order (pool rules pool by pool), so problems always read in
the same order. Rules that span policies (unique names, one default per priority) belong to
``loader``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from webhook.core.framework_images import (
    PYTORCH,
    TORCH_FRACTION,
    format_version,
    image_version,
    known_references,
    matches,
)
from webhook.core.policy.build import memory_mib
from webhook.core.policy.enforcement_rules import enforcement_findings
from webhook.core.policy.model import NVIDIA_DRA_DRIVER, Allocation, DraSharing, Mode, Policy
from webhook.core.policy.quota import quota_findings
from webhook.core.policy.schemes import scheme_findings
from webhook.core.quantity import is_bare_number


class Finding(NamedTuple):
    """A problem with a built policy, at ``spec.<at>`` of its document."""

    message: str
    at: tuple[str | int, ...]


_Spec = Mapping[str, Any]


def _gpu_memory_is_a_size(policy: Policy, spec: _Spec) -> list[Finding]:
    return _memory_findings(spec.get("gpuMemory"), ("gpuMemory",))


def _memory_findings(text: str | None, at: tuple[str | int, ...]) -> list[Finding]:
    if text is None or memory_mib(text) is not None:
        return []
    if is_bare_number(text):  # 81920 copied from GFD's nvidia.com/gpu.memory, which is MiB
        return [Finding(f"{text!r} is {text} bytes (no unit: bytes); write {text}Mi for MiB", at)]
    return [Finding(f"{text!r} is not a GPU memory size such as 80Gi", at)]


def _pool_name_is_unique(policy: Policy, spec: _Spec, index: int) -> list[Finding]:
    name = policy.pools[index].name
    if all(pool.name != name for pool in policy.pools[:index]):
        return []
    message = f"pool name {name!r} is used twice; pool names must be unique"
    return [Finding(message, ("pools", index, "name"))]


def _pool_gpu_memory_is_a_size(policy: Policy, spec: _Spec, index: int) -> list[Finding]:
    return _memory_findings(spec["pools"][index].get("gpuMemory"), ("pools", index, "gpuMemory"))


def _count_needs_one_gpu_per_node(policy: Policy, spec: _Spec, index: int) -> list[Finding]:
    if policy.allocation is not Allocation.COUNT or policy.pools[index].gpus_per_node == 1:
        return []
    message = (
        "allocation 'count' hands out several slots to one pod, which is only safe on "
        "nodes with exactly one GPU: set gpusPerNode: 1 on this pool or use "
        "allocation 'replica-class'"
    )
    return [Finding(message, ("pools", index))]


def _memory_limit_needs_pool_memory(policy: Policy, spec: _Spec, index: int) -> list[Finding]:
    if (
        policy.mode not in (Mode.MPS, Mode.MPS_DAEMON)
        or not policy.mps.enforce_memory_limit
        or policy.pools[index].gpu_memory_mib is not None
    ):
        return []
    message = (
        f"mode {policy.mode.value} limits each pod's device memory, which needs the GPU memory "
        "of this pool: set gpuMemory here or at spec.gpuMemory (e.g. 80Gi)"
    )
    return [Finding(message, ("pools", index))]


_POOL_RULES: tuple[Callable[[Policy, _Spec, int], list[Finding]], ...] = (
    _pool_name_is_unique,
    _pool_gpu_memory_is_a_size,
    _count_needs_one_gpu_per_node,
    _memory_limit_needs_pool_memory,
)


def _pools_follow_the_pool_rules(policy: Policy, spec: _Spec) -> list[Finding]:
    """Every rule of ``_POOL_RULES``, pool by pool."""
    return [
        finding
        for index in range(len(policy.pools))
        for rule in _POOL_RULES
        for finding in rule(policy, spec, index)
    ]


def _mps_mode_needs_replica_class(policy: Policy, spec: _Spec) -> list[Finding]:
    if policy.mode is not Mode.MPS or policy.allocation is not Allocation.COUNT:
        return []
    message = (
        "the NVIDIA device plugin's MPS mode limits every slot to 1/replicas and refuses "
        "requests above one slot: use allocation 'replica-class' with mode mps"
    )
    return [Finding(message, ("allocation",))]


def _min_fraction_not_above_max(policy: Policy, spec: _Spec) -> list[Finding]:
    low, high = policy.min_fraction, policy.max_fraction
    if low <= high:
        return []
    return [Finding(f"min {low} is above max {high}; min must not exceed max", ("fraction",))]


# Framework knobs get shares in thousandths (frameworks.py floors share - headroom to them),
# so the smallest share must keep at least this much once the headroom is taken off.
_FINEST_SHARE = 0.001


def _headroom_below_min_fraction(policy: Policy, spec: _Spec) -> list[Finding]:
    headroom = policy.headroom.fraction
    if headroom <= 0 or policy.min_fraction - headroom >= _FINEST_SHARE - 1e-9:
        return []
    message = (
        f"headroom {spec['headroom']!r} leaves less than {_FINEST_SHARE} of a GPU of the "
        f"smallest allowed fraction ({policy.min_fraction}); lower the headroom or raise "
        "fraction.min"
    )
    return [Finding(message, ("headroom",))]


def _memory_headroom_needs_pool_memory(policy: Policy, spec: _Spec) -> list[Finding]:
    if not policy.headroom.memory_mib or all(p.gpu_memory_mib is not None for p in policy.pools):
        return []
    message = (
        "a headroom given as memory needs gpuMemory on every pool (or spec.gpuMemory); "
        "give the headroom as a percentage instead"
    )
    return [Finding(message, ("headroom",))]


def _whole_gpus_not_on_the_shared_resource(policy: Policy, spec: _Spec) -> list[Finding]:
    whole = policy.whole_gpus
    if whole.resource_name != policy.resource_name or whole.max <= 0:
        return []
    message = (
        f"whole GPUs and shared slots both use {policy.resource_name}, so a whole-GPU pod would "
        "get one shared slot: set wholeGpus.resourceName to the unshared resource, or "
        "wholeGpus.max: 0"
    )
    return [Finding(message, ("wholeGpus",))]


def _matches_some_namespace(policy: Policy, spec: _Spec) -> list[Finding]:
    if policy.match.namespaces or policy.default:
        return []
    message = "this policy matches no namespace: add match.namespaces, or default: true"
    return [Finding(message, ("match",))]


def _pytorch_images_can_take_the_fraction(policy: Policy, spec: _Spec) -> list[Finding]:
    """An image glob for the PyTorch key must match some release that parses it: one that
    matches only older releases sends nothing (they would refuse it)."""
    torch = policy.frameworks.pytorch
    if not torch.memory_fraction or torch.images is None:
        return []
    findings = []
    for index, glob in enumerate(torch.images):
        known = [ref for ref in known_references(PYTORCH) if matches(ref, (glob,))]
        versions = [image_version(PYTORCH, ref, torch.versions).version for ref in known]
        if known and all(v is not None and v < TORCH_FRACTION.since for v in versions):
            message = (
                f"{glob!r} matches only PyTorch releases before "
                f"{format_version(TORCH_FRACTION.since)}, which refuse "
                f"{TORCH_FRACTION.name} in their allocator config: match newer images "
                "or remove it"
            )
            findings.append(Finding(message, ("frameworks", "pytorch", "images", index)))
    return findings


# A namespace gets one ResourceClaimTemplate per share size of a dra policy; bound the count.
MAX_DRA_TEMPLATES = 256


def _dra_mode_rules(policy: Policy, spec: _Spec) -> list[Finding]:
    """What the dra mode needs (gpuMemory, readable sizes, a bounded template set) and what
    it cannot express (pools, GpuConfig for another driver); other modes must not set dra."""
    raw = spec.get("dra", {})
    if policy.mode is not Mode.DRA:
        if "dra" in spec:
            return [Finding("dra settings apply only to mode dra: remove them", ("dra",))]
        return []
    settings = policy.dra
    findings = []
    if "pools" in spec:
        message = (
            "mode dra shares GPUs through the scheduler's DRA allocation, not device-plugin "
            "pools: remove pools"
        )
        findings.append(Finding(message, ("pools",)))
    if "gpuMemory" not in spec:
        message = (
            "mode dra asks for each share as GPU memory, so it needs the memory of one GPU "
            "that gpu-fraction is a share of: set gpuMemory (e.g. 80Gi)"
        )
        findings.append(Finding(message, ()))
    selectors = raw.get("selectors", {})
    findings += _memory_findings(raw.get("granularity"), ("dra", "granularity"))
    findings += _memory_findings(
        selectors.get("minGpuMemory"), ("dra", "selectors", "minGpuMemory")
    )
    sharing = raw.get("sharing", {})
    if settings.sharing is not DraSharing.NONE and settings.driver != NVIDIA_DRA_DRIVER:
        message = (
            f"sharing.strategy {settings.sharing.value} is sent as NVIDIA's GpuConfig, which "
            f"driver {settings.driver!r} does not read: use strategy None"
        )
        findings.append(Finding(message, ("dra", "sharing", "strategy")))
    if "timeSlicingInterval" in sharing and settings.sharing is not DraSharing.TIME_SLICING:
        message = "timeSlicingInterval needs sharing.strategy TimeSlicing"
        findings.append(Finding(message, ("dra", "sharing", "timeSlicingInterval")))
    if findings or not settings.gpu_memory_mib or not settings.granularity_mib:
        return findings
    if settings.granularity_mib > settings.gpu_memory_mib:
        message = (
            f"granularity {raw['granularity']!r} is more than a whole GPU ({spec['gpuMemory']}): "
            "make it a part of gpuMemory, such as 1Gi"
        )
        return [Finding(message, ("dra", "granularity"))]
    low = policy.min_fraction * settings.gpu_memory_mib / settings.granularity_mib
    high = policy.max_fraction * settings.gpu_memory_mib / settings.granularity_mib
    count = int(high) - int(low) + 1
    if count > MAX_DRA_TEMPLATES:
        spread = settings.gpu_memory_mib * (policy.max_fraction - policy.min_fraction)
        least = math.ceil(spread / MAX_DRA_TEMPLATES)
        message = (
            f"about {count} share sizes between fraction.min and fraction.max at this "
            f"granularity, each a ResourceClaimTemplate in every namespace (at most "
            f"{MAX_DRA_TEMPLATES}): raise dra.granularity to at least {least}Mi or narrow "
            "fraction"
        )
        findings.append(Finding(message, ("dra", "granularity")))
    return findings


def _scheme_rules(policy: Policy, spec: _Spec) -> list[Finding]:
    """The other device plugins' schemes: their sections only with their modes, no pools."""
    return [Finding(message, at) for message, at in scheme_findings(policy.mode, spec)]


def _quota_rules(policy: Policy, spec: _Spec) -> list[Finding]:
    """Declared quotas need the share resource; a share the policy cannot know is refused
    at admission (``planning``), not here: pools may be sized by the nodes' labels."""
    return [Finding(message, at) for message, at in quota_findings(policy.quota)]


def _enforcement_rules(policy: Policy, spec: _Spec) -> list[Finding]:
    """The driver limit and its reservations against the mode and the pools."""
    return [Finding(message, at) for message, at in enforcement_findings(policy, spec)]


RULES: tuple[Callable[[Policy, _Spec], list[Finding]], ...] = (
    _gpu_memory_is_a_size,
    _pools_follow_the_pool_rules,
    _mps_mode_needs_replica_class,
    _min_fraction_not_above_max,
    _headroom_below_min_fraction,
    _memory_headroom_needs_pool_memory,
    _whole_gpus_not_on_the_shared_resource,
    _matches_some_namespace,
    _pytorch_images_can_take_the_fraction,
    _dra_mode_rules,
    _scheme_rules,
    _quota_rules,
    _enforcement_rules,
)


def check(policy: Policy, spec: _Spec) -> list[Finding]:
    """What breaks ``RULES``, in their order; empty for a valid policy."""
    return [finding for rule in RULES for finding in rule(policy, spec)]
