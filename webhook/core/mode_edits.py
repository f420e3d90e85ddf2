"""What the chosen pool and sharing mode need from the pod beyond resources and env: node
labels to select, the GPU memory a node must have (node affinity), the mode's volumes and
mounts (the MPS pipe directory), hostIPC, the scheduler, pod annotations the scheme reads,
and pod-level resource claims (Dynamic Resource Allocation).

Values the pod already holds are checked, not overwritten: a conflicting nodeSelector,
volume or mount path is a problem the user must resolve.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from webhook.constants import GFD_MEMORY_LABEL
from webhook.core.draft import PlanDraft, as_mapping
from webhook.core.edits import Path
from webhook.core.modes import ModeChanges
from webhook.core.node_constraints import selector_excluded_by_affinity

_REQUIRED_NODE_AFFINITY: Path = (
    "spec",
    "affinity",
    "nodeAffinity",
    "requiredDuringSchedulingIgnoredDuringExecution",
)


def select_nodes(draft: PlanDraft, wanted: Mapping[str, str]) -> None:
    """The labels in the pod's nodeSelector; one the pod's own nodeSelector holds with
    another value, or its required node affinity rules out, is a problem (a pod that would
    never schedule)."""
    current = as_mapping(draft.spec.get("nodeSelector"))
    affinity = draft.spec.get("affinity")
    for key, value in wanted.items():
        if key in current and current[key] != value:
            draft.problems.append(
                f"nodeSelector {key}={current[key]} conflicts with {key}={value} that the "
                f"GPU pool chosen by policy {draft.policy.name!r} needs: remove it from the "
                "pod."
            )
        elif affinity and (excluded := selector_excluded_by_affinity(draft.spec, key, value)):
            draft.unschedulable.append(
                f"the pod's required node affinity ({excluded}) rules out {key}={value}, "
                f"which the GPU pool chosen by policy {draft.policy.name!r} needs: let the "
                f"affinity admit {key}={value}, or remove {key} from it."
            )
        draft.edits.set(("spec", "nodeSelector", key), value)
        if draft.explaining:
            draft.explanation.append(f"nodeSelector: {key}={value}")


def require_gpu_memory(draft: PlanDraft, at_least_mib: int) -> None:
    """Only nodes whose GPUs have ``at_least_mib`` MiB by GFD's label.

    nodeSelectorTerms are ORed and the expressions of a term ANDed (Kubernetes "Assigning
    Pods to Nodes"), so the requirement goes into every term the pod already has, or makes
    the only one. Gt compares the label as an integer and is strict, hence N - 1.
    """
    expression = {"key": GFD_MEMORY_LABEL, "operator": "Gt", "values": [str(at_least_mib - 1)]}
    affinity = as_mapping(as_mapping(draft.spec.get("affinity")).get("nodeAffinity"))
    required = as_mapping(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = required.get("nodeSelectorTerms")
    if not isinstance(terms, list) or not terms:
        draft.edits.set(
            (*_REQUIRED_NODE_AFFINITY, "nodeSelectorTerms"), [{"matchExpressions": [expression]}]
        )
    for index, term in enumerate(terms or ()):
        expressions = as_mapping(term).get("matchExpressions") or []
        if not isinstance(term, dict) or not isinstance(expressions, list):
            draft.problems.append(
                f"spec.affinity.nodeAffinity: nodeSelectorTerms[{index}] is not a node "
                "selector term with a list of matchExpressions: fix it."
            )
        elif expression not in expressions:
            path = (*_REQUIRED_NODE_AFFINITY, "nodeSelectorTerms", index, "matchExpressions")
            draft.edits.append(path, dict(expression, values=list(expression["values"])))
    if draft.explaining:
        draft.explanation.append(
            f"nodeAffinity: {GFD_MEMORY_LABEL} Gt {at_least_mib - 1} (GPUs of at least "
            f"{at_least_mib}Mi), in every nodeSelectorTerm"
        )


def add_volumes(draft: PlanDraft, changes: ModeChanges) -> None:
    """The mode's volumes in the pod, its mounts in the container."""
    volumes = {str(as_mapping(v).get("name")): v for v in draft.spec.get("volumes") or ()}
    for volume in changes.volumes:
        existing = volumes.get(str(volume["name"]))
        if existing is None:
            # Deep copies: mode changes are memoized; planned pods must not share dicts.
            draft.edits.append(("spec", "volumes"), copy.deepcopy(dict(volume)))
            if draft.explaining:
                draft.explanation.append(f"volume {volume['name']}: {dict(volume)}")
        elif existing != volume:
            draft.problems.append(
                f"the pod already has a volume named {volume['name']!r} that differs from "
                "the one the MPS daemon needs: rename it."
            )
    mounts = draft.container.get("volumeMounts") or []
    for mount in changes.volume_mounts:
        if any(as_mapping(m) == mount for m in mounts):
            continue
        if any(as_mapping(m).get("mountPath") == mount["mountPath"] for m in mounts):
            draft.problems.append(
                f"container {draft.container_name!r} already mounts something at "
                f"{mount['mountPath']}, where the MPS pipe directory must go: move it."
            )
            continue
        draft.edits.append((*draft.container_path, "volumeMounts"), copy.deepcopy(dict(mount)))
        if draft.explaining:
            draft.explanation.append(f"volumeMount {mount['name']} at {mount['mountPath']}")


def share_host_ipc(draft: PlanDraft, why: str = "policy mpsDaemon.hostIPC") -> None:
    if draft.spec.get("hostIPC") is not True:
        draft.edits.set(("spec", "hostIPC"), True)
        if draft.explaining:
            draft.explanation.append(f"hostIPC: true ({why})")


# The name the apiserver defaults an unset schedulerName to (core/v1 defaults).
DEFAULT_SCHEDULER = "default-scheduler"


def set_scheduler_name(draft: PlanDraft, name: str | None) -> None:
    """The scheduler the mode needs; a pod naming another scheduler is a problem."""
    if name is None:
        return
    current = draft.spec.get("schedulerName")
    if current not in (None, DEFAULT_SCHEDULER, name):
        draft.problems.append(
            f"schedulerName {current!r} conflicts with {name!r}, which mode "
            f"{draft.policy.mode.value} of policy {draft.policy.name!r} needs: remove it "
            "from the pod."
        )
    draft.edits.set(("spec", "schedulerName"), name)
    if draft.explaining:
        draft.explanation.append(f"schedulerName: {name}")


def set_annotations(draft: PlanDraft, wanted: Mapping[str, str]) -> None:
    """Pod annotations the scheme reads; a different value the pod holds is a problem."""
    if not wanted:
        return
    current = draft.annotations
    for key, value in wanted.items():
        if key in current and current[key] != value:
            draft.problems.append(
                f"annotation {key}={current[key]} conflicts with {key}={value} that mode "
                f"{draft.policy.mode.value} of policy {draft.policy.name!r} sets: remove it "
                "from the pod."
            )
        draft.edits.set(("metadata", "annotations", key), value)
        if draft.explaining:
            draft.explanation.append(f"annotation: {key}={value}")


def set_labels(draft: PlanDraft, wanted: Mapping[str, str]) -> None:
    """Pod labels the scheme reads; a different value the pod holds is a problem."""
    for key, value in wanted.items():
        current = draft.labels.get(key)
        if current is not None and current != value:
            draft.problems.append(
                f"label {key}={current} conflicts with {key}={value} that mode "
                f"{draft.policy.mode.value} of policy {draft.policy.name!r} sets: remove it "
                "from the pod."
            )
        draft.edits.set(("metadata", "labels", key), value)
        if draft.explaining:
            draft.explanation.append(f"label: {key}={value}")


def add_resource_claims(draft: PlanDraft, claims: tuple[Mapping[str, Any], ...]) -> None:
    """Pod ``resourceClaims`` entries, and a ``resources.claims`` reference to each in the
    GPU container (a claim a container does not reference is not given to it)."""
    if not claims:
        return
    existing = {str(as_mapping(c).get("name")): c for c in draft.spec.get("resourceClaims") or ()}
    used = {
        str(as_mapping(c).get("name"))
        for c in as_mapping(draft.container.get("resources")).get("claims") or ()
    }
    for claim in claims:
        name = str(claim["name"])
        held = existing.get(name)
        if held is None:
            draft.edits.append(("spec", "resourceClaims"), copy.deepcopy(dict(claim)))
        elif held != claim:
            draft.problems.append(
                f"the pod already has a resource claim named {name!r} that differs from the "
                f"one policy {draft.policy.name!r} gives: rename it."
            )
        if name not in used:
            draft.edits.append((*draft.container_path, "resources", "claims"), {"name": name})
        if draft.explaining:
            draft.explanation.append(f"resourceClaim {name}: {dict(claim)}")
