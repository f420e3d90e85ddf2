"""The safety net's ``device-variables`` check: ``NVIDIA_VISIBLE_DEVICES`` or
``CUDA_VISIBLE_DEVICES`` set by hand in any container or init container of any pod whose
governing policy says ``enforcement.deviceVariables: deny`` (the default), annotated or not,
in the webhook's words: the core's own sentences, taken when generating (``_sentence``).

Set by hand they let a container reach GPUs the device plugin did not give it, on runtimes
that honour the variable. ``NVIDIA_VISIBLE_DEVICES`` with a value exposing no GPU (``void``,
``none``, empty: nvidia-container-toolkit) is harmless; one read through ``valueFrom``
counts as set; a privileged container is left alone (it reaches every device anyway). Pods
sent to KAI-Scheduler are left alone, as the webhook leaves them: its
pod mutator gives the GPU container ``NVIDIA_VISIBLE_DEVICES`` from a ConfigMap of its own
(NVIDIA/KAI-Scheduler pkg/binder/common/gpu_access.go ``AddVisibleDevicesEnvVars``).

Cheap by construction: pods the webhooks' filters let by (no annotation, no shared resource)
enter the safety net's one matchCondition only through ``DEVICE_FILTER``, a scan of each
container's env names that a pod without env answers with a ``has()`` per container; and
only where some policy refuses the variables (``validating_policy``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

from webhook.constants import DEVICE_VARS, MIRROR_POD_ANNOTATION, NO_DEVICE_VALUES
from webhook.core import load_policy_text, validate
from webhook.install.policy_facts import cel_list, cel_string, concat

VISIBLE_DEVICES, CUDA_DEVICES = DEVICE_VARS
# An env entry ``e`` choosing GPUs by hand. An entry with neither value nor valueFrom is the
# empty string (the apiserver drops an empty value). The name is read once for the entries
# that are neither variable (nearly all): each read of a field allocates in the apiserver.
DEVICE_ENTRY = (
    f"e.name in {cel_list(DEVICE_VARS)} && (e.name == {cel_string(CUDA_DEVICES)} || "
    f"has(e.valueFrom) || !((has(e.value) ? e.value : '') in {cel_list(NO_DEVICE_VALUES)}))"
)
# The lists the check reads, in the webhook's order, and how its messages name each kind.
CONTAINER_LISTS = ("containers", "initContainers")
# A privileged container reaches every device of the node anyway, so the variable gives it
# nothing more: every GPU Operator container that sets it is privileged (gpu-operator v26.7.0
# assets/state-*/*daemonset.yaml). Asked last: only a container that sets one pays for it.
_SETS = (
    "has(c.env) && c.env.exists(e, "
    + DEVICE_ENTRY
    + ") && !c.?securityContext.?privileged.orValue(false)"
)


def _listed(field: str) -> str:
    """CEL: one of the pod's container lists ([] where the pod has none)."""
    return f"object.spec.{field}" if field == "containers" else f"object.spec.?{field}.orValue([])"


SETS_DEVICES = " || ".join(f"{_listed(field)}.exists(c, {_SETS})" for field in CONTAINER_LISTS)
# What lets a pod the webhooks' filters skip into the checks: not a mirror pod (the kubelet
# makes those, admission cannot change them), and a device variable set.
DEVICE_FILTER = (
    "(!has(object.metadata.annotations) || "
    f"!({cel_string(MIRROR_POD_ANNOTATION)} in object.metadata.annotations)) && "
    f"({SETS_DEVICES})"
)
# Placeholders the core's sentence is taken with (``_sentence``): valid names found nowhere
# else in it.
_POLICY, _CONTAINER = "zzpolicyzz", "zzcontainerzz"
_PLACEHOLDER_POLICY = f"""
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {{name: {_POLICY}}}
spec: {{default: true, mode: time-slicing, pools: [{{name: zzpoolzz, replicas: 2}}]}}
"""


def sets_devices(denied: Sequence[str], skipped: str) -> str:
    """CEL: the pod sets a device variable and its governing policy (``variables.policy``)
    is one of ``denied``; never for a pod ``skipped`` holds for (KAI's)."""
    if not denied:
        return "false"
    # The scan before the exception: a pod setting none (most) stops there.
    return f"variables.policy in {cel_list(denied)} && ({SETS_DEVICES}) && !({skipped})"


@functools.cache
def _sentence(variable: str, field: str) -> str:
    """The core's refusal of ``variable`` set by hand in a container of ``field``, for a
    placeholder pod under a placeholder policy (``webhook.core.validate``): the safety net
    says what the webhook says, whatever its wording."""
    container = {"name": _CONTAINER, "image": "busybox", "env": [{"name": variable, "value": "0"}]}
    spec: dict[str, Any] = {"containers": [container]}
    if field != "containers":
        spec = {"containers": [{"name": "app", "image": "busybox"}], field: [container]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}
    (reason,) = validate(pod, "zznamespacezz", load_policy_text(_PLACEHOLDER_POLICY)).reasons
    return reason


def _refusal(field: str) -> str:
    """CEL: the webhook's sentence for entry ``e`` of container ``c`` in ``field``."""
    names = {
        repr(_CONTAINER): "='\\'' + c.name + '\\''",
        repr(_POLICY): "='\\'' + variables.policy + '\\''",
    }
    sentences = []
    for variable in (VISIBLE_DEVICES, CUDA_DEVICES):
        pattern = "(" + "|".join(re.escape(name) for name in names) + ")"
        parts = re.split(pattern, _sentence(variable, field))
        sentences.append(concat(*(names.get(part, part) for part in parts if part)))
    return f"(e.name == {cel_string(VISIBLE_DEVICES)} ? {sentences[0]} : {sentences[1]})"


def device_refusals() -> str:
    """CEL: one sentence per device variable set, containers then init containers, joined
    by spaces as the webhook's AdmissionResponse joins its reasons."""
    parts = [
        f"{_listed(field)}.filter(c, {_SETS})"
        f".map(c, c.env.filter(e, {DEVICE_ENTRY}).map(e, {_refusal(field)}).join(' '))"
        ".join(' ')"
        for field in CONTAINER_LISTS
    ]
    return f"[{', '.join(parts)}].filter(t, t != '').join(' ')"


def device_check() -> dict[str, str]:
    """The check: no device variable where the governing policy refuses them."""
    return {
        "expression": "!variables.setsDevices",
        "messageExpression": device_refusals(),
        "message": f"{VISIBLE_DEVICES} or {CUDA_DEVICES} is set by hand, which the policy "
        "does not allow (enforcement.deviceVariables: deny): remove it.",
        "reason": "Forbidden",
    }
