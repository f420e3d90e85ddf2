"""GPU share counted by quota: the ``gpushare.io/milligpu`` every GPU node advertises.

A policy with ``quota.shareResource`` puts ``gpushare.io/milligpu`` (thousandths of one GPU)
on the pods it admits, so a plain ResourceQuota counts GPU share; the scheduler places such a
pod only on a node that advertises the resource. ``ShareCapacity`` (``gpushare
share-capacity``) keeps it on every GPU node: 1000 per GPU of GPU Feature
Discovery's ``nvidia.com/gpu.count``, through the small ``NodeApi`` (``KubeNodeApi`` in a cluster).

This is the package's face: other packages import only the names below. Layout:
docs/architecture.md.
"""

from webhook.quota.kube_nodes import KubeNodeApi
from webhook.quota.share_capacity import (
    MAX_GPUS_PER_NODE,
    NodeApi,
    NodeApiError,
    NodeEvent,
    NodeShare,
    PassResult,
    ShareCapacity,
    WatchExpiredError,
    capacity_patch,
    configure_logging,
    desired_share_capacity,
    gpu_count,
    run,
)

__all__ = [
    "MAX_GPUS_PER_NODE",
    "KubeNodeApi",
    "NodeApi",
    "NodeApiError",
    "NodeEvent",
    "NodeShare",
    "PassResult",
    "ShareCapacity",
    "WatchExpiredError",
    "capacity_patch",
    "configure_logging",
    "desired_share_capacity",
    "gpu_count",
    "run",
]
