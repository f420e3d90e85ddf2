"""``NVIDIA_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES`` set by hand, refused in every pod a
policy with ``enforcement.deviceVariables: deny`` governs, annotated or not, in the webhook's
words (``core_words``) and order: one sentence per entry, containers then init containers,
before anything else the webhook would say.

As for a shared resource asked by hand (``validating``), the policy's mutating policy also
matches such a pod (``with_device_variables``) and writes the refusal into
``gpushare.io/denied``, which the one validating policy reads: no second CEL evaluation for
every pod create. The test is a scan of each container's env names, which a pod without env
answers with one ``has()`` per container. ``NVIDIA_VISIBLE_DEVICES`` with a value exposing
no GPU (``void``, ``none``, empty) is allowed; one read through ``valueFrom`` is not. Pods
sent to KAI-Scheduler are left alone, as the webhook leaves them (its pod mutator sets
``NVIDIA_VISIBLE_DEVICES`` from a ConfigMap of its own).
"""

from __future__ import annotations

from webhook.compile import cel
from webhook.compile.core_words import CONTAINER, POLICY, as_cel, device_sentence
from webhook.compile.jsonpatch_cel import add_to_map
from webhook.compile.pod_cel import DENIAL_ANNOTATION, s
from webhook.compile.validating import ANNOTATED_CONDITION
from webhook.constants import DEVICE_VARS, NO_DEVICE_VALUES
from webhook.core import KAI_SCHEDULER, DeviceVariables, Policy

_VISIBLE, _CUDA = DEVICE_VARS
# An env entry ``e`` choosing GPUs by hand (no value nor valueFrom: the empty string).
# The name read once for the entries that are neither variable (nearly all).
_ENTRY = (
    f"e.name in {cel.strings(DEVICE_VARS)} && (e.name == {s(_CUDA)} || has(e.valueFrom) || "
    f"!((has(e.value) ? e.value : '') in {cel.strings(NO_DEVICE_VALUES)}))"
)
# A privileged container reaches every device of the node anyway: the variable gives it
# nothing more (the GPU Operator's own containers that set it are all privileged). Asked
# last: only a container that sets one pays for it.
_SETS = (
    f"has(c.env) && c.env.exists(e, {_ENTRY}) && !(has(c.securityContext) && "
    "has(c.securityContext.privileged) && c.securityContext.privileged)"
)
_LISTS = (
    ("object.spec.containers", "containers"),
    ("(has(object.spec.initContainers) ? object.spec.initContainers : [])", "initContainers"),
)
_NOT_KAI = f"!(has(object.spec.schedulerName) && object.spec.schedulerName == {s(KAI_SCHEDULER)})"


def sets_devices(policy: Policy) -> str | None:
    """CEL: the pod sets a device variable the policy refuses; None where it allows them."""
    if policy.enforcement.device_variables is not DeviceVariables.DENY:
        return None
    scans = " || ".join(f"{listed}.exists(c, {_SETS})" for listed, _ in _LISTS)
    return f"({_NOT_KAI} && ({scans}))"


def _sentence(policy: Policy, field: str) -> str:
    """CEL: the webhook's sentence for entry ``e`` of container ``c`` in ``field``."""
    sentences = [
        as_cel(
            device_sentence(variable, field).replace(repr(POLICY), repr(policy.name)),
            {repr(CONTAINER): cel.python_repr("c.name")},
        )
        for variable in (_VISIBLE, _CUDA)
    ]
    return f"(e.name == {s(_VISIBLE)} ? {sentences[0]} : {sentences[1]})"


def refused_devices(policy: Policy) -> str:
    """The ops writing the refusal of a pod that ``sets_devices`` into
    ``gpushare.io/denied`` (403, the webhook's sentences joined by spaces)."""
    parts = [
        f"{listed}.filter(c, {_SETS}).map(c, c.env.filter(e, {_ENTRY})"
        f".map(e, {_sentence(policy, field)}).join(' ')).join(' ')"
        for listed, field in _LISTS
    ]
    text = f"[{', '.join(parts)}].filter(t, t != '').join(' ')"
    return add_to_map(
        "/metadata/annotations",
        "has(object.metadata.annotations)",
        DENIAL_ANNOTATION,
        f"'403 ' + {text}",
    )


def with_device_variables(policy: Policy, conditions: list[dict[str, str]]) -> list[dict[str, str]]:
    """The mutating policy's matchConditions, letting pods that ``sets_devices`` through
    too where ``policy`` refuses them (the condition on gpushare's annotations, already
    widened to hand asks by ``validating.with_asks_by_hand`` where the policy refuses those)."""
    devices = sets_devices(policy)
    if devices is None:
        return conditions
    return [
        {"name": f"{c['name']}-or-sets-devices", "expression": f"({c['expression']}) || {devices}"}
        if c["name"].startswith(ANNOTATED_CONDITION)
        else c
        for c in conditions
    ]
