"""Pod templates: the pods a workload's controller will create, checked where they are written.

A Deployment, a Job, a RayCluster, a PyTorchJob, a LeaderWorkerSet, an InferenceService or
an Argo Workflow carries pod templates (where: ``workload_kinds``); its controller creates
pods from them later, and only then does the mutating webhook see them. Checked only there,
a bad ``gpu-fraction`` surfaces as an event on a ReplicaSet or a RayCluster long after
``kubectl apply`` said "created".

``check_workload`` evaluates each template as the pod the controller would create
(``workload_pods``: the workload's namespace, the template's metadata, the controller's
name and labels) with the very core that answers pods, so a workload whose pods would be
denied is refused with the same reasons, and an accepted one says what each pod will get.
Templates are never changed where they are written: pods are, at creation (the one
exception, the share a Kueue-managed template carries for Kueue to charge, is
``workload_quota``'s). What a template
would look like as the pods get it (``result``, ``patch``) is for the offline CLI, and only
where the template is written as the pods' own (a PodTemplateSpec).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from webhook.constants import REQUEST_ANNOTATIONS
from webhook.core.draft import as_mapping
from webhook.core.group_gpus import short_of_cluster
from webhook.core.object_paths import value_at, written_path
from webhook.core.patch import build_patch, escape_pointer_token
from webhook.core.planning import UNPROCESSABLE, Denied, Planned, Untouched
from webhook.core.policy.model import PolicySet
from webhook.core.render import render
from webhook.core.template_summary import pod_summary
from webhook.core.verdict import Verdict, mutate
from webhook.core.workload_kinds import (
    Shape,
    TemplateAt,
    TemplateSite,
    TooManyTemplatesError,
    WorkloadKind,
    kind_table,
    templates_at,
)
from webhook.core.workload_pods import owner_name, template_pod
from webhook.core.workload_verdicts import TemplateVerdict, WorkloadVerdict


def api_group(api_version: Any) -> str | None:
    """The API group of an ``apiVersion`` ("apps/v1" -> "apps", "v1" -> ""); None if unusable."""
    if not isinstance(api_version, str) or not api_version:
        return None
    return api_version.rpartition("/")[0]


def kinds_read(policies: PolicySet | None = None) -> tuple[WorkloadKind, ...]:
    """Every kind read: the built-in table, then the policy settings' own kinds."""
    return kind_table(policies.workload_kinds if policies is not None else ()).kinds


def workload_kind(
    group: str | None, kind: Any, policies: PolicySet | None = None
) -> WorkloadKind | None:
    """The workload kind of ``group``/``kind``, or None for anything without pod templates.

    Any version of the group: the templates sit at the same paths in every version read.
    """
    return kind_table(policies.workload_kinds if policies is not None else ()).get(group, kind)


def template_changed(
    old: Mapping[str, Any] | None, new: Mapping[str, Any], kind: WorkloadKind
) -> bool:
    """Whether an update touches a pod template, or the metadata its pods take from the
    owner (scaling, a controller's own annotations and finalizer changes do not, and are
    no business of gpushare's)."""
    if old is None:
        return True
    if _request_annotations(old) != _request_annotations(new):
        return True
    try:
        before, after = templates_at(old, kind), templates_at(new, kind)
    except TooManyTemplatesError:
        return True
    if [(t.path, t.value) for t in before] != [(t.path, t.value) for t in after]:
        return True
    owner_fed = any(site.owner_metadata for site in kind.sites)
    return owner_fed and _metadata_of(old) != _metadata_of(new)


def _metadata_of(document: Mapping[str, Any]) -> tuple[Any, Any]:
    metadata = as_mapping(document.get("metadata"))
    return metadata.get("labels"), metadata.get("annotations")


def _request_annotations(document: Mapping[str, Any]) -> dict[str, Any]:
    annotations = as_mapping(as_mapping(document.get("metadata")).get("annotations"))
    return {key: annotations[key] for key in REQUEST_ANNOTATIONS if key in annotations}


def check_template(
    workload: Mapping[str, Any],
    kind: WorkloadKind,
    namespace: str,
    policies: PolicySet,
    at: TemplateAt,
    *,
    explain: bool = False,
) -> TemplateVerdict | None:
    """Evaluate one template as its pods; None when it makes no pod of the user's."""
    pod = template_pod(workload, kind, at, namespace)
    if pod is None:
        return None
    name = owner_name(workload)
    verdict = mutate(pod, namespace, policies, explain=explain)
    decision = verdict.decision
    if not verdict.allowed or not isinstance(decision, Planned):
        return TemplateVerdict(kind, name, at, verdict, planned=at.value)
    prefix = f"{at.role}: " if at.role else ""
    if not at.site.exact:
        summary = pod_summary(decision.record, pod, render(pod, decision.edits), prefix)
        return TemplateVerdict(kind, name, at, verdict, summary, planned=at.value)
    # The template is the pod's own metadata and spec: what it gains is what the pod gains.
    planned = render(at.value, decision.edits)
    summary = pod_summary(decision.record, at.value, planned, prefix)
    pointer = "".join("/" + escape_pointer_token(str(key)) for key in at.path)
    patch = [{**op, "path": pointer + op["path"]} for op in build_patch(at.value, decision.edits)]
    return TemplateVerdict(kind, name, at, verdict, summary, planned, patch)


def check_workload(
    workload: Mapping[str, Any],
    kind: WorkloadKind,
    namespace: str,
    policies: PolicySet,
    *,
    explain: bool = False,
) -> WorkloadVerdict | None:
    """Every template of the workload evaluated as its pods; None when it holds none and
    says nothing about the annotation being misplaced."""
    name = owner_name(workload)
    notes = list(misplaced_annotation(workload, kind))
    if not kind.sites:  # its pods are written elsewhere (a TrainJob's runtime): say where
        return WorkloadVerdict(kind, name, workload, (), (kind.note,))
    try:
        found = templates_at(workload, kind)
    except TooManyTemplatesError as error:
        reasons = (f"{kind.kind} {name!r} {error}",)
        refused = Denied(reasons, None, UNPROCESSABLE)
        problem = Verdict(False, reasons=reasons, code=UNPROCESSABLE, decision=refused)
        return WorkloadVerdict(kind, name, workload, (), tuple(notes), problem)
    checked = [
        check_template(workload, kind, namespace, policies, at, explain=explain) for at in found
    ]
    templates = _with_cluster_checked(
        workload, kind, namespace, tuple(t for t in checked if t is not None)
    )
    if not templates and not notes:
        return None
    if any(not isinstance(t.decision, Untouched) for t in templates):
        notes += modelling_notes(workload, kind, templates)
    return WorkloadVerdict(kind, name, workload, templates, tuple(dict.fromkeys(notes)))


def _with_cluster_checked(
    workload: Mapping[str, Any],
    kind: WorkloadKind,
    namespace: str,
    templates: tuple[TemplateVerdict, ...],
) -> tuple[TemplateVerdict, ...]:
    """The templates, those whose server needs more GPUs than the whole cluster denied."""
    refused = short_of_cluster(workload, kind, [(t.at, t.pod) for t in templates], namespace)
    if not refused:
        return templates
    return tuple(
        replace(t, pod=refused[i], summary=(), planned=None, patch=[]) if i in refused else t
        for i, t in enumerate(templates)
    )


def misplaced_annotation(workload: Mapping[str, Any], kind: WorkloadKind) -> tuple[str, ...]:
    """A request annotation on the workload's own metadata, where it does nothing (its
    pods take their annotations from the templates), said with where it must go."""
    if any(site.owner_metadata for site in kind.sites):
        return ()
    annotations = as_mapping(as_mapping(workload.get("metadata")).get("annotations"))
    found = [key for key in REQUEST_ANNOTATIONS if key in annotations]
    if not found:
        return ()
    if not kind.sites:
        return (f"{found[0]} on the {kind.kind} itself does nothing",)
    homes = list(dict.fromkeys(_annotation_home(site) for site in kind.sites))
    if len(homes) == 1:
        where = homes[0]
    elif all(home.endswith(".metadata.annotations") for home in homes):
        where = "each pod template's metadata.annotations"
    else:
        where = " or ".join(homes)
    return (f"{found[0]} on the {kind.kind} itself does nothing: put it in {where}",)


def _annotation_home(site: TemplateSite) -> str:
    """Where the pods of ``site`` take their annotations from."""
    if site.metadata_from:
        return f"{written_path(site.metadata_from)}.annotations"
    if site.shape is Shape.KSERVE_COMPONENT:
        return f"{site.where}.annotations"
    return f"{site.where}.metadata.annotations"


def modelling_notes(
    workload: Mapping[str, Any], kind: WorkloadKind, templates: Sequence[TemplateVerdict]
) -> list[str]:
    """What gpushare cannot know exactly about these pods, said with the verdict."""
    notes = [kind.note.replace("{name}", owner_name(workload))] if kind.note else []
    for template in templates:
        site = template.at.site
        if site.note and isinstance(template.decision, Planned):
            notes.append(template.lead + site.note)
        if site.shape is Shape.ARGO_TEMPLATE:
            workflow = value_at(workload, template.at.path[:-2])
            patched = isinstance(template.at.value, dict) and "podSpecPatch" in template.at.value
            if patched or (isinstance(workflow, dict) and "podSpecPatch" in workflow):
                notes.append(
                    f"{template.lead}podSpecPatch is not read here (Argo applies it): the pod "
                    "is checked again at creation"
                )
    return list(dict.fromkeys(notes))
