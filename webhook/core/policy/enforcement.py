"""A policy's ``enforcement`` section: which limits the node must enforce, and what a pod may
not set for itself.

- ``driverMemoryLimit``: ``NVIDIA_GPU_MEMORY_REQUEST``/``NVIDIA_GPU_MEMORY_LIMIT`` (whole
  MiB) in the GPU container, which nvidia-container-toolkit's ``apply-cuda-memory-limits``
  CDI hook has the driver enforce on the container's cgroup:
  - ``auto`` (default): written wherever the share's memory is known (a ``gpu-memory`` ask,
    or a pool that declares ``gpuMemory``); harmless on a node without the hook;
  - ``inject``: always; a fraction whose memory is unknown is refused, saying what to declare;
  - ``require``: as ``inject``, and the pod is placed only on nodes labelled
    ``gpushare.io/driver-memory-limit=true`` by the node agent: no such node, the pod stays
    Pending, never runs uncapped;
  - ``off``: never.
- ``reservedMemory``: MiB the driver and the CUDA context keep on each GPU, by GPU model (the
  pool's ``nvidia.com/gpu.product`` selector) with a default: shares are cut from what is
  left, so pods sized to exact fractions all fit (KAI-Scheduler #2212).
- ``handSetLimits``: a limit variable (``NVIDIA_GPU_MEMORY_*``, ``CUDA_MPS_*``) the user set
  in the GPU container: ``override`` (default, with a warning) or ``deny``. Explicit ``env``
  takes precedence over ``envFrom``, so gpushare's entries also beat a ConfigMap's.
- ``deviceVariables``: ``NVIDIA_VISIBLE_DEVICES`` or ``CUDA_VISIBLE_DEVICES`` set by hand in
  any container of any pod the policy governs (but ``NVIDIA_VISIBLE_DEVICES`` values that
  expose no GPU): ``deny`` (default) or ``allow``. The safety net refuses them in every pod,
  annotated or not.

The pool modes (time-slicing, mps, mps-daemon) write the driver limit; the other schemes
enforce in their own way (docs/schemes.md) and refuse ``driverMemoryLimit`` other than its
default. The schema fragment, the frozen values and their builder live here, one concept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from webhook.core.quantity import parse_memory_mib

_MEMORY = {"type": "string", "pattern": r"^\d{1,9}(\.\d{1,6})?(Ki|Mi|Gi|Ti|k|K|M|G|T)?$"}
# A GPU Feature Discovery product name (nvidia.com/gpu.product is a label value).
_PRODUCT = {"type": "string", "pattern": r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"}


class DriverMemoryLimit(StrEnum):
    OFF = "off"
    AUTO = "auto"
    INJECT = "inject"
    REQUIRE = "require"


class HandSetLimits(StrEnum):
    OVERRIDE = "override"
    DENY = "deny"


class DeviceVariables(StrEnum):
    DENY = "deny"
    ALLOW = "allow"


ENFORCEMENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "driverMemoryLimit": {
            "enum": [value.value for value in DriverMemoryLimit],
            "description": "NVIDIA_GPU_MEMORY_REQUEST/LIMIT for the driver to enforce "
            "(toolkit apply-cuda-memory-limits hook): auto (default: where the share's memory "
            "is known), inject (always; unknown memory refused), require (inject, and only "
            "on nodes labelled gpushare.io/driver-memory-limit=true), off.",
        },
        "reservedMemory": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "default": {
                    **_MEMORY,
                    "description": "Memory the driver and CUDA context keep per GPU (0).",
                },
                "products": {
                    "type": "object",
                    "maxProperties": 64,
                    "propertyNames": {**_PRODUCT, "maxLength": 63},
                    "additionalProperties": _MEMORY,
                    "description": "GPU model (the pool's nvidia.com/gpu.product selector): "
                    "memory kept per GPU.",
                },
            },
        },
        "handSetLimits": {
            "enum": [value.value for value in HandSetLimits],
            "description": "A limit variable the user set in the GPU container: override "
            "(default, warned) or deny.",
        },
        "deviceVariables": {
            "enum": [value.value for value in DeviceVariables],
            "description": "NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES set by hand in any "
            "container of a pod this policy governs: deny (default) or allow.",
        },
    },
}


@dataclass(frozen=True)
class EnforcementSettings:
    driver_memory_limit: DriverMemoryLimit = DriverMemoryLimit.AUTO
    reserved_default_mib: int = 0
    # GFD product name -> MiB kept on each GPU of that model.
    reserved_by_product: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    hand_set_limits: HandSetLimits = HandSetLimits.OVERRIDE
    device_variables: DeviceVariables = DeviceVariables.DENY

    @property
    def writes_driver_limit(self) -> bool:
        return self.driver_memory_limit is not DriverMemoryLimit.OFF

    @property
    def needs_known_memory(self) -> bool:
        """Whether a share whose memory is unknown is refused."""
        return self.driver_memory_limit in (DriverMemoryLimit.INJECT, DriverMemoryLimit.REQUIRE)

    @property
    def requires_enforcing_nodes(self) -> bool:
        return self.driver_memory_limit is DriverMemoryLimit.REQUIRE

    def reserved_mib(self, product: str | None) -> int:
        """MiB kept on each GPU of ``product`` (None: the pool names no model)."""
        if product is not None and product in self.reserved_by_product:
            return self.reserved_by_product[product]
        return self.reserved_default_mib


def _mib(text: str) -> int:
    """Whole MiB of a schema-valid size, rounded up (a reservation never shrinks)."""
    return math.ceil(parse_memory_mib(text) or 0)


def build_enforcement(raw: Mapping[str, Any] | None) -> EnforcementSettings:
    """The values of a schema-valid ``enforcement`` section (absent: the defaults)."""
    if not raw:
        return EnforcementSettings()
    reserved = raw.get("reservedMemory") or {}
    return EnforcementSettings(
        driver_memory_limit=DriverMemoryLimit(raw.get("driverMemoryLimit", "auto")),
        reserved_default_mib=_mib(reserved.get("default", "0")),
        reserved_by_product=MappingProxyType(
            {product: _mib(text) for product, text in (reserved.get("products") or {}).items()}
        ),
        hand_set_limits=HandSetLimits(raw.get("handSetLimits", "override")),
        device_variables=DeviceVariables(raw.get("deviceVariables", "deny")),
    )
