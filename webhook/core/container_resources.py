"""The GPU resources of the container that gets the GPU: the extended resources its
sharing mode chose (one, or several such as vcuda-core + vcuda-memory), requests equal to
limits (extended resources allow nothing else), and no other GPU ask beside the
annotation's, in that container or any other (init containers, sidecars, ephemeral
containers).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from webhook.constants import (
    CONTAINER_ANNOTATION,
    FRACTION_ANNOTATION,
    KNOWN_GPU_RESOURCES,
    SHARE_RESOURCE,
)
from webhook.core.draft import PlanDraft, as_mapping
from webhook.core.policy.model import PolicySet

# Where a pod lists containers, and what a message calls each kind.
_CONTAINER_LISTS = (
    ("containers", "container"),
    ("initContainers", "init container"),
    ("ephemeralContainers", "ephemeral container"),
)


def is_gpu_resource(name: str, policies: PolicySet) -> bool:
    """A GPU resource, of a sharing scheme gpushare knows or one the policies hand out: a
    container asking for one by hand besides the annotation would be counted twice."""
    return (
        name in KNOWN_GPU_RESOURCES
        or name == SHARE_RESOURCE
        or name.startswith("nvidia.com/mig-")
        or name in policies.gpu_resource_names
    )


def _gpu_asks(container: Mapping[str, Any], policies: PolicySet) -> Iterator[tuple[str, str, Any]]:
    """(section, resource, value) of each GPU resource the container asks for by hand; a
    request the apiserver copied from the same limit is the same ask, said once."""
    resources = as_mapping(container.get("resources"))
    limits = as_mapping(resources.get("limits"))
    for section in ("limits", "requests"):
        for key, value in as_mapping(resources.get(section)).items():
            repeated = section == "requests" and str(limits.get(key)) == str(value)
            if is_gpu_resource(key, policies) and not repeated:
                yield section, key, value


def refuse_other_gpu_asks(draft: PlanDraft, annotation: str) -> None:
    """A problem per GPU resource another container asks for by hand next to ``annotation``.

    The pod would need that resource on the node as well as the share (or the whole GPUs)
    the annotation gives: with ``renameByDefault`` no node offers both, and elsewhere the
    pod holds a whole GPU besides its share. KAI-Scheduler refuses the same
    (``gpu_request_validator.go``: any container or init container with nvidia.com/gpu).
    """
    own_index = draft.container_path[-1]
    for field, kind in _CONTAINER_LISTS:
        entries = draft.spec.get(field)
        for index, entry in enumerate(entries if isinstance(entries, list) else ()):
            container = as_mapping(entry)
            if field == "containers" and index == own_index:
                continue  # the GPU container: set_container_resources checks it
            for section, key, value in _gpu_asks(container, draft.policies):
                asked = f"{key}: {value} in resources.{section}"
                draft.problems.append(_refusal(draft, annotation, field, kind, container, asked))


def _refusal(
    draft: PlanDraft,
    annotation: str,
    field: str,
    kind: str,
    container: Mapping[str, Any],
    asked: str,
) -> str:
    """The refusal of one hand-made GPU ask, with what to do for that kind of container."""
    name = str(container.get("name"))
    resource = asked.partition(":")[0]
    if field == "initContainers" and container.get("restartPolicy") == "Always":
        kind = "sidecar container (init container with restartPolicy Always)"
    if field == "containers":
        fix = (
            f"remove it there; if {name!r} is the container that needs the GPU, name it in "
            f"{CONTAINER_ANNOTATION} instead (one container per pod gets the GPU)"
        )
    else:
        fix = (
            f"remove it there: the pod would need {resource} besides the GPU the annotation "
            "gives, and no node of a sharing pool offers both"
        )
    return (
        f"{kind} {name!r} asks for {asked} next to the {annotation} annotation, which gives "
        f"container {draft.container_name!r} the GPU: {fix}; or remove the annotation and ask "
        "for whole GPUs by hand."
    )


def set_container_resources(draft: PlanDraft, resources: Iterable[tuple[str, int]]) -> None:
    """Each (name, count) in limits and requests alike; a problem per other GPU ask."""
    wanted = {name: str(count) for name, count in resources}
    container = as_mapping(draft.container.get("resources"))
    limits = as_mapping(container.get("limits"))
    for section in ("limits", "requests"):
        for key, value in as_mapping(container.get(section)).items():
            if not is_gpu_resource(key, draft.policies):
                continue
            # The apiserver copies limits into missing requests before admission: one
            # ask, one message, as for the manifest the user wrote.
            repeated = section == "requests" and str(limits.get(key)) == str(value)
            # The share resource is gpushare's to set (a Kueue-managed template carries it
            # already, perhaps under an older policy): overwritten, never refused.
            ours = key == SHARE_RESOURCE and key in wanted
            if wanted.get(key) != str(value) and not repeated and not ours:
                draft.problems.append(
                    f"container {draft.container_name!r} already asks for {key}: {value} in "
                    f"resources.{section}; remove it and let the {FRACTION_ANNOTATION} "
                    "annotation decide, or remove the annotation."
                )
    for section in ("limits", "requests"):
        for name, count in wanted.items():
            draft.edits.set((*draft.container_path, "resources", section, name), count)
    if draft.explaining:
        for name, count in wanted.items():
            draft.explanation.append(
                f"resources: {name}: {count} in limits and requests of container "
                f"{draft.container_name!r}"
            )
