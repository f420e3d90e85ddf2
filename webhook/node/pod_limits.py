"""What a container was given of a GPU: its limits and its share, read from its pod.

- the driver limit: ``NVIDIA_GPU_MEMORY_LIMIT``, whole MiB (the toolkit's hook parses it with
  ``strconv.ParseUint``: decimal digits only, no unit);
- the MPS pinned memory limit: ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, ``<ordinal>=<size>`` items
  separated by commas, or one size for every device, sizes with a unit (``4096M``, ``1G``;
  NVIDIA MPS docs, "Appendix: Environment Variables"). The container sees its own GPUs from
  ordinal 0; where it lists several, the largest counts (the audit cannot tell which of its
  GPUs a process uses by ordinal, and a smaller one would report false excess);
- the share: the applied record's ``fraction`` of the GPU's memory, or its ``memory``
  (``"4096Mi"``).

A pod is one gpushare gave a share when its record has a fraction or a memory size and its
mode is not whole GPUs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.constants import DRIVER_MEMORY_LIMIT_VAR, MPS_MEMORY_LIMIT_VAR
from webhook.node.pod_api import NodePod, PodContainer

MIB = 1024 * 1024
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)B?\s*$", re.IGNORECASE)
_UNIT_BYTES = {"": 1, "K": 1024, "M": MIB, "G": 1024 * MIB, "T": 1024 * 1024 * MIB}


@dataclass(frozen=True)
class ContainerLimits:
    """A container's limits and share on one GPU, in bytes (None: not given)."""

    driver_bytes: int | None
    mps_bytes: int | None
    share_bytes: int | None

    @property
    def tightest_bytes(self) -> int | None:
        """The least of what the container may hold; None where nothing bounds it."""
        known = [b for b in (self.driver_bytes, self.mps_bytes, self.share_bytes) if b]
        return min(known) if known else None


def has_share(pod: NodePod) -> bool:
    """Whether gpushare gave the pod a share of a GPU (not whole GPUs)."""
    record = pod.applied
    if not record or record.get("mode") == "whole-gpu":
        return False
    return "fraction" in record or "memory" in record


def gpu_container(pod: NodePod, container_id: str | None) -> PodContainer | None:
    """The container a process runs in: by its runtime ID, else the one the record names."""
    found = pod.container_by_id(container_id)
    if found is not None:
        return found
    return pod.container(str((pod.applied or {}).get("container")))


def container_limits(
    pod: NodePod, container: PodContainer | None, gpu_memory_bytes: int
) -> ContainerLimits:
    """The limits ``container`` of ``pod`` has on a GPU of ``gpu_memory_bytes``."""
    env = container.env if container is not None else {}
    return ContainerLimits(
        driver_bytes=driver_limit_bytes(env),
        mps_bytes=mps_limit_bytes(env.get(MPS_MEMORY_LIMIT_VAR)),
        share_bytes=share_bytes(pod.applied or {}, gpu_memory_bytes),
    )


def driver_limit_bytes(env: Mapping[str, str]) -> int | None:
    value = env.get(DRIVER_MEMORY_LIMIT_VAR, "")
    return int(value) * MIB if value.isdigit() else None


def mps_limit_bytes(value: str | None) -> int | None:
    """The pinned memory limit's largest size, in bytes; None where unset or unreadable."""
    if not value:
        return None
    sizes = [_size_bytes(item.rpartition("=")[2]) for item in value.split(",") if item.strip()]
    readable = [size for size in sizes if size is not None]
    return max(readable) if readable else None


def _size_bytes(text: str) -> int | None:
    match = _SIZE.match(text)
    if match is None:
        return None
    number, unit = match.groups()
    return math.floor(float(number) * _UNIT_BYTES[unit.upper()])


def share_bytes(record: Mapping[str, Any], gpu_memory_bytes: int) -> int | None:
    """The record's share of a GPU: its fraction of the GPU's memory, or its memory ask."""
    fraction = record.get("fraction")
    if isinstance(fraction, str | int | float):
        try:
            return math.floor(float(fraction) * gpu_memory_bytes)
        except ValueError:
            return None
    memory = record.get("memory")
    if isinstance(memory, str) and memory.endswith("Mi"):
        try:
            return math.floor(float(memory[:-2]) * MIB)
        except ValueError:
            return None
    return None
