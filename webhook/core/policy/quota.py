"""A policy's ``quota`` section: GPU shares counted where the cluster keeps quota.

- ``shareResource``: every pod the policy admits carries ``gpushare.io/milligpu`` (the share
  in thousandths of a GPU, requests equal to limits), and so does the pod template of a
  workload Kueue manages, so that Kueue charges it before any pod exists;
- ``showbackLabels``: the share, pool and GPU model as pod labels a cost tool groups by;
- ``namespaces``: a ResourceQuota per namespace, in GPUs' worth of shares;
- ``kueue``: a ClusterQueue (with its ResourceFlavor and a LocalQueue per namespace) whose
  nominal quota is in GPUs' worth of shares.

The objects that follow from the declarations are built by ``webhook.install``
(``gpushare webhook-config --quotas``, the Helm chart); docs/quotas.md says what each unit
means under each scheme. The schema fragment, the frozen values and their builder live
here together, one concept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from webhook.constants import MILLI_GPUS_PER_GPU, SHARE_RESOURCE

# GPUs' worth of shares, to the thousandth: "4", "1.5", "0.25".
_GPUS = {"type": "string", "pattern": r"^\d{1,6}(\.\d{1,3})?$", "maxLength": 10}
_NAMESPACE = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
_QUANTITY = {"type": "string", "pattern": r"^\d+(\.\d+)?(m|Ki|Mi|Gi|Ti|k|K|M|G|T)?$"}

QUOTA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "shareResource": {
            "type": "boolean",
            "description": "Pods (and Kueue-managed workloads' templates) carry "
            "gpushare.io/milligpu: the share in thousandths of a GPU (default false; needs "
            "`gpushare share-capacity` advertising it on the GPU nodes).",
        },
        "showbackLabels": {
            "type": "boolean",
            "description": "Label pods with gpushare.io/milligpu, gpushare.io/pool and "
            "gpushare.io/gpu-model (default false).",
        },
        "namespaces": {
            "type": "object",
            "maxProperties": 1000,
            "propertyNames": _NAMESPACE,
            "additionalProperties": _GPUS,
            "description": "namespace: GPUs' worth of shares, emitted as a ResourceQuota on "
            "requests.gpushare.io/milligpu.",
        },
        "kueue": {
            "type": "object",
            "additionalProperties": False,
            "required": ["clusterQueue", "gpus", "namespaces"],
            "properties": {
                "clusterQueue": _NAMESPACE,
                "gpus": _GPUS,
                "namespaces": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 1000,
                    "uniqueItems": True,
                    "items": _NAMESPACE,
                },
                "resources": {
                    "type": "object",
                    "maxProperties": 32,
                    "propertyNames": {
                        "type": "string",
                        "pattern": r"^([a-z0-9.-]+/)?[A-Za-z0-9._-]+$",
                        "maxLength": 253,
                    },
                    "additionalProperties": _QUANTITY,
                    "description": "The ClusterQueue's other covered resources and their "
                    "nominal quotas (cpu, memory, ...): Kueue admits a workload only where "
                    "every resource it requests is covered.",
                },
            },
        },
    },
}


def milli_gpus(gpus_text: str) -> int:
    """Thousandths of a GPU in a schema-valid ``gpus`` text ("1.5" -> 1500), exactly."""
    whole, _, decimals = gpus_text.partition(".")
    return int(whole) * MILLI_GPUS_PER_GPU + int((decimals + "000")[:3])


@dataclass(frozen=True)
class KueueQuota:
    """A ClusterQueue of GPU shares and the namespaces whose LocalQueues feed it."""

    cluster_queue: str
    milli_gpus: int
    namespaces: tuple[str, ...]
    resources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class QuotaSettings:
    share_resource: bool = False
    showback_labels: bool = False
    # namespace -> thousandths of a GPU (a ResourceQuota each).
    namespaces: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    kueue: KueueQuota | None = None

    @property
    def records_share(self) -> bool:
        """Whether pods get the share in thousandths in their applied record."""
        return self.share_resource or self.showback_labels


def build_quota(raw: Mapping[str, Any] | None) -> QuotaSettings:
    """The values of a schema-valid ``quota`` section (absent: everything off)."""
    if not raw:
        return QuotaSettings()
    kueue = raw.get("kueue")
    return QuotaSettings(
        share_resource=bool(raw.get("shareResource", False)),
        showback_labels=bool(raw.get("showbackLabels", False)),
        namespaces=MappingProxyType(
            {name: milli_gpus(gpus) for name, gpus in (raw.get("namespaces") or {}).items()}
        ),
        kueue=None
        if kueue is None
        else KueueQuota(
            cluster_queue=kueue["clusterQueue"],
            milli_gpus=milli_gpus(kueue["gpus"]),
            namespaces=tuple(kueue["namespaces"]),
            resources=MappingProxyType(dict(kueue.get("resources") or {})),
        ),
    )


def quota_findings(quota: QuotaSettings) -> list[tuple[str, tuple[str | int, ...]]]:
    """What is wrong across the section's fields: (message, where under spec)."""
    found: list[tuple[str, tuple[str | int, ...]]] = []
    declared = bool(quota.namespaces) or quota.kueue is not None
    if declared and not quota.share_resource:
        found.append(
            (
                "quota.namespaces and quota.kueue count gpushare.io/milligpu, which pods carry "
                "only with quota.shareResource: true; set it (and run `gpushare "
                "share-capacity` so the GPU nodes advertise the resource)",
                ("quota",),
            )
        )
    if quota.kueue is not None and SHARE_RESOURCE in quota.kueue.resources:
        found.append(
            (
                f"{SHARE_RESOURCE} is the queue's GPU share, set by quota.kueue.gpus: "
                "remove it from resources",
                ("quota", "kueue", "resources"),
            )
        )
    if quota.kueue is not None and quota.kueue.milli_gpus == 0:
        found.append(("quota.kueue.gpus must be more than 0", ("quota", "kueue", "gpus")))
    return found


def quotas_declared_twice(
    named: Sequence[tuple[str, QuotaSettings]],
) -> list[tuple[int, tuple[str, ...], str]]:
    """A namespace's quota or a ClusterQueue declared by a second policy: (its index, where
    under ``spec.quota``, message). One declaration each, so the emitted objects have one
    source for their numbers."""
    found: list[tuple[int, tuple[str, ...], str]] = []
    quotas: dict[str, str] = {}
    queues: dict[str, str] = {}
    for index, (name, quota) in enumerate(named):
        for namespace in quota.namespaces:
            other = quotas.setdefault(namespace, name)
            if other != name:
                message = (
                    f"namespace {namespace!r} has its quota declared by policy {other!r} too: "
                    "declare each namespace's quota in one policy"
                )
                found.append((index, ("namespaces",), message))
        if quota.kueue is not None:
            queue = quota.kueue.cluster_queue
            other = queues.setdefault(queue, name)
            if other != name:
                message = (
                    f"ClusterQueue {queue!r} is declared by policy {other!r} too: give each "
                    "policy's queue its own name"
                )
                found.append((index, ("kueue", "clusterQueue"), message))
    return found
