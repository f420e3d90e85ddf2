"""Workloads from manifests: files, directories and stdin, read as ``gpushare mutate`` reads
them (``webhook.manifest``: size, document, depth and alias bounds; a v1 List as its items)
and checked for what the apiserver would refuse first (``webhook.offline``).

How many pods each runs at once: a Pod one; Deployment, ReplicaSet, StatefulSet and
ReplicationController ``spec.replicas`` (default 1, as the apiserver defaults it); a Job
``spec.parallelism`` (default 1) capped by ``spec.completions``; a CronJob one run's
parallelism (runs that overlap are not counted); a DaemonSet one pod per node it selects,
which a manifest does not say: counted once, and said. A PodTemplate runs nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.core import WorkloadKind, workload_kind
from webhook.errors import ManifestError
from webhook.manifest import Document, read_manifests
from webhook.offline import document_group, manifest_problems
from webhook.plan.workload import Workload

# More pods than this from one workload is a typo or hostile input, not a team's mix.
MAX_REPLICAS = 1_000_000


def _spec(content: Mapping[str, Any], *path: str) -> Mapping[str, Any]:
    value: Any = content
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, dict) else {}


def _count_field(spec: Mapping[str, Any], field: str, where: str) -> int:
    value = spec.get(field)
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_REPLICAS:
        raise ManifestError(
            f"{where}: {field} {value!r} is not a whole number from 0 to {MAX_REPLICAS:,}"
        )
    return value


def pod_count(content: Mapping[str, Any], kind: WorkloadKind | None, where: str) -> int:
    """Pods the workload runs at once (see the module docstring)."""
    if kind is None:
        return 1
    if kind.kind == "PodTemplate":
        return 0
    if kind.kind == "Job":
        spec = _spec(content, "spec")
        parallel = _count_field(spec, "parallelism", where)
        if spec.get("completions") is None:  # a work queue: parallelism pods at once
            return parallel
        return min(parallel, _count_field(spec, "completions", where))
    if kind.kind == "CronJob":
        return _count_field(_spec(content, "spec", "jobTemplate", "spec"), "parallelism", where)
    if kind.kind == "DaemonSet":
        return 1
    return _count_field(_spec(content, "spec"), "replicas", where)


def _workload(document: Document, namespace: str | None) -> Workload | None:
    content = document.content
    if not isinstance(content, dict):
        return None
    kind_name = content.get("kind")
    group = document_group(content)
    kind = workload_kind(group, kind_name)
    if kind is None and not (kind_name == "Pod" and group == ""):
        return None
    metadata = _spec(content, "metadata")
    where = namespace or metadata.get("namespace") or "default"
    name = str(metadata.get("name") or metadata.get("generateName") or "(no name)")
    source = f"{document.source}:{document.line}"
    label = f"{kind_name}/{where}/{name}"
    count = pod_count(content, kind, f"{source}: {label}")
    note = ""
    if kind is not None and kind.kind == "DaemonSet":
        note = f"{label} runs one pod on each node it selects; counted as one pod"
    return Workload(label, str(where), content, count, source, kind, note)


def read_workloads(
    sources: Sequence[str], *, recursive: bool = False, namespace: str | None = None
) -> list[Workload]:
    """The Pods and workloads of the manifests, in order; other documents are left out."""
    documents = read_manifests(sources, recursive=recursive)
    problems = [line for document in documents for line in manifest_problems(document, namespace)]
    if problems:
        raise ManifestError("\n".join(problems))
    workloads = [w for w in (_workload(d, namespace) for d in documents) if w is not None]
    if not workloads:
        raise ManifestError(
            "the manifests hold no Pod or workload with a pod template (Deployment, Job, ...)"
        )
    return workloads
