"""What the chosen pool and sharing mode need from the pod beyond resources and env: node
labels to select, the GPU memory a node must have (node affinity), the mode's volumes and
mounts (the MPS pipe directory), hostIPC.

Values the pod already holds are checked, not overwritten: a conflicting nodeSelector,
volume or mount path is a problem the user must resolve.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from webhook.constants import GFD_MEMORY_LABEL
from webhook.core.draft import PlanDraft, as_mapping
from webhook.core.edits import Path
from webhook.core.modes import ModeChanges

_REQUIRED_NODE_AFFINITY: Path = (
    "spec",
    "affinity",
    "nodeAffinity",
    "requiredDuringSchedulingIgnoredDuringExecution",
)


def select_nodes(draft: PlanDraft, wanted: Mapping[str, str]) -> None:
    current = as_mapping(draft.spec.get("nodeSelector"))
    for key, value in wanted.items():
        if key in current and current[key] != value:
            draft.problems.append(
                f"nodeSelector {key}={current[key]} conflicts with {key}={value} that the "
                f"GPU pool chosen by policy {draft.policy.name!r} needs: remove it from the "
                "pod."
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


def share_host_ipc(draft: PlanDraft) -> None:
    if draft.spec.get("hostIPC") is not True:
        draft.edits.set(("spec", "hostIPC"), True)
        if draft.explaining:
            draft.explanation.append("hostIPC: true (policy mpsDaemon.hostIPC)")
