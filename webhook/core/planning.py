"""From a pod, its namespace and the policies to a decision: untouched, denied, or a plan.

Pure: takes plain dicts and frozen policy values, reads no environment, changes nothing in
place. A plan is a set of edits over the original pod (``webhook.core.edits``); planning an
already planned pod yields edits that change nothing, which is what makes the webhook safe
under ``reinvocationPolicy: IfNeeded``.

This module owns the pod-level plan (which container, whole GPUs or a share, the record of
what was applied); the pieces of the pod it edits have modules of their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from webhook.constants import (
    APPLIED_ANNOTATION,
    CONTAINER_ANNOTATION,
    FRACTION_ANNOTATION,
    MEMORY_ANNOTATION,
    MIRROR_POD_ANNOTATION,
)
from webhook.core.container_choice import (
    ONLY,
    ContainerChoice,
    Rule,
    choose_container,
    explain_choice,
)
from webhook.core.container_env import apply_env, explain_frameworks
from webhook.core.container_resources import refuse_other_gpu_asks, set_container_resources
from webhook.core.draft import PlanDraft, as_mapping
from webhook.core.edits import PodEdits
from webhook.core.frameworks import framework_env, image_framework_env
from webhook.core.hand_set_env import device_variable_problems, refuse_hand_set_limits
from webhook.core.inference_servers import size_inference_server
from webhook.core.injections import apply_injections
from webhook.core.mode_edits import (
    add_resource_claims,
    add_volumes,
    require_gpu_memory,
    select_nodes,
    set_annotations,
    set_labels,
    set_scheduler_name,
    share_host_ipc,
)
from webhook.core.modes import ModeChanges, mode_changes, place_request, whole_gpu_changes
from webhook.core.node_constraints import refuse_smaller_gpus
from webhook.core.placement import Placement, format_fraction
from webhook.core.plan_memos import placement_key, plan_memos
from webhook.core.policy.model import Mode, Policy, PolicySet
from webhook.core.policy.schemes import KAI_SCHEDULER
from webhook.core.policy.selection import select_policy
from webhook.core.quantity import is_bare_number
from webhook.core.request import GpuRequest, has_gpu_request, read_request
from webhook.core.server_parallelism import refuse_short_server
from webhook.core.share_accounting import (
    held_milli_gpus,
    record_share,
    share_resources,
    whole_milli_gpus,
)

# A gpu-memory number without a unit is MiB; below this it was probably meant as GiB.
_SMALL_BARE_MIB = 1024

# status.code of a denial: the annotations cannot be read (422) or break policy (403).
UNPROCESSABLE = 422
FORBIDDEN = 403


@dataclass(frozen=True)
class Untouched:
    reason: str
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Denied:
    reasons: tuple[str, ...]
    policy: str | None = None
    code: int = FORBIDDEN


@dataclass(frozen=True)
class Planned:
    policy: Policy
    edits: PodEdits
    warnings: tuple[str, ...]
    record: Mapping[str, Any]
    explanation: tuple[str, ...] = field(default=())


Decision = Untouched | Denied | Planned

# The kubelet recreates a static pod's API copy from its file: admission cannot change it,
# so neither webhook acts on one.
MIRROR_POD = Untouched("mirror pods are managed by the kubelet and never mutated")
# A pod a user sent to kai-scheduler is KAI's: it reads the same annotation words.
LEFT_TO_KAI = Untouched(
    f"the pod names schedulerName {KAI_SCHEDULER}, which reads {FRACTION_ANNOTATION} itself "
    "(a policy of mode kai hands pods over on purpose)"
)


def plan_pod(
    pod: Mapping[str, Any], namespace: str, policies: PolicySet, *, explain: bool = False
) -> Decision:
    """Decide for one pod; ``explain`` also records how each value came about."""
    metadata = as_mapping(pod.get("metadata"))
    annotations = as_mapping(metadata.get("annotations"))
    if MIRROR_POD_ANNOTATION in annotations:
        return MIRROR_POD
    if not has_gpu_request(annotations):
        return Untouched("the pod has no gpu-fraction or gpu-memory annotation")
    labels = as_mapping(metadata.get("labels"))
    selection = select_policy(policies, namespace, labels)
    if selection.policy is None:
        return Untouched(selection.reason, (f"{FRACTION_ANNOTATION} ignored: {selection.reason}",))
    policy = selection.policy
    spec = as_mapping(pod.get("spec"))
    forbidden = device_variable_problems(spec, policy)
    if forbidden:
        return Denied(tuple(forbidden), policy.name)
    if spec.get("schedulerName") == KAI_SCHEDULER and policy.mode is not Mode.KAI:
        # KAI-Scheduler reads the same annotations and shares the GPU itself.
        return LEFT_TO_KAI

    request = read_request(annotations)
    if isinstance(request, list):
        return Denied(tuple(p.message for p in request), policy.name, UNPROCESSABLE)
    choice = _container_index(spec, request)
    if isinstance(choice, str):
        return Denied((choice,), policy.name, UNPROCESSABLE)
    draft = PlanDraft(spec, choice.index, policies, policy, explain, annotations, labels)
    if explain:
        draft.explanation.append(f"policy: {selection.reason}")
        draft.explanation += [f"  not chosen: {line}" for line in selection.others]
    if choice is not ONLY:
        _chosen_container(draft, choice)
    return _plan(draft, request)


def _chosen_container(draft: PlanDraft, choice: ContainerChoice) -> None:
    """A container named or chosen among several: the guess's warning, the explanation, and for
    KAI-Scheduler, which gives the GPU to the first container unless the annotation names
    one (NVIDIA/KAI-Scheduler pkg/binder/common/gpu_access.go GetFractionContainerRef),
    the annotation naming the container chosen here."""
    if choice.warning is not None:
        draft.warnings.append(choice.warning)
    if draft.explaining:
        names = [str(as_mapping(c).get("name")) for c in draft.spec["containers"]]
        draft.explanation.append(explain_choice(names, choice))
    if draft.policy.mode is Mode.KAI and choice.index and choice.rule is not Rule.NAMED:
        set_annotations(draft, {CONTAINER_ANNOTATION: draft.container_name})


def _container_index(spec: Mapping[str, Any], request: GpuRequest) -> ContainerChoice | str:
    """The GPU container: named by the annotation, else ``container_choice``'s rules."""
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return "The pod has no containers to give a GPU to."
    if request.container_name is None and len(containers) == 1:
        return ONLY  # the usual pod: no names read
    names = [str(as_mapping(c).get("name")) for c in containers]
    if request.container_name is None:
        return choose_container(names)
    if request.container_name in names:
        return ContainerChoice(names.index(request.container_name), Rule.NAMED)
    init_names = [str(as_mapping(c).get("name")) for c in spec.get("initContainers") or ()]
    if request.container_name in init_names:
        return (
            f'{CONTAINER_ANNOTATION} "{request.container_name}" names an init container; '
            f"GPUs go to app containers: name one of {', '.join(names)}."
        )
    return (
        f'{CONTAINER_ANNOTATION} "{request.container_name}" is not a container of this pod: '
        f"name one of {', '.join(names)}."
    )


def _plan(draft: PlanDraft, request: GpuRequest) -> Decision:
    policy = draft.policy
    refuse_other_gpu_asks(
        draft, FRACTION_ANNOTATION if request.fraction_text is not None else MEMORY_ANNOTATION
    )
    if request.memory_text is not None and is_bare_number(request.memory_text):
        mib = request.memory_text
        if int(mib) < _SMALL_BARE_MIB:  # "16" is more likely 16 GiB meant than 16 MiB
            draft.warnings.append(
                f'{MEMORY_ANNOTATION} "{mib}" is {mib} MiB; for GiB write "{mib}Gi"'
            )
    if request.is_whole:
        record = _whole_gpus(draft, request)
        gpus = request.whole_gpus or 0
    else:
        placement = plan_memos(draft.policies).placements.get_or_compute(
            (id(policy), request), place_request, policy, request
        )
        if isinstance(placement, list):
            return Denied(tuple(placement), policy.name)
        record = _shared(draft, placement)
        gpus = placement.devices
    # An inference server whose parallelism needs more GPUs than the pod (group) gets.
    too_few = None if draft.problems else refuse_short_server(draft, request, gpus)
    if too_few is not None:
        return Denied((too_few,), policy.name, UNPROCESSABLE)
    apply_injections(draft)
    record["policyVersion"] = policy.version
    draft.edits.set(
        ("metadata", "annotations", APPLIED_ANNOTATION),
        orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode(),
    )
    if draft.problems or draft.unschedulable:
        # A pod that could never schedule says so with 422, unless policy forbids it too.
        code = FORBIDDEN if draft.problems else UNPROCESSABLE
        return Denied((*draft.problems, *draft.unschedulable), policy.name, code)
    warnings = tuple(dict.fromkeys(draft.warnings))  # one note per fact, in order
    return Planned(policy, draft.edits, warnings, record, tuple(draft.explanation))


def _whole_gpus(draft: PlanDraft, request: GpuRequest) -> dict[str, Any]:
    policy = draft.policy
    whole = policy.whole_gpus
    count = request.whole_gpus or 0
    if count > whole.max:
        limit = "no whole GPUs" if whole.max == 0 else f"at most {whole.max} whole GPUs"
        draft.problems.append(
            f'{FRACTION_ANNOTATION} "{request.fraction_text}" asks for {count} whole '
            f"GPUs, but policy {policy.name!r} allows {limit}: ask for fewer, or for "
            "a share below 1."
        )
    changes = whole_gpu_changes(policy, count)
    if isinstance(changes, str):
        draft.problems.append(changes)
        changes = ModeChanges()
    resources = changes.resources
    milli = whole_milli_gpus(count)
    set_container_resources(draft, (*resources, *share_resources(policy, milli)))
    if draft.explaining and resources:
        asked = " + ".join(name for name, _ in resources)
        draft.explanation.append(f"request: {count} whole GPU(s) as {asked}")
    select_nodes(draft, whole.node_selector)
    _pod_changes(draft, changes)
    refuse_hand_set_limits(draft, ())  # whole GPUs get no limits from gpushare
    record: dict[str, Any] = {
        "container": draft.container_name,
        "gpus": count,
        "mode": "whole-gpu",
        "policy": policy.name,
        "resource": resources[0][0] if resources else None,
    }
    if resources and resources != ((resources[0][0], count),):
        record["resources"] = dict(resources)  # several, or counted otherwise (vcuda cores)
    record_share(draft, record, milli, None)
    return record


def _pod_changes(draft: PlanDraft, changes: ModeChanges) -> None:
    """The pod-level part of a mode's changes: scheduler, labels, annotations."""
    if changes.scheduler_name is None and not changes.labels and not changes.annotations:
        return  # the device plugin's modes: nothing at pod level (the hot path)
    set_scheduler_name(draft, changes.scheduler_name)
    set_labels(draft, changes.labels)
    set_annotations(draft, changes.annotations)


def _shared(draft: PlanDraft, placement: Placement) -> dict[str, Any]:
    policy = draft.policy
    if draft.explaining:
        draft.explanation.append(f"placement: {placement.reason}")
    memos = plan_memos(draft.policies)
    key = placement_key(policy, placement)
    changes = memos.mode_changes.get_or_compute(key, mode_changes, policy, placement)
    milli = held_milli_gpus(policy, placement)
    set_container_resources(draft, (*changes.resources, *share_resources(policy, milli)))
    if draft.explaining:
        draft.explanation += changes.explanation
    frameworks = None
    if changes.frameworks:
        image = str(draft.container.get("image", ""))
        fixed = memos.framework_envs.get_or_compute(
            (key, image), image_framework_env, policy, placement, image
        )
        frameworks = framework_env(policy, placement, draft.container, fixed)
        draft.problems += frameworks.problems
    draft.warnings += [*changes.warnings, *(frameworks.warnings if frameworks else ())]
    select_nodes(draft, changes.node_selector)
    _pod_changes(draft, changes)
    if placement.node_gpu_memory_mib is not None:
        require_gpu_memory(draft, placement.node_gpu_memory_mib)
        refuse_smaller_gpus(draft, placement)
    apply_env(draft, [*changes.env, *(frameworks.env if frameworks else ())])
    if frameworks is not None:
        if draft.explaining:
            explain_frameworks(draft, frameworks.notes)
        size_inference_server(draft, placement)
    add_volumes(draft, changes)
    add_resource_claims(draft, changes.resource_claims)
    if changes.host_ipc:
        if policy.mode is Mode.MPS_DAEMON:
            share_host_ipc(draft)
        else:
            share_host_ipc(draft, f"mode {policy.mode.value} needs it")
    record: dict[str, Any] = {
        "container": draft.container_name,
        "mode": policy.mode.value,
        "policy": policy.name,
        **changes.record,
    }
    if placement.share_known:
        record["fraction"] = format_fraction(placement.fraction)
    elif placement.asked_memory_mib is not None:
        record["memory"] = f"{format_fraction(placement.asked_memory_mib)}Mi"
    if placement.node_gpu_memory_mib is not None:
        record["nodeGpuMemory"] = f"{placement.node_gpu_memory_mib}Mi"
    record_share(draft, record, milli, placement)
    return record
