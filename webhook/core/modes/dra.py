"""Dynamic Resource Allocation: a share is a pod resource claim asking for GPU memory as
consumable device capacity, from a ResourceClaimTemplate gpushare names and generates.

With consumable capacity (KEP-5075, ``DRAConsumableCapacity``, beta and on by default since
Kubernetes 1.36: k8s.io/kubernetes ``pkg/features/kube_features.go``) a device published with
``allowMultipleAllocations: true`` is allocated to several claims, each taking the amount
its request names under ``capacity.requests``, and the scheduler itself packs those amounts
onto GPUs (k8s.io/api ``resource/v1/types.go``: ``CapacityRequirements``). NVIDIA's driver
publishes a GPU's ``memory`` capacity in bytes, and with ``--consumable-shares=memory`` makes
it consumable in 1Mi steps (kubernetes-sigs/dra-driver-nvidia-gpu
``cmd/gpu-kubelet-plugin/consumable_shares.go``, behind its alpha gate ``ConsumableShares``).

A template's capacity is fixed, so each share size is one template: the share (gpu-fraction
x the policy's ``gpuMemory``, or gpu-memory itself) rounded UP to ``dra.granularity`` and
never above ``gpuMemory``, named ``gpushare-<policy>-<size>``. The webhook names the template
with ``template_name`` and the generator (``webhook.dra``) makes exactly the templates of
``share_sizes``, with ``claim_template``: they agree by construction.

The template also carries the policy's DeviceClass, CEL selectors (product, architecture,
minimum memory) and, for NVIDIA's driver, the opaque ``GpuConfig`` its sharing settings
take (``api/nvidia.com/resource/v1beta1``: ``gpuconfig.go``, ``sharing.go``).
"""

from __future__ import annotations

import math
from fnmatch import fnmatchcase
from typing import Any

from webhook.constants import FRACTION_ANNOTATION, MEMORY_ANNOTATION
from webhook.core.modes.base import ContainerResource, ModeChanges, ModeProfile, frozen_record
from webhook.core.placement import Placement, format_fraction
from webhook.core.policy.model import (
    NVIDIA_DRA_DRIVER,
    DraSettings,
    DraSharing,
    Mode,
    Policy,
    PolicySet,
    Pool,
)
from webhook.core.policy.selection import namespace_excluded
from webhook.core.request import GpuRequest

RESOURCE_API_VERSION = "resource.k8s.io/v1"
NVIDIA_CONFIG_API_VERSION = "resource.nvidia.com/v1beta1"
# The pod-level claim and the device request inside each template.
CLAIM_NAME = "gpushare-gpu"
DEVICE_REQUEST = "gpu"
TEMPLATE_PREFIX = "gpushare"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpushare"
POLICY_LABEL = "gpushare.io/policy"
SHARE_ANNOTATION = "gpushare.io/share"
_MIB_PER_GIB = 1024
_EPSILON = 1e-9
# gpu-fraction and gpu-memory agree when they differ by at most this share of the memory.
_AGREEMENT_TOLERANCE = 0.01


def _ceil_to(value: float, step: int) -> int:
    return max(step, math.ceil(value / step - _EPSILON) * step)


def share_mib(settings: DraSettings, asked_mib: float) -> int:
    """The memory a claim asks: ``asked_mib`` rounded up to the granularity, at most one
    GPU's declared memory (never less than asked: asks above it are refused earlier)."""
    return min(_ceil_to(asked_mib, settings.granularity_mib), settings.gpu_memory_mib)


def share_of_claim(policy: Policy, placement: Placement) -> float:
    """The share of a GPU the pod's claim asks: its memory over the declared GPU memory."""
    settings = policy.dra
    if settings.gpu_memory_mib <= 0:
        return placement.fraction
    mib = share_mib(settings, placement.fraction * settings.gpu_memory_mib)
    return mib / settings.gpu_memory_mib


def share_sizes(policy: Policy) -> list[int]:
    """Every share (MiB) a pod under ``policy`` can ask for: one template each."""
    settings = policy.dra
    low = share_mib(settings, policy.min_fraction * settings.gpu_memory_mib)
    high = share_mib(settings, policy.max_fraction * settings.gpu_memory_mib)
    step = settings.granularity_mib
    sizes = list(range(low, high, step))
    return [*sizes, high] if not sizes or sizes[-1] != high else sizes


def format_size(mib: int) -> str:
    """A Kubernetes quantity: "20Gi" when whole GiB, else "1536Mi"."""
    return f"{mib // _MIB_PER_GIB}Gi" if mib % _MIB_PER_GIB == 0 else f"{mib}Mi"


def template_name(policy: Policy, mib: int) -> str:
    """``gpushare-<policy>-<size>``: "gpushare-research-20gi", "gpushare-research-1536mi"."""
    return f"{TEMPLATE_PREFIX}-{policy.name}-{format_size(mib).lower()}"


def _cel_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def _attribute_in(driver: str, name: str, values: tuple[str, ...]) -> str:
    attributes = f"device.attributes[{_cel_string(driver)}]"
    listed = ", ".join(_cel_string(v) for v in values)
    # A selector reading an attribute a device lacks is a CEL runtime error that fails the
    # whole allocation (k8s.io/dynamic-resource-allocation structured allocator), not a
    # non-match: test for the key first.
    return f"{_cel_string(name)} in {attributes} && {attributes}.{name} in [{listed}]"


def device_selectors(settings: DraSettings) -> list[dict[str, Any]]:
    """CEL selectors for the policy's product names, architectures and minimum memory."""
    expressions = []
    if settings.product_names:
        expressions.append(_attribute_in(settings.driver, "productName", settings.product_names))
    if settings.architectures:
        expressions.append(_attribute_in(settings.driver, "architecture", settings.architectures))
    if settings.min_gpu_memory_mib is not None:
        capacity = f"device.capacity[{_cel_string(settings.driver)}]"
        minimum = _cel_string(format_size(settings.min_gpu_memory_mib))
        expressions.append(
            f"{_cel_string(settings.capacity)} in {capacity} && "
            f"{capacity}.{settings.capacity}.compareTo(quantity({minimum})) >= 0"
        )
    return [{"cel": {"expression": e}} for e in expressions]


def thread_percentage(policy: Policy, mib: int) -> int:
    """MPS active thread percentage for a share: floor(share x 100 x overprovision), 1..100."""
    share = mib / policy.dra.gpu_memory_mib
    return max(1, min(100, math.floor(share * 100 * policy.mps.thread_overprovision + _EPSILON)))


def sharing_config(policy: Policy, mib: int) -> dict[str, Any] | None:
    """The opaque ``GpuConfig`` for NVIDIA's driver, or None (strategy None, other drivers).

    Field names: dra-driver-nvidia-gpu ``api/nvidia.com/resource/v1beta1/sharing.go``
    (``GpuSharing.strategy``, ``timeSlicingConfig.interval``, ``mpsConfig.
    defaultActiveThreadPercentage`` / ``defaultPinnedDeviceMemoryLimit``).
    """
    settings = policy.dra
    if settings.sharing is DraSharing.NONE:
        return None
    sharing: dict[str, Any] = {"strategy": settings.sharing.value}
    if settings.sharing is DraSharing.TIME_SLICING and settings.time_slice_interval:
        sharing["timeSlicingConfig"] = {"interval": settings.time_slice_interval}
    if settings.sharing is DraSharing.MPS:
        mps: dict[str, Any] = {}
        if policy.mps.enforce_thread_percentage:
            mps["defaultActiveThreadPercentage"] = thread_percentage(policy, mib)
        if policy.mps.enforce_memory_limit:
            mps["defaultPinnedDeviceMemoryLimit"] = format_size(mib)
        if mps:
            sharing["mpsConfig"] = mps
    return {"apiVersion": NVIDIA_CONFIG_API_VERSION, "kind": "GpuConfig", "sharing": sharing}


def claim_template(policy: Policy, mib: int, namespace: str) -> dict[str, Any]:
    """The ResourceClaimTemplate for one share size of ``policy`` in ``namespace``."""
    settings = policy.dra
    exactly: dict[str, Any] = {"deviceClassName": settings.device_class}
    selectors = device_selectors(settings)
    if selectors:
        exactly["selectors"] = selectors
    exactly["capacity"] = {"requests": {settings.capacity: format_size(mib)}}
    devices: dict[str, Any] = {"requests": [{"name": DEVICE_REQUEST, "exactly": exactly}]}
    config = sharing_config(policy, mib)
    if config is not None:
        devices["config"] = [
            {
                "requests": [DEVICE_REQUEST],
                "opaque": {"driver": settings.driver, "parameters": config},
            }
        ]
    return {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": template_name(policy, mib),
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: policy.name},
            "annotations": {SHARE_ANNOTATION: format_size(mib)},
        },
        "spec": {"spec": {"devices": devices}},
    }


def may_govern(policies: PolicySet, policy: Policy, namespace: str) -> bool:
    """Whether some pod in ``namespace`` could be governed by ``policy`` (a superset: the
    pod labels and other policies' priorities are not known ahead of the pods)."""
    if namespace_excluded(policies, namespace):
        return False
    if any(fnmatchcase(namespace, p) for p in policy.match.exclude_namespaces):
        return False
    return policy.default or any(fnmatchcase(namespace, p) for p in policy.match.namespaces)


def namespace_templates(policies: PolicySet, namespace: str) -> list[dict[str, Any]]:
    """Every template the ``dra`` policies that may govern ``namespace`` need there."""
    return [
        claim_template(policy, mib, namespace)
        for policy in policies.policies
        if policy.mode is Mode.DRA and may_govern(policies, policy, namespace)
        for mib in share_sizes(policy)
    ]


def _asked_mib(policy: Policy, request: GpuRequest) -> tuple[float, list[str]]:
    """The memory asked (MiB) and any disagreement between the two annotations."""
    declared = policy.dra.gpu_memory_mib
    if request.memory_mib is None:
        assert request.fraction is not None  # a share request has one or the other
        return request.fraction * declared, []
    if request.fraction is not None:
        implied = request.fraction * declared
        if abs(implied - request.memory_mib) > _AGREEMENT_TOLERANCE * request.memory_mib:
            return request.memory_mib, [
                f'{FRACTION_ANNOTATION} "{request.fraction_text}" means {math.floor(implied)}Mi '
                f"of the {format_size(declared)} policy {policy.name!r} declares per GPU, but "
                f'{MEMORY_ANNOTATION} says "{request.memory_text}": keep only one of the two.'
            ]
    return request.memory_mib, []


class DraConsumableMemory:
    """The ``dra`` mode: shares are claims on consumable GPU memory (module docstring)."""

    mode = Mode.DRA

    def place(self, policy: Policy, request: GpuRequest) -> Placement | list[str]:
        settings = policy.dra
        asked, problems = _asked_mib(policy, request)
        if problems:
            return problems
        fraction = asked / settings.gpu_memory_mib
        what = (
            f'{FRACTION_ANNOTATION} "{request.fraction_text}"'
            if request.memory_mib is None
            else f'{MEMORY_ANNOTATION} "{request.memory_text}" ({format_fraction(fraction)} of '
            f"the {format_size(settings.gpu_memory_mib)} GPU policy {policy.name!r} declares)"
        )
        if fraction + _EPSILON < policy.min_fraction:
            return [
                f"{what} is below the smallest share policy {policy.name!r} allows "
                f"({format_fraction(policy.min_fraction)}): ask for at least that much."
            ]
        if fraction > policy.max_fraction + _EPSILON:
            return [
                f"{what} is above the largest share policy {policy.name!r} allows "
                f"({format_fraction(policy.max_fraction)}): ask for less, or for whole GPUs."
            ]
        mib = share_mib(settings, asked)
        # One "pool" per share size: the claim template; a claim is one device's capacity.
        pool = Pool(
            name=template_name(policy, mib), replicas=1, gpu_memory_mib=settings.gpu_memory_mib
        )
        return Placement(pool, 1, fraction, asked_memory_mib=request.memory_mib)

    def changes(self, policy: Policy, placement: Placement) -> ModeChanges:
        settings = policy.dra
        mib = share_mib(settings, placement.fraction * settings.gpu_memory_mib)
        template = template_name(policy, mib)
        claim = {"name": CLAIM_NAME, "resourceClaimTemplateName": template}
        warnings: tuple[str, ...] = ()
        if settings.sharing is DraSharing.MPS and settings.driver == NVIDIA_DRA_DRIVER:
            warnings = (
                f"policy {policy.name!r} asks NVIDIA's DRA driver for MPS on consumable "
                "memory shares, which its releases refuse when preparing the claim "
                "(dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/device_state.go): the pod "
                "will not start until the driver allows both.",
            )
        return ModeChanges(
            resource_claims=(claim,),
            record=frozen_record({"claimTemplate": template, settings.capacity: format_size(mib)}),
            explanation=(
                f"claim: {format_fraction(placement.fraction)} x "
                f"{format_size(settings.gpu_memory_mib)} rounded up to "
                f"{format_size(settings.granularity_mib)} = {format_size(mib)} of "
                f"{settings.device_class} capacity {settings.capacity!r}, from "
                f"ResourceClaimTemplate {template} (gpushare dra-templates makes it)",
            ),
            warnings=warnings,
        )

    def whole_gpus(self, policy: Policy, count: int) -> tuple[ContainerResource, ...]:
        # Whole GPUs stay an extended resource: a DeviceClass with extendedResourceName
        # (NVIDIA's chart sets nvidia.com/gpu; KEP-5004, GA in 1.37) serves it through DRA.
        return ((policy.whole_gpus.resource_name, count),)

    def profile(self, policy: Policy) -> ModeProfile:
        settings = policy.dra
        sharing = {
            DraSharing.NONE: "the driver's default (time-sliced)",
            DraSharing.TIME_SLICING: "time-slicing (GpuConfig)",
            DraSharing.MPS: "MPS (GpuConfig)",
        }[settings.sharing]
        return ModeProfile(
            isolation=f"memory: scheduler accounting of {settings.capacity!r} capacity, not "
            f"enforced on the GPU by NVIDIA's driver; compute: {sharing}",
            node_requirements=f"a DRA driver publishing {settings.device_class} devices with "
            f"consumable {settings.capacity!r} (NVIDIA: --consumable-shares=memory), "
            "Kubernetes 1.36+ (DRAConsumableCapacity), the templates "
            "(gpushare dra-templates)",
        )
