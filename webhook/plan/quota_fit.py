"""Would each quota on GPU shares hold what a scheme's workloads ask of it?

A workload is charged where its pods carry ``gpushare.io/milligpu``: the scheme's policy for
it sets ``quota.shareResource``, and the share is the applied record's ``milliGpus`` (the
core's own figure, as the webhook writes it), times the pods it runs at once. A
ResourceQuota charges the workloads of its namespace; a ClusterQueue those of its
namespaces that name a Kueue queue (one of its LocalQueues, where the input has them).
A quota holds them when their sum is at most its room (``ShareQuota.room``: hard - used,
plus what the cluster's re-planned pods hold already).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from webhook.core import kueue_queue
from webhook.plan.quota_input import EVERY_NAMESPACE, ShareQuota
from webhook.plan.schemes import Fate
from webhook.plan.workload import Workload


@dataclass(frozen=True)
class QuotaFit:
    quota: ShareQuota
    demand: int  # thousandths of a GPU the workloads it charges ask, summed
    charged: tuple[tuple[str, int], ...]  # (workload, its pods' share), largest first

    @property
    def fits(self) -> bool:
        return self.demand <= self.quota.room

    @property
    def short(self) -> int:
        """By how much the room falls short (0 where it fits)."""
        return max(0, self.demand - self.quota.room)


def charges(quota: ShareQuota, workload: Workload) -> bool:
    if not quota.covers(workload.namespace):
        return False
    if quota.kind != "ClusterQueue":
        return True
    queue = kueue_queue(workload.document)
    if queue is None:
        return False
    return not quota.queues or (workload.namespace, queue) in quota.queues


def check_quotas(quotas: Sequence[ShareQuota], fates: Sequence[Fate]) -> tuple[QuotaFit, ...]:
    """Each quota against the charged workloads, in the quotas' order."""
    if not quotas:
        return ()
    by_namespace: dict[str, list[Fate]] = defaultdict(list)
    for fate in fates:
        if fate.milli_gpus is not None and fate.workload.count > 0:
            by_namespace[fate.workload.namespace].append(fate)
    fits = []
    for quota in quotas:
        namespaces = by_namespace if EVERY_NAMESPACE in quota.namespaces else quota.namespaces
        charged = [
            (fate.workload.name, (fate.milli_gpus or 0) * fate.workload.count)
            for namespace in namespaces
            for fate in by_namespace.get(namespace, ())
            if charges(quota, fate.workload)
        ]
        charged.sort(key=lambda item: -item[1])
        fits.append(QuotaFit(quota, sum(milli for _, milli in charged), tuple(charged)))
    return tuple(fits)
