"""The env a pod may not set by hand under its policy's ``enforcement`` section
(docs/enforcement.md):

- device variables (``NVIDIA_VISIBLE_DEVICES``, ``CUDA_VISIBLE_DEVICES``) in any container,
  under ``deviceVariables: deny`` (the default): the runtime hands a container the GPUs
  ``NVIDIA_VISIBLE_DEVICES`` names where the device plugin passes devices by env, so a
  container that sets it may reach GPUs the device plugin did not give it, or another GPU
  than the one its limits were written for; a privileged container, which reaches every
  device anyway, is left alone. ``NVIDIA_VISIBLE_DEVICES`` set to a value that
  exposes no GPU (``void``, ``none``, empty: nvidia-container-toolkit) is harmless. Pods
  handed to KAI-Scheduler (mode kai, or ``schedulerName: kai-scheduler``) are KAI's: its pod
  mutator itself gives the GPU container ``NVIDIA_VISIBLE_DEVICES`` from its GPU-sharing
  ConfigMap (NVIDIA/KAI-Scheduler pkg/binder/common/gpu_access.go AddVisibleDevicesEnvVars).
- limit variables (``NVIDIA_GPU_MEMORY_*``, ``CUDA_MPS_*``) in the GPU container, under
  ``handSetLimits: deny``: any value other than the one gpushare plans (under ``override``
  ``container_env`` replaces them instead, with a warning).

Only literal ``env`` entries can be read at admission: an ``envFrom`` ConfigMap or Secret
holds values the pure core never sees (gpushare's own limits still win over them: see
``container_env``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from webhook.constants import DEVICE_VARS, FRACTION_ANNOTATION, LIMIT_VARS, NO_DEVICE_VALUES
from webhook.core.draft import PlanDraft, as_mapping
from webhook.core.modes import EnvSetting
from webhook.core.policy.enforcement import DeviceVariables, HandSetLimits
from webhook.core.policy.model import Mode, Policy
from webhook.core.policy.schemes import KAI_SCHEDULER

_CONTAINER_LISTS = (
    ("containers", "container"),
    ("initContainers", "init container"),
    ("ephemeralContainers", "ephemeral container"),
)
_NO_DEVICE = frozenset(NO_DEVICE_VALUES)
_DEVICE_VARS = frozenset(DEVICE_VARS)
_LIMIT_VARS = frozenset(LIMIT_VARS)
_VISIBLE_DEVICES = DEVICE_VARS[0]  # NVIDIA_VISIBLE_DEVICES, the one with harmless values
# Enum members looked up once: an attribute of an Enum class costs more than a global.
_DENY_DEVICES = DeviceVariables.DENY
_DENY_LIMITS = HandSetLimits.DENY
_KAI = Mode.KAI


def _env_entries(container: Any) -> Iterator[Mapping[str, Any]]:
    env = as_mapping(container).get("env")
    for entry in env if isinstance(env, list) else ():
        yield as_mapping(entry)


def _exposes_no_gpu(entry: Mapping[str, Any]) -> bool:
    """``NVIDIA_VISIBLE_DEVICES`` given literally as a value that selects no GPU."""
    value = entry.get("value", "")
    return (
        entry.get("name") == _VISIBLE_DEVICES
        and "valueFrom" not in entry
        and isinstance(value, str)
        and value in _NO_DEVICE
    )


def device_variable_problems(spec: Mapping[str, Any], policy: Policy) -> list[str]:
    """A refusal per device variable set by hand in any container of the pod, where the
    policy denies them; empty for the usual pod (no env: a few lookups, on the hot path)."""
    if (
        policy.enforcement.device_variables is not _DENY_DEVICES
        or policy.mode is _KAI
        or spec.get("schedulerName") == KAI_SCHEDULER
    ):
        return []
    problems: list[str] = []
    for field, kind in _CONTAINER_LISTS:
        containers = spec.get(field)
        if not containers or not isinstance(containers, list):
            continue
        for container in containers:
            if isinstance(container, dict) and container.get("env") and not _privileged(container):
                problems += _device_problems(container, kind, policy)
    return problems


def _privileged(container: Mapping[str, Any]) -> bool:
    """A privileged container reaches every device of the node whatever its env says, so a
    device variable gives it nothing more; every GPU Operator container that sets
    ``NVIDIA_VISIBLE_DEVICES`` is privileged (gpu-operator v26.7.0, assets/state-*/
    *daemonset.yaml)."""
    return as_mapping(container.get("securityContext")).get("privileged") is True


def _device_problems(container: Mapping[str, Any], kind: str, policy: Policy) -> list[str]:
    problems = []
    for entry in _env_entries(container):
        name = entry.get("name")
        if isinstance(name, str) and name in _DEVICE_VARS and not _exposes_no_gpu(entry):
            where = f"{kind} {str(container.get('name'))!r}"
            problems.append(_device_refusal(name, where, policy))
    return problems


def _device_refusal(name: str, where: str, policy: Policy) -> str:
    harmless = ""
    if name == _VISIBLE_DEVICES:
        shown = " or ".join(value for value in NO_DEVICE_VALUES if value)
        harmless = f" (or set it to {shown}, which expose no GPU)"
    return (
        f"{name} is set by hand in {where}, which policy {policy.name!r} does not allow "
        "(enforcement.deviceVariables: deny): it selects GPUs by env, so a container could "
        "reach GPUs the device plugin did not give it and bypass the limits gpushare sets. "
        f"Remove it{harmless}, and ask for a GPU share with the {FRACTION_ANNOTATION} "
        f'annotation (e.g. {FRACTION_ANNOTATION}: "0.5").'
    )


def refuse_hand_set_limits(draft: PlanDraft, settings: Sequence[EnvSetting]) -> None:
    """Under ``handSetLimits: deny``, a problem per limit variable of the GPU container
    whose entry is not exactly what gpushare plans (``settings``). A pod gpushare already
    mutated holds those very entries, so planning it again is allowed (reinvocation)."""
    if draft.policy.enforcement.hand_set_limits is not _DENY_LIMITS:
        return
    planned = {setting.name: setting.value for setting in settings}
    for entry in _env_entries(draft.container):
        name = entry.get("name")
        if not isinstance(name, str) or name not in _LIMIT_VARS:
            continue
        wanted = planned.get(name)
        if wanted is not None and dict(entry) == {"name": name, "value": wanted}:
            continue
        draft.problems.append(_limit_refusal(draft, name, entry, wanted))


def _limit_refusal(
    draft: PlanDraft, name: str, entry: Mapping[str, Any], wanted: str | None
) -> str:
    shown = " from valueFrom" if "valueFrom" in entry else f" to {entry.get('value', '')!r}"
    planned = (
        f"gpushare sets it to {wanted} from the pod's GPU share"
        if wanted is not None
        else f"gpushare sets no {name} for this pod"
    )
    return (
        f"{name} is set by hand{shown} in container {draft.container_name!r}, which policy "
        f"{draft.policy.name!r} does not allow (enforcement.handSetLimits: deny): remove "
        f"{name} from the container's env; {planned}."
    )
