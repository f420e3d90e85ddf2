"""Workloads Kueue manages: their templates carry the GPU share their pods will hold.

Kueue charges a Job, JobSet, RayJob or PyTorchJob in its ClusterQueue from the pod
templates, when it creates the Workload object, before any pod exists (sigs.k8s.io/kueue
v0.17.0: pkg/controller/jobframework/reconciler.go ``constructWorkload`` copies the job's
PodSets, templates included; pkg/workload/workload.go ``totalRequestsFromPodSets`` sums
each template's container requests, less ``excludeResourcePrefixes``, through the
configured resource transformations). gpushare otherwise
changes pods only, at creation: a template that says ``gpu-fraction: "0.5"`` would ask
Kueue for no GPU at all and be admitted past a full queue. So for a workload that names a
Kueue LocalQueue (the ``kueue.x-k8s.io/queue-name`` label) and whose policy counts shares
(``quota.shareResource``), each PodTemplateSpec's GPU container gets
``gpushare.io/milligpu``, the value its pods will get from the pod webhook; nothing else in
the template changes (the pods still get their scheme's resources, node selection and env
at creation). The choice and its alternatives: docs/quotas.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.constants import KUEUE_QUEUE_LABEL, SHARE_RESOURCE
from webhook.core.draft import as_mapping
from webhook.core.edits import PodEdits
from webhook.core.patch import JsonPatch, build_patch, escape_pointer_token
from webhook.core.planning import Planned
from webhook.core.workload_kinds import Shape
from webhook.core.workload_verdicts import TemplateVerdict, WorkloadVerdict


@dataclass(frozen=True)
class KueueCharge:
    """The patch that puts the share into the templates, and what to tell the user."""

    patch: JsonPatch = field(default_factory=list)
    warnings: tuple[str, ...] = ()
    policy: str | None = None


def kueue_queue(workload: Mapping[str, Any]) -> str | None:
    """The LocalQueue a workload names for Kueue, or None."""
    labels = as_mapping(as_mapping(workload.get("metadata")).get("labels"))
    queue = labels.get(KUEUE_QUEUE_LABEL)
    return queue if isinstance(queue, str) and queue else None


def kueue_charge(checked: WorkloadVerdict) -> KueueCharge:
    """The share resource into each admitted PodTemplateSpec of a Kueue-managed workload
    whose policy counts shares; a warning for each template Kueue will charge no share."""
    queue = kueue_queue(checked.document)
    if queue is None or not checked.allowed:
        return KueueCharge()
    patch: JsonPatch = []
    warnings: list[str] = []
    policy: str | None = None
    for template in checked.templates:
        decision = template.decision
        if not isinstance(decision, Planned) or template.at.site.shape is not Shape.POD_TEMPLATE:
            continue
        policy = policy or decision.policy.name
        milli = decision.record.get("milliGpus")
        if not decision.policy.quota.share_resource or not isinstance(milli, int):
            warnings.append(
                f"{template.lead}Kueue (queue {queue!r}) charges this template no GPU share: "
                f"policy {decision.policy.name!r} does not set quota.shareResource, so its "
                f"pods carry no {SHARE_RESOURCE} for a ClusterQueue to count (docs/quotas.md)"
            )
            continue
        patch += _share_ops(template, str(decision.record.get("container")), milli)
    return KueueCharge(patch, tuple(dict.fromkeys(warnings)), policy)


def _share_ops(template: TemplateVerdict, container_name: str, milli: int) -> JsonPatch:
    """Ops setting the share resource in the named container's limits and requests."""
    spec = as_mapping(as_mapping(template.at.value).get("spec"))
    containers = spec.get("containers")
    names = [as_mapping(c).get("name") for c in containers] if isinstance(containers, list) else []
    if container_name not in names:
        return []
    index = names.index(container_name)
    edits = PodEdits()
    for section in ("limits", "requests"):
        edits.set(("spec", "containers", index, "resources", section, SHARE_RESOURCE), str(milli))
    pointer = "".join("/" + escape_pointer_token(key) for key in template.at.path)
    return [{**op, "path": pointer + op["path"]} for op in build_patch(template.at.value, edits)]
