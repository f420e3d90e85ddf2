"""What ``gpushare mutate`` and ``explain`` say about each document they read.

``check_documents`` puts every document through the core as the cluster would: a Pod as the
mutating webhook answers it, a workload's pod template as the pods its controller will
create (``webhook.core.check_template``), anything else passed through untouched. Before
any of that, every document with a pod is checked for what the apiserver itself would
refuse, so the user hears "quote it" rather than a denial: an annotation or label value that
is not a string (``gpu-fraction: 0.5`` unquoted), or a field of the wrong JSON type.

``report`` is the machine-readable form (``-o json``), one entry per document; ``label``
(``Kind/namespace/name``) prefixes every line a human reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from webhook.core import (
    WORKLOAD_KINDS,
    Decision,
    Denied,
    Planned,
    PolicySet,
    Untouched,
    api_group,
    check_template,
    mutate,
    mutated_pod,
    pod_shape_problem,
    pod_size_problem,
    workload_kind,
)
from webhook.errors import ManifestError
from webhook.manifest import Document

REPORT_API_VERSION = "gpushare.io/v1alpha1"
ALLOWED, DENIED, UNTOUCHED = "allowed", "denied", "untouched"


@dataclass(frozen=True)
class Checked:
    """The verdict on one document, with what the CLI prints about it."""

    document: Document
    kind: str
    namespace: str | None
    name: str
    verdict: str  # allowed | denied | untouched
    template: str | None = None  # where a workload keeps its pod template
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    policy: str | None = None
    patch: list[dict[str, Any]] = field(default_factory=list)
    result: Any = None  # the document as its pods will be admitted; None when denied
    decision: Decision | None = None
    note: str = ""  # why an untouched document is untouched

    @property
    def label(self) -> str:
        """``Kind/namespace/name`` (``Kind/name`` without a namespace)."""
        parts = [self.kind or "(no kind)", self.namespace, self.name or "(no name)"]
        return "/".join(part for part in parts if part)


def _identity(content: Mapping[str, Any]) -> tuple[str, str | None, str]:
    metadata = content.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    kind = content.get("kind")
    namespace = metadata.get("namespace")
    name = metadata.get("name") or metadata.get("generateName")
    return (
        kind if isinstance(kind, str) else "",
        namespace if isinstance(namespace, str) and namespace else None,
        name if isinstance(name, str) else "",
    )


def document_group(content: Mapping[str, Any]) -> str | None:
    """The document's API group; without an apiVersion, the group gpushare knows its kind
    by (kubectl would ask for the apiVersion; the verdict does not depend on it). Also how
    ``gpushare plan`` reads documents."""
    group = api_group(content.get("apiVersion"))
    if group is None and "apiVersion" not in content:
        kind = content.get("kind")
        known = [k.group for k in WORKLOAD_KINDS if k.kind == kind]
        return known[0] if known else "" if kind == "Pod" else None
    return group


def _is_pod(content: Mapping[str, Any]) -> bool:
    return content.get("kind") == "Pod" and document_group(content) == ""


def _untouched_note(content: Mapping[str, Any], kind: str) -> str:
    if not kind:
        return "no kind: not a Kubernetes object"
    if kind == "Pod" or any(k.kind == kind for k in WORKLOAD_KINDS):
        return f"{kind} of apiVersion {content.get('apiVersion')!r} is not one gpushare checks"
    return f"a {kind} has no pod template"


def check_documents(
    documents: Sequence[Document],
    policies: PolicySet,
    namespace: str | None = None,
    *,
    explain: bool = False,
) -> list[Checked]:
    """The verdict on each document, in order; ``ManifestError`` lists every document the
    apiserver would refuse before any verdict is given."""
    problems = [line for document in documents for line in manifest_problems(document, namespace)]
    if problems:
        raise ManifestError("\n".join(problems))
    return [_check(document, policies, namespace, explain) for document in documents]


def _check(
    document: Document, policies: PolicySet, namespace: str | None, explain: bool
) -> Checked:
    content = document.content
    if not isinstance(content, dict):
        kind = type(content).__name__
        return Checked(document, "", None, "", UNTOUCHED, result=content, note=f"a {kind}")
    kind, own_namespace, name = _identity(content)
    workload = workload_kind(document_group(content), kind)
    if workload is None and not _is_pod(content):
        note = _untouched_note(content, kind)
        return Checked(document, kind, own_namespace, name, UNTOUCHED, result=content, note=note)
    where = namespace or own_namespace or "default"
    if workload is None:
        pod = mutate(content, where, policies, explain=explain)
        admitted = mutated_pod(content, pod.decision) if pod.decision else content
        return _verdict(
            Checked(document, kind, where, name, ALLOWED, None, pod.reasons, pod.warnings),
            pod.decision,
            policy=pod.policy,
            patch=pod.patch if pod.allowed else [],
            result=admitted if pod.allowed else None,
        )
    checked = check_template(content, workload, where, policies, explain=explain)
    if checked is None:
        note = f"no pod template at {workload.where}"
        return Checked(document, kind, where, name, UNTOUCHED, result=content, note=note)
    base = Checked(
        document, kind, where, name, ALLOWED, workload.where, checked.reasons, checked.warnings
    )
    return _verdict(
        base, checked.decision, policy=checked.policy, patch=checked.patch, result=checked.result
    )


def _verdict(base: Checked, decision: Decision | None, **fields: Any) -> Checked:
    """``base`` with the verdict ``decision`` gives, and ``fields``."""
    if isinstance(decision, Denied):
        return replace(base, verdict=DENIED, decision=decision, **fields)
    if isinstance(decision, Untouched):
        return replace(base, verdict=UNTOUCHED, decision=decision, note=decision.reason, **fields)
    return replace(base, decision=decision, **fields)


# -- what the apiserver would refuse before gpushare is asked -----------------------------


def _not_strings(values: Any, where: str, noun: str) -> list[str]:
    if not isinstance(values, dict):
        return []
    problems = []
    for key, value in values.items():
        if isinstance(value, str) or value is None:
            continue
        written = json.dumps(value) if isinstance(value, bool | int | float) else None
        if written is None:
            problems.append(f"{where}.{key} is not a string; {noun} values are strings")
            continue
        problems.append(
            f"{where}.{key} is the {'boolean' if isinstance(value, bool) else 'number'} "
            f"{written}, which the apiserver refuses ({noun} values are strings): quote it, "
            f'{key}: "{written}"'
        )
    return problems


def _metadata_problems(metadata: Any, where: str) -> list[str]:
    if not isinstance(metadata, dict):
        return []
    return [
        *_not_strings(metadata.get("annotations"), f"{where}metadata.annotations", "annotation"),
        *_not_strings(metadata.get("labels"), f"{where}metadata.labels", "label"),
    ]


def manifest_problems(document: Document, namespace: str | None = None) -> list[str]:
    """What the apiserver would refuse in a document with a pod, one line each, prefixed
    with ``file:line: Kind/namespace/name:``; documents without a pod are not looked at."""
    content = document.content
    if not isinstance(content, dict):
        return []
    kind, own_namespace, name = _identity(content)
    workload = workload_kind(document_group(content), kind)
    if workload is None and not _is_pod(content):
        return []
    problems = _metadata_problems(content.get("metadata"), "")
    pod: Any = content
    root = ""
    if workload is not None:
        for key in workload.path:
            pod = pod.get(key) if isinstance(pod, dict) else None
        if pod is None:
            pod = {}
        root = workload.where
        problems += _metadata_problems(
            pod.get("metadata") if isinstance(pod, dict) else None, f"{root}."
        )
    if not problems and not isinstance(pod, dict):
        problems = [f"{root} must be an object."]
    elif not problems:
        shape = pod_shape_problem(pod, root) or pod_size_problem(pod, root)
        problems = [shape.lstrip(".")] if shape else []
    where = namespace or own_namespace or "default"
    label = Checked(document, kind, where, name, UNTOUCHED).label
    return [f"{document.source}:{document.line}: {label}: {problem}" for problem in problems]


# -- the machine-readable report ----------------------------------------------------------


def report(checked: Sequence[Checked], kind: str, *, with_result: bool) -> dict[str, Any]:
    """``-o json``: a summary and one entry per document, in input order.

    ``with_result`` (mutate) adds each document's JSON Patch and the document as admitted.
    """
    entries = []
    for item in checked:
        entry: dict[str, Any] = {
            "source": item.document.source,
            "index": item.document.index,
            "item": item.document.item,
            "line": item.document.line,
            "kind": item.kind or None,
            "namespace": item.namespace,
            "name": item.name or None,
            "template": item.template,
            "verdict": item.verdict,
            "policy": item.policy,
            "reasons": list(item.reasons),
            "warnings": list(item.warnings),
        }
        if item.verdict == UNTOUCHED and item.note:
            entry["untouched"] = item.note
        if with_result:
            entry["patch"] = item.patch
            entry["result"] = item.result
        elif isinstance(item.decision, Planned):
            entry["explanation"] = list(item.decision.explanation)
        entries.append(entry)
    summary = {"documents": len(checked)}
    for verdict in (ALLOWED, DENIED, UNTOUCHED):
        summary[verdict] = sum(1 for item in checked if item.verdict == verdict)
    return {
        "apiVersion": REPORT_API_VERSION,
        "kind": kind,
        "summary": summary,
        "documents": entries,
    }
