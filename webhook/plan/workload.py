"""What a team runs, as gpushare plan sees it: one pod (or pod template) and how many.

Every input (manifests, a live cluster, a CSV table) becomes ``Workload``s; the schemes
then put each through the core as the cluster would. ``kind`` is the workload kind and
``at`` the template that makes the pods (None for a Pod; a RayCluster's head and each worker
group are workloads of their own), so a template is checked exactly as ``gpushare mutate``
and the validating webhook check it (``webhook.core.check_template``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from webhook.core import TemplateAt, WorkloadKind
from webhook.plan.quota_input import ShareQuota


@dataclass(frozen=True)
class Workload:
    name: str  # Kind/namespace/name, or the CSV row's name
    namespace: str
    document: Mapping[str, Any]  # a Pod, or the workload carrying the template
    count: int  # pods it runs at once
    source: str  # file:line, csv:line, or cluster
    kind: WorkloadKind | None = None
    note: str = ""  # what the count could not know (a DaemonSet's nodes), said once
    at: TemplateAt | None = None  # which of the workload's templates makes these pods

    @functools.cached_property
    def same_pods_key(self) -> bytes:
        """Workloads with equal keys get equal decisions, so each is decided once per scheme.

        The document without its name (names never change a decision; namespaces and labels
        do), with the namespace it is evaluated in.
        """
        document = dict(self.document)
        metadata = dict(document.get("metadata") or {})
        for key in ("name", "generateName", "uid", "resourceVersion", "creationTimestamp"):
            metadata.pop(key, None)
        document["metadata"] = metadata
        kind = self.kind.kind if self.kind else "Pod"
        where = self.at.where if self.at else ""
        try:
            return orjson.dumps(
                [self.namespace, kind, where, document], option=orjson.OPT_SORT_KEYS
            )
        except orjson.JSONEncodeError:  # an integer past 64 bits: decided on its own
            return f"unshared:{id(self)}".encode()


@dataclass(frozen=True)
class PlanInput:
    """What one input gives a plan: the workloads, and the quotas on GPU shares it found
    (ResourceQuotas, Kueue ClusterQueues; ``quota_input``) with notes on what it could not
    read; the cluster's nodes where the input has them (a cluster, ``--nodes``), else None."""

    workloads: list[Workload]
    quotas: tuple[ShareQuota, ...] = ()
    notes: tuple[str, ...] = ()
    nodes: tuple[Mapping[str, Any], ...] | None = None
