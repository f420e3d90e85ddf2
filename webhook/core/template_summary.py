"""What each pod of a template will get, in warnings short enough for kubectl.

A workload's template is answered with warnings saying what planning gives each of its
pods: the GPU resource and its share, then the nodeSelector, env and anything else it adds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.constants import APPLIED_ANNOTATION
from webhook.core.draft import as_mapping

# Kubernetes: "warnings longer than 120 characters may be truncated".
MAX_WARNING_LENGTH = 119
_EACH_POD = "each pod will get"


def pod_summary(
    record: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any], lead: str = ""
) -> tuple[str, ...]:
    """Warnings saying what planning gives each pod of a template: the GPU resource and
    its share, then the nodeSelector, env and anything else it adds, packed into lines of at
    most 119 characters, each after ``lead`` (the template's role, where the kind has
    several)."""
    old_spec, new_spec = as_mapping(before.get("spec")), as_mapping(after.get("spec"))
    container = str(record.get("container", ""))
    lines = _resource_lines(record, container, lead)
    old_selector = as_mapping(old_spec.get("nodeSelector"))
    selector = [
        f"{key}={value}"
        for key, value in as_mapping(new_spec.get("nodeSelector")).items()
        if old_selector.get(key) != value
    ]
    lines += _packed(f"{lead}{_EACH_POD} nodeSelector ", selector)
    env = _env_changes(_container(old_spec, container), _container(new_spec, container))
    lines += _packed(f"{lead}{_EACH_POD} env ", env)
    others = _other_changes(old_spec, new_spec) + _metadata_changes(before, after)
    lines += _packed(f"{lead}each pod will also get ", others)
    return tuple(lines)


def _resource_lines(record: Mapping[str, Any], container: str, lead: str) -> list[str]:
    """What the container gets and its share, in one line where it fits, else two."""
    details = []
    share = f"{record['fraction']} of a GPU" if "fraction" in record else ""
    if "memory" in record and not share:
        share = f"{record['memory']} of GPU memory"
    if "pool" in record:
        share = f"{share} on pool {record['pool']}".strip()
    if share:
        details.append(share)
    mode = record.get("mode")
    details.append("whole GPUs" if mode == "whole-gpu" else str(mode))
    if "policy" in record:
        details.append(f"policy {record['policy']}")
    gets = f'{lead}{_EACH_POD} {_what(record)} in container "{container}"'
    line = f"{gets} ({', '.join(details)})"
    if len(line) <= MAX_WARNING_LENGTH:
        return [line]
    return [gets, f"{lead}each pod's share: {', '.join(details)}"]


def _what(record: Mapping[str, Any]) -> str:
    """What the record says the container gets: resources and counts, a ResourceClaim, or
    a share KAI-Scheduler places."""
    resources = record.get("resources")
    if isinstance(resources, Mapping) and resources:
        return ", ".join(f"{name}: {count}" for name, count in resources.items())
    if record.get("resource") is not None:
        return f"{record['resource']}: {record.get('slots', record.get('gpus'))}"
    if "claimTemplate" in record:
        return f"a ResourceClaim from template {record['claimTemplate']}"
    if "scheduler" in record:
        devices = record.get("devices")
        on = f" on {devices} GPUs" if isinstance(devices, int) and devices > 1 else ""
        return f"a GPU share placed by {record['scheduler']}{on}"
    return "a GPU share"


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
