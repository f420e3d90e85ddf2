"""What one admitted pod takes: the value every capacity model returns, or why there is
none. (Models: ``capacity`` for the NVIDIA device plugin's modes and whole GPUs,
``scheme_capacity`` for the other schemes.)"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core import Policy


@dataclass(frozen=True)
class Demand:
    """What one pod takes: ``size`` of a bin of ``capacity`` in the bins of ``group``.

    ``node_bins``: the bins are nodes (whole GPUs: ``capacity`` is GPUs per node), not GPUs.
    ``share`` is the part of one GPU the pod asked for and ``memory_mib`` its GPU memory
    where known; they measure what is left idle.
    """

    group: str
    capacity: tuple[int, ...]
    size: tuple[int, ...]
    unit: str
    gpus_per_node: int
    share: float
    gpu_memory_mib: int | None = None
    memory_mib: float | None = None
    node_bins: bool = False


@dataclass(frozen=True)
class NotModelled:
    """A pod the core admitted under a mode this package has no capacity model for."""

    reason: str


Model = Callable[[Policy, Mapping[str, Any], int], Demand | NotModelled]
