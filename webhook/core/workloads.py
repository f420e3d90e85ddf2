"""Pod templates: the pods a workload's controller will create, checked where they are written.

A Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController, Job, CronJob or
PodTemplate carries a pod template; its controller creates pods from it later, and only then
does the mutating webhook see them. Checked only there, a bad ``gpu-fraction`` surfaces as an
event on a ReplicaSet long after ``kubectl apply`` said "created".

``check_template`` evaluates a template as the pod the controller would create (the
workload's namespace, the template's metadata, a ``generateName`` from the workload's name)
with the very core that answers pods, so a template its pods would be denied for is refused
with the same reasons, and an accepted one says what each pod will get. Templates are never
changed where they are written: pods are, at creation. What the template would look like as
the pods get it (``result``, ``patch``) is for the offline CLI.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.constants import APPLIED_ANNOTATION
from webhook.core.draft import as_mapping
from webhook.core.patch import JsonPatch, build_patch, escape_pointer_token
from webhook.core.planning import Decision, Planned
from webhook.core.policy.model import PolicySet
from webhook.core.render import render
from webhook.core.verdict import Verdict, mutate

# Kubernetes: "warnings longer than 120 characters may be truncated".
MAX_WARNING_LENGTH = 119
_EACH_POD = "each pod will get"


@dataclass(frozen=True)
class WorkloadKind:
    """A kind that carries a pod template, and where (``spec.template`` for most)."""

    group: str
    kind: str
    resource: str
    path: tuple[str, ...]

    @property
    def where(self) -> str:
        return ".".join(self.path)


_SPEC_TEMPLATE = ("spec", "template")
WORKLOAD_KINDS: tuple[WorkloadKind, ...] = (
    WorkloadKind("apps", "Deployment", "deployments", _SPEC_TEMPLATE),
    WorkloadKind("apps", "StatefulSet", "statefulsets", _SPEC_TEMPLATE),
    WorkloadKind("apps", "DaemonSet", "daemonsets", _SPEC_TEMPLATE),
    WorkloadKind("apps", "ReplicaSet", "replicasets", _SPEC_TEMPLATE),
    WorkloadKind("batch", "Job", "jobs", _SPEC_TEMPLATE),
    WorkloadKind("", "ReplicationController", "replicationcontrollers", _SPEC_TEMPLATE),
    WorkloadKind("batch", "CronJob", "cronjobs", ("spec", "jobTemplate", "spec", "template")),
    WorkloadKind("", "PodTemplate", "podtemplates", ("template",)),
)
_BY_GROUP_KIND = {(k.group, k.kind): k for k in WORKLOAD_KINDS}


def api_group(api_version: Any) -> str | None:
    """The API group of an ``apiVersion`` ("apps/v1" -> "apps", "v1" -> ""); None if unusable."""
    if not isinstance(api_version, str) or not api_version:
        return None
    return api_version.rpartition("/")[0]


def workload_kind(group: str | None, kind: Any) -> WorkloadKind | None:
    """The workload kind of ``group``/``kind``, or None for anything without a pod template.

    Any version of the group: the template sits at the same path in every version.
    """
    if group is None or not isinstance(kind, str):
        return None
    return _BY_GROUP_KIND.get((group, kind))


def pod_template(workload: Mapping[str, Any], kind: WorkloadKind) -> Any:
    """What sits at the kind's template path (None where any step is missing)."""
    value: Any = workload
    for key in kind.path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def template_changed(
    old: Mapping[str, Any] | None, new: Mapping[str, Any], kind: WorkloadKind
) -> bool:
    """Whether an update touches the pod template (scaling, labels, a controller's own
    annotations and finalizer changes do not, and are no business of gpushare's)."""
    return old is None or pod_template(old, kind) != pod_template(new, kind)


def controller_pod(template: Mapping[str, Any], namespace: str, owner: str) -> dict[str, Any]:
    """The pod a controller creates from ``template``: its metadata and spec, in the
    workload's namespace, named from the workload (``<owner>-`` plus a suffix)."""
    metadata = dict(as_mapping(template.get("metadata")))
    metadata.pop("name", None)
    metadata["namespace"] = namespace
    if owner:
        metadata["generateName"] = f"{owner}-"
    spec = template.get("spec")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec if spec is not None else {},
    }


@dataclass(frozen=True)
class TemplateVerdict:
    """The answer for a workload: its pods' verdict, told about the template.

    ``summary`` says what each pod will get; ``result`` is the workload with its template as
    the pods will be admitted (None when denied) and ``patch`` turns the workload into it.
    """

    kind: WorkloadKind
    name: str
    pod: Verdict
    summary: tuple[str, ...] = ()
    result: dict[str, Any] | None = None
    patch: JsonPatch = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return self.pod.allowed

    @property
    def reasons(self) -> tuple[str, ...]:
        return self.pod.reasons

    @property
    def code(self) -> int:
        return self.pod.code

    @property
    def policy(self) -> str | None:
        return self.pod.policy

    @property
    def decision(self) -> Decision | None:
        return self.pod.decision

    @property
    def warnings(self) -> tuple[str, ...]:
        """What each pod will get, then what the pod itself would be warned about."""
        return tuple(dict.fromkeys((*self.summary, *self.pod.warnings)))

    @property
    def denial_prefix(self) -> str:
        return f"pod template of {self.kind.kind} {self.name!r}:"

    @property
    def admission_reasons(self) -> tuple[str, ...]:
        """The pod's reasons after a prefix saying they are about this workload's template."""
        return (self.denial_prefix, *self.reasons)


def check_template(
    workload: Mapping[str, Any],
    kind: WorkloadKind,
    namespace: str,
    policies: PolicySet,
    *,
    explain: bool = False,
) -> TemplateVerdict | None:
    """Evaluate the workload's pod template as its pods; None when it carries none."""
    template = pod_template(workload, kind)
    if not isinstance(template, dict):
        return None
    metadata = as_mapping(workload.get("metadata"))
    name = str(metadata.get("name") or metadata.get("generateName") or "")
    pod = controller_pod(template, namespace, name)
    verdict = mutate(pod, namespace, policies, explain=explain)
    if not verdict.allowed:
        return TemplateVerdict(kind, name, verdict)
    decision = verdict.decision
    if not isinstance(decision, Planned):
        return TemplateVerdict(kind, name, verdict, result=dict(workload))
    planned = render(template, decision.edits)
    pointer = "".join("/" + escape_pointer_token(key) for key in kind.path)
    patch = [{**op, "path": pointer + op["path"]} for op in build_patch(template, decision.edits)]
    return TemplateVerdict(
        kind,
        name,
        verdict,
        summary=pod_summary(decision.record, template, planned),
        result=_replaced(workload, kind.path, planned),
        patch=patch,
    )


def _replaced(document: Mapping[str, Any], path: Sequence[str], value: Any) -> dict[str, Any]:
    """A copy of ``document`` with ``value`` at ``path``, copying only the objects on it."""
    result = dict(document)
    if len(path) == 1:
        result[path[0]] = value
    else:
        result[path[0]] = _replaced(as_mapping(document.get(path[0])), path[1:], value)
    return result


# -- what each pod will get, in warnings short enough for kubectl ---------------------------


def pod_summary(
    record: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]
) -> tuple[str, ...]:
    """Warnings saying what planning gives each pod of a template: the GPU resource and
    its share, then the nodeSelector, env and anything else it adds, packed into lines of at
    most 119 characters."""
    old_spec, new_spec = as_mapping(before.get("spec")), as_mapping(after.get("spec"))
    container = str(record.get("container", ""))
    lines = [_resource_line(record, container)]
    old_selector = as_mapping(old_spec.get("nodeSelector"))
    selector = [
        f"{key}={value}"
        for key, value in as_mapping(new_spec.get("nodeSelector")).items()
        if old_selector.get(key) != value
    ]
    lines += _packed(f"{_EACH_POD} nodeSelector ", selector)
    env = _env_changes(_container(old_spec, container), _container(new_spec, container))
    lines += _packed(f"{_EACH_POD} env ", env)
    others = _other_changes(old_spec, new_spec) + _metadata_changes(before, after)
    lines += _packed("each pod will also get ", others)
    return tuple(lines)


def _resource_line(record: Mapping[str, Any], container: str) -> str:
    count = record.get("slots", record.get("gpus"))
    details = []
    share = f"{record['fraction']} of a GPU" if "fraction" in record else ""
    if "pool" in record:
        share = f"{share} on pool {record['pool']}".strip()
    if share:
        details.append(share)
    mode = record.get("mode")
    details.append("whole GPUs" if mode == "whole-gpu" else str(mode))
    if "policy" in record:
        details.append(f"policy {record['policy']}")
    return (
        f'{_EACH_POD} {record.get("resource")}: {count} in container "{container}" '
        f"({', '.join(details)})"
    )


def _container(spec: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    for container in spec.get("containers") or ():
        if as_mapping(container).get("name") == name:
            return as_mapping(container)
    return as_mapping(None)


def _env_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    old = {as_mapping(entry).get("name"): as_mapping(entry) for entry in before.get("env") or ()}
    changes = []
    for item in after.get("env") or ():
        entry = as_mapping(item)
        if old.get(entry.get("name")) == entry:
            continue
        value = entry.get("value")
        changes.append(f"{entry.get('name')}={value}" if value is not None else entry.get("name"))
    return [str(change) for change in changes]


def _other_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Spec changes beyond resources, nodeSelector and env, named briefly."""
    notes = []
    if after.get("hostIPC") and not before.get("hostIPC"):
        notes.append("hostIPC")
    old_volumes = {as_mapping(v).get("name") for v in before.get("volumes") or ()}
    notes += [
        f"volume {as_mapping(v).get('name')}"
        for v in after.get("volumes") or ()
        if as_mapping(v).get("name") not in old_volumes
    ]
    old_tolerations = list(before.get("tolerations") or ())
    notes += [
        f"toleration {as_mapping(t).get('key') or '*'}"
        for t in after.get("tolerations") or ()
        if t not in old_tolerations
    ]
    covered = {"containers", "nodeSelector", "hostIPC", "volumes", "tolerations"}
    notes += [
        f"spec.{key}" for key in after if key not in covered and after.get(key) != before.get(key)
    ]
    return notes


def _metadata_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Labels and annotations a policy injects (the record of what was applied aside)."""
    old, new = as_mapping(before.get("metadata")), as_mapping(after.get("metadata"))
    notes = []
    for section, noun in (("labels", "label"), ("annotations", "annotation")):
        old_values = as_mapping(old.get(section))
        notes += [
            f"{noun} {key}={value}"
            for key, value in as_mapping(new.get(section)).items()
            if old_values.get(key) != value and key != APPLIED_ANNOTATION
        ]
    return notes


def _packed(head: str, items: Sequence[str]) -> list[str]:
    """``head`` + items joined by commas, in as few lines as fit 119 characters each."""
    lines: list[str] = []
    current: list[str] = []
    for item in items:
        candidate = head + ", ".join([*current, item])
        if current and len(candidate) > MAX_WARNING_LENGTH:
            lines.append(head + ", ".join(current))
            current = []
        current.append(item)
    if current:
        lines.append(head + ", ".join(current))
    return lines
