"""The interface every sharing mode implements, the values it returns, and the node labels
the NVIDIA device plugin's modes select.

A mode owns two steps of a plan, both pure functions of the policy and the request, so both
are memoized per policy set (``plan_memos``):

- ``place``: which share the request becomes (a ``Placement``), or why it cannot;
- ``changes``: what a pod with that placement gets: the container's extended resources
  (requests == limits, one or several: ``nvidia.com/gpu.shared: 1``, or
  ``tencent.com/vcuda-core: 25`` + ``tencent.com/vcuda-memory: 40``), pod annotations, a
  scheduler name, node labels to select, env (hard limits marked ``enforced``), volumes,
  hostIPC, pod-level resource claims (Dynamic Resource Allocation), and its part of the
  ``gpushare.io/applied`` record.

``profile`` says, for ``--all-modes`` and the docs, what the mode isolates and what must run
on the nodes. Each scheme is one module behind this interface; what several modes share
lives here or in a module of its own, never in a sibling mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from webhook.constants import (
    DEVICES_ANNOTATION,
    FRACTION_ANNOTATION,
    GFD_REPLICAS_LABEL,
    GFD_STRATEGY_LABEL,
)
from webhook.core.placement import Placement, place
from webhook.core.policy.model import Mode, Policy, frozen_map
from webhook.core.request import GpuRequest

# (resource name, count): an extended resource of the GPU container, in requests and limits
# alike (Kubernetes allows no overcommit of extended resources: requests == limits).
ContainerResource = tuple[str, int]


@dataclass(frozen=True)
class EnvSetting:
    name: str
    value: str
    # Enforced values overwrite what the user set (MPS hard limits); others never do.
    enforced: bool = False
    # How the value was computed, for ``gpushare explain``.
    derivation: str = ""


@dataclass(frozen=True)
class ModeChanges:
    # The GPU container's extended resources; planning checks the pod asks for no other.
    resources: tuple[ContainerResource, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=frozen_map)
    env: tuple[EnvSetting, ...] = ()
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    host_ipc: bool = False
    # Pod annotations the scheme reads (``tencent.com/vcuda-core-limit``); set, and checked
    # against a different value the pod already holds.
    annotations: Mapping[str, str] = field(default_factory=frozen_map)
    # Pod labels (``kai.scheduler/queue``, ``hami.io/webhook: ignore``); checked the same way.
    labels: Mapping[str, str] = field(default_factory=frozen_map)
    # The scheduler that must place the pod (``hami-scheduler``, ``kai-scheduler``).
    scheduler_name: str | None = None
    # Pod ``spec.resourceClaims`` entries; the GPU container gets ``resources.claims`` with
    # each entry's name (Dynamic Resource Allocation).
    resource_claims: tuple[Mapping[str, Any], ...] = ()
    # The mode's part of the gpushare.io/applied record (pool and slots, or resources).
    record: Mapping[str, Any] = field(default_factory=frozen_map)
    # Lines for ``gpushare explain``: how the mode's values came about.
    explanation: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    # Whether the framework and inference-server knobs get the share: not where the scheme
    # shows the container a device of its limit's size (a fraction of it would be a fraction
    # of the share), nor where the share of a GPU is unknown.
    frameworks: bool = True


@dataclass(frozen=True)
class ModeProfile:
    """What a mode gives a pod, in words, for ``--all-modes`` and the docs."""

    isolation: str
    node_requirements: str
    scheduler: str = "default-scheduler"


class SharingMode(Protocol):
    mode: Mode

    def place(self, policy: Policy, request: GpuRequest) -> Placement | list[str]:
        """The share a request for part of a GPU becomes, or why the mode cannot give it."""
        ...

    def changes(self, policy: Policy, placement: Placement) -> ModeChanges:
        """What a pod with this placement gets."""
        ...

    def whole_gpus(self, policy: Policy, count: int) -> tuple[ContainerResource, ...]:
        """The container resources of ``count`` whole GPUs under this mode."""
        ...

    def profile(self, policy: Policy) -> ModeProfile:
        """What the mode isolates and what must run on the nodes."""
        ...


class DevicePluginSlots:
    """The NVIDIA device plugin's modes: a share is slots of the policy's shared resource on
    one of its pools (``placement``); whole GPUs are the policy's ``wholeGpus`` resource."""

    def place(self, policy: Policy, request: GpuRequest) -> Placement | list[str]:
        if request.devices > 1:
            return [one_device_only(policy, request)]
        return place(policy, request)

    def whole_gpus(self, policy: Policy, count: int) -> tuple[ContainerResource, ...]:
        return ((policy.whole_gpus.resource_name, count),)

    @staticmethod
    def slot_resources(policy: Policy, placement: Placement) -> tuple[ContainerResource, ...]:
        return ((policy.resource_name, placement.slots),)

    @staticmethod
    def slot_record(policy: Policy, placement: Placement) -> Mapping[str, Any]:
        return frozen_record(
            {
                "pool": placement.pool.name,
                "resource": policy.resource_name,
                "slots": placement.slots,
            }
        )


def one_device_only(policy: Policy, request: GpuRequest) -> str:
    """The refusal of gpu-fraction-num-devices above 1 by a mode that shares one GPU."""
    count = request.devices
    return (
        f'{DEVICES_ANNOTATION} "{count}" asks for the share on {count} GPUs, but mode '
        f"{policy.mode.value} of policy {policy.name!r} gives a share of one GPU: remove "
        f'{DEVICES_ANNOTATION}, or ask for whole GPUs with {FRACTION_ANNOTATION}: "{count}".'
    )


def frozen_record(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """A read-only copy of a record part: mode changes are memoized and shared."""
    return MappingProxyType(dict(values))


def pool_selector(placement: Placement, strategy: str) -> dict[str, str]:
    """GPU Feature Discovery labels of the pool's nodes, plus the pool's own selector."""
    return {
        GFD_REPLICAS_LABEL: str(placement.pool.replicas),
        GFD_STRATEGY_LABEL: strategy,
        **placement.pool.node_selector,
    }
