"""Workloads from manifests: files, directories and stdin, read as ``gpushare mutate`` reads
them (``webhook.manifest``: size, document, depth and alias bounds; a v1 List as its items)
and checked for what the apiserver would refuse first (``webhook.offline``).

A workload with several pod templates (a RayCluster's head and worker groups, a
PyTorchJob's Master and Worker replicas) is one plan workload per template. How many pods
each template runs at once is the core's table's (``webhook.core.pod_count``): a Pod one;
``spec.replicas`` where a controller keeps replicas (default 1, as the apiserver defaults
it); a Job ``spec.parallelism`` (default 1) capped by ``spec.completions``; a CronJob one
run's parallelism (runs that overlap are not counted); a DaemonSet one pod per node it
selects, which a manifest does not say: counted once, and said. A PodTemplate runs nothing
itself.

The same manifests may hold the quotas on GPU shares the workloads are checked against:
ResourceQuotas, Kueue ClusterQueues and their LocalQueues (``quota_input``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.core import (
    PolicySet,
    TooManyTemplatesError,
    pod_count,
    template_pod,
    templates_at,
    workload_kind,
)
from webhook.errors import ManifestError
from webhook.manifest import Document, read_manifests
from webhook.offline import document_group, manifest_problems
from webhook.plan.quota_input import quotas_of
from webhook.plan.workload import PlanInput, Workload


def _metadata(content: Mapping[str, Any]) -> Mapping[str, Any]:
    value = content.get("metadata")
    return value if isinstance(value, dict) else {}


def _workloads(
    document: Document, namespace: str | None, policies: PolicySet | None
) -> list[Workload]:
    content = document.content
    if not isinstance(content, dict):
        return []
    kind_name = content.get("kind")
    group = document_group(content, policies)
    kind = workload_kind(group, kind_name, policies)
    if kind is None and not (kind_name == "Pod" and group == ""):
        return []
    metadata = _metadata(content)
    where = namespace or metadata.get("namespace") or "default"
    name = str(metadata.get("name") or metadata.get("generateName") or "(no name)")
    source = f"{document.source}:{document.line}"
    label = f"{kind_name}/{where}/{name}"
    if kind is None:
        return [Workload(label, str(where), content, 1, source)]
    try:
        found = templates_at(content, kind)
    except TooManyTemplatesError as error:
        raise ManifestError(f"{source}: {label} {error}") from error
    workloads = []
    for at in found:
        if template_pod(content, kind, at, str(where)) is None:
            continue  # a template that makes no pod of the user's (an Argo steps template)
        named = f"{label} ({at.role})" if at.role else label
        try:
            count = pod_count(content, at, f"{source}: {named}")
        except ValueError as error:
            raise ManifestError(str(error)) from error
        note = f"{named} {at.site.pods_note}" if at.site.pods_note else ""
        workloads.append(Workload(named, str(where), content, count, source, kind, note, at))
    return workloads


def read_workloads(
    sources: Sequence[str],
    *,
    recursive: bool = False,
    namespace: str | None = None,
    policies: PolicySet | None = None,
) -> list[Workload]:
    """The Pods and workloads' templates of the manifests, in order; other documents are
    left out."""
    return read_manifest_input(
        sources, recursive=recursive, namespace=namespace, policies=policies
    ).workloads


def read_manifest_input(
    sources: Sequence[str],
    *,
    recursive: bool = False,
    namespace: str | None = None,
    policies: PolicySet | None = None,
) -> PlanInput:
    """The workloads of the manifests (``read_workloads``) and the quotas on GPU shares
    among them."""
    documents = read_manifests(sources, recursive=recursive)
    problems = [
        line for document in documents for line in manifest_problems(document, namespace, policies)
    ]
    if problems:
        raise ManifestError("\n".join(problems))
    workloads = [w for d in documents for w in _workloads(d, namespace, policies)]
    if not workloads:
        raise ManifestError(
            "the manifests hold no Pod or workload with a pod template (Deployment, Job, "
            "RayCluster, ...)"
        )
    found = ((d.content, f"{d.source}:{d.line}") for d in documents)
    return PlanInput(workloads, quotas_of(found, namespace))
