"""What the chosen pool and sharing mode need from the pod beyond resources and env: node
labels to select, the mode's volumes and mounts (the MPS pipe directory), hostIPC.

Values the pod already holds are checked, not overwritten: a conflicting nodeSelector,
volume or mount path is a problem the user must resolve.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from webhook.core.draft import PlanDraft, as_mapping
from webhook.core.modes import ModeChanges


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
