"""The GPU resource of the container that gets the GPU: requests equal limits (extended
resources allow nothing else), and no other GPU ask beside the annotation's.
"""

from __future__ import annotations

from webhook.constants import FRACTION_ANNOTATION, KNOWN_GPU_RESOURCES
from webhook.core.draft import PlanDraft, as_mapping
from webhook.core.policy.model import PolicySet


def is_gpu_resource(name: str, policies: PolicySet) -> bool:
    """A GPU resource, of a sharing scheme gpushare knows or one the policies hand out: a
    container asking for one by hand besides the annotation would be counted twice."""
    return (
        name in KNOWN_GPU_RESOURCES
        or name.startswith("nvidia.com/mig-")
        or name in policies.gpu_resource_names
    )


def set_gpu_resource(draft: PlanDraft, name: str, count: int) -> None:
    """``count`` of resource ``name`` in limits and requests; a problem per other GPU ask."""
    resources = as_mapping(draft.container.get("resources"))
    limits = as_mapping(resources.get("limits"))
    for section in ("limits", "requests"):
        for key, value in as_mapping(resources.get(section)).items():
            if not is_gpu_resource(key, draft.policies):
                continue
            # The apiserver copies limits into missing requests before admission: one
            # ask, one message, as for the manifest the user wrote.
            repeated = section == "requests" and str(limits.get(key)) == str(value)
            if (key != name or str(value) != str(count)) and not repeated:
                draft.problems.append(
                    f"container {draft.container_name!r} already asks for {key}: {value} in "
                    f"resources.{section}; remove it and let the {FRACTION_ANNOTATION} "
                    "annotation decide, or remove the annotation."
                )
    for section in ("limits", "requests"):
        draft.edits.set((*draft.container_path, "resources", section, name), str(count))
    if draft.explaining:
        draft.explanation.append(
            f"resources: {name}: {count} in limits and requests of container "
            f"{draft.container_name!r}"
        )
