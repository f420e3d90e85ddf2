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
    Decision,
    Denied,
    Planned,
    PolicySet,
    Shape,
    TooManyTemplatesError,
    Untouched,
    WorkloadKind,
    WorkloadVerdict,
    api_group,
    check_workload,
    kinds_read,
    mutate,
    mutated_pod,
    pod_shape_problem,
    pod_size_problem,
    template_pod,
    templates_at,
    validate,
    workload_kind,
)
from webhook.errors import ManifestError
from webhook.manifest import Document, key_lines

REPORT_API_VERSION = "gpushare.io/v1alpha1"
ALLOWED, DENIED, UNTOUCHED = "allowed", "denied", "untouched"


@dataclass(frozen=True)
class TemplatePart:
    """One pod template of a workload, for ``explain``: where, its role, its decision."""

    where: str
    role: str
    decision: Decision | None
    operations: int


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
    templates: tuple[TemplatePart, ...] = ()  # a workload's templates, each decided

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


def document_group(content: Mapping[str, Any], policies: PolicySet | None = None) -> str | None:
    """The document's API group; without an apiVersion, the group gpushare knows its kind
    by (kubectl would ask for the apiVersion; the verdict does not depend on it). Also how
    ``gpushare plan`` reads documents."""
    group = api_group(content.get("apiVersion"))
    if group is None and "apiVersion" not in content:
        kind = content.get("kind")
        known = [k.group for k in kinds_read(policies) if k.kind == kind]
        return known[0] if known else "" if kind == "Pod" else None
    return group


def _is_pod(content: Mapping[str, Any]) -> bool:
    return content.get("kind") == "Pod" and document_group(content) == ""


def _untouched_note(content: Mapping[str, Any], kind: str, policies: PolicySet) -> str:
    if not kind:
        return "no kind: not a Kubernetes object"
    if kind == "Pod" or any(k.kind == kind for k in kinds_read(policies)):
        return f"{kind} of apiVersion {content.get('apiVersion')!r} is not one gpushare checks"
    article = "an" if kind[:1].upper() in "AEIOU" else "a"
    return f"{article} {kind} has no pod template gpushare knows of"


def check_documents(
    documents: Sequence[Document],
    policies: PolicySet,
    namespace: str | None = None,
    *,
    explain: bool = False,
) -> list[Checked]:
    """The verdict on each document, in order; ``ManifestError`` lists every document the
    apiserver would refuse before any verdict is given."""
    problems = [
        line for document in documents for line in manifest_problems(document, namespace, policies)
    ]
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
    workload = workload_kind(document_group(content, policies), kind, policies)
    if workload is None and not _is_pod(content):
        note = _untouched_note(content, kind, policies)
        return Checked(document, kind, own_namespace, name, UNTOUCHED, result=content, note=note)
    where = namespace or own_namespace or "default"
    if workload is None:
        pod = mutate(content, where, policies, explain=explain)
        if isinstance(pod.decision, Untouched):
            # A pod the mutating webhook leaves alone still meets the validating checks (the
            # safety net): a device variable or a shared resource set by hand is refused.
            validated = validate(content, where, policies)
            if not validated.allowed:
                denied = Denied(validated.reasons, validated.policy, validated.code)
                pod = replace(validated, decision=denied)
        admitted = mutated_pod(content, pod.decision) if pod.decision else content
        return _verdict(
            Checked(document, kind, where, name, ALLOWED, None, pod.reasons, pod.warnings),
            pod.decision,
            policy=pod.policy,
            patch=pod.patch if pod.allowed else [],
            result=admitted if pod.allowed else None,
        )
    checked = check_workload(content, workload, where, policies, explain=explain)
    if checked is None:
        note = f"no pod template at {workload.where}"
        return Checked(document, kind, where, name, UNTOUCHED, result=content, note=note)
    warnings = checked.warnings + _not_rewritten(checked)
    templates = tuple(
        TemplatePart(t.at.where, t.role, t.decision, len(t.patch)) for t in checked.templates
    )
    base = Checked(
        document,
        kind,
        where,
        name,
        ALLOWED,
        ", ".join(t.where for t in templates) or None,
        checked.reasons,
        warnings,
        templates=templates,
    )
    return _verdict(
        base, checked.decision, policy=checked.policy, patch=checked.patch, result=checked.result
    )


def _not_rewritten(checked: WorkloadVerdict) -> tuple[str, ...]:
    """Templates gpushare cannot show as admitted (not written as the pods' own), said."""
    if not checked.allowed:
        return ()
    return tuple(
        f"{t.lead}{t.at.where} is {t.at.site.shape.described}: shown as written; its pods "
        "get this at creation"
        for t in checked.templates
        if isinstance(t.decision, Planned) and not t.at.site.exact
    )


def _verdict_word(decision: Decision | None) -> str:
    if isinstance(decision, Denied):
        return DENIED
    return ALLOWED if isinstance(decision, Planned) else UNTOUCHED


def _verdict(base: Checked, decision: Decision | None, **fields: Any) -> Checked:
    """``base`` with the verdict ``decision`` gives, and ``fields``."""
    if isinstance(decision, Denied):
        return replace(base, verdict=DENIED, decision=decision, **fields)
    if isinstance(decision, Untouched):
        return replace(base, verdict=UNTOUCHED, decision=decision, note=decision.reason, **fields)
    return replace(base, decision=decision, **fields)


# -- what the apiserver would refuse before gpushare is asked -----------------------------


def _not_strings(
    values: Any, where: str, noun: str, path: tuple[object, ...]
) -> list[tuple[tuple[object, ...], str]]:
    """Each value that is not a string: the path of its key (for its line) and the problem."""
    if not isinstance(values, dict):
        return []
    problems: list[tuple[tuple[object, ...], str]] = []
    for key, value in values.items():
        if isinstance(value, str) or value is None:
            continue
        written = json.dumps(value) if isinstance(value, bool | int | float) else None
        if written is None:
            problems.append(
                ((*path, key), f"{where}.{key} is not a string; {noun} values are strings")
            )
            continue
        problems.append(
            (
                (*path, key),
                f"{where}.{key} is the {'boolean' if isinstance(value, bool) else 'number'} "
                f"{written}, which the apiserver refuses ({noun} values are strings): quote "
                f'it, {key}: "{written}"',
            )
        )
    return problems


def _metadata_problems(
    metadata: Any, where: str, path: tuple[object, ...] = ()
) -> list[tuple[tuple[object, ...], str]]:
    if not isinstance(metadata, dict):
        return []
    at = (*path, "metadata")
    return [
        *_not_strings(
            metadata.get("annotations"),
            f"{where}metadata.annotations",
            "annotation",
            (*at, "annotations"),
        ),
        *_not_strings(metadata.get("labels"), f"{where}metadata.labels", "label", (*at, "labels")),
    ]


def manifest_problems(
    document: Document, namespace: str | None = None, policies: PolicySet | None = None
) -> list[str]:
    """What the apiserver would refuse in a document with a pod, one line each, prefixed
    with ``file:line: Kind/namespace/name:``; documents without a pod are not looked at."""
    content = document.content
    if not isinstance(content, dict):
        return []
    kind, own_namespace, name = _identity(content)
    workload = workload_kind(document_group(content, policies), kind, policies)
    if workload is None and not _is_pod(content):
        return []
    # Each with the path of the key it is about, or None: the document's line says where.
    problems: list[tuple[tuple[object, ...] | None, str]] = []
    problems += _metadata_problems(content.get("metadata"), "")
    if workload is None:
        if not problems:
            shape = pod_shape_problem(content) or pod_size_problem(content)
            problems = [(None, shape.lstrip("."))] if shape else []
    else:
        problems += _template_problems(content, workload, problems)
    where = namespace or own_namespace or "default"
    label = Checked(document, kind, where, name, UNTOUCHED).label
    # The line of each offending key, read again only now that something is wrong.
    keyed = iter(key_lines(document, [path for path, _ in problems if path is not None]))
    lines = [document.line if path is None else next(keyed) for path, _ in problems]
    return [
        f"{document.source}:{line}: {label}: {problem}"
        for line, (_, problem) in zip(lines, problems, strict=True)
    ]


def _template_problems(
    content: Mapping[str, Any],
    workload: WorkloadKind,
    earlier: Sequence[tuple[tuple[object, ...] | None, str]],
) -> list[tuple[tuple[object, ...] | None, str]]:
    """Each template's metadata values, then (where those are fine) its field types and
    sizes, as the pod it makes."""
    try:
        found = templates_at(content, workload)
    except TooManyTemplatesError:
        return []  # the verdict refuses it, saying why
    problems: list[tuple[tuple[object, ...] | None, str]] = []
    for at in found:
        value = at.value
        if at.site.shape is Shape.POD_TEMPLATE and isinstance(value, dict):
            problems += _metadata_problems(value.get("metadata"), f"{at.where}.", at.path)
    if problems or earlier:
        return problems
    for at in found:
        if not isinstance(at.value, dict):
            return [(None, f"{at.where} must be an object.")]
        if at.site.shape is Shape.POD_TEMPLATE:
            pod: Any = at.value
            root = at.where
        elif at.site.shape is Shape.POD_SPEC:
            pod, root = {"spec": at.value}, at.where.rpartition(".")[0] or at.where
        else:
            pod = template_pod(content, workload, at, "default")
            root = at.where
            if pod is None:
                continue
        shape = pod_shape_problem(pod, root) or pod_size_problem(pod, root)
        if shape:
            return [(None, shape.lstrip("."))]
    return []


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
        if item.templates:
            entry["templates"] = [
                {"path": part.where, "role": part.role, "verdict": _verdict_word(part.decision)}
                for part in item.templates
            ]
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
