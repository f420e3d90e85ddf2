"""The safety net's checks in CEL: the variables they share, each check, and the webhook's
message for it (``validating_policy`` assembles them into the ValidatingAdmissionPolicy)."""

from __future__ import annotations

from collections.abc import Sequence

from webhook.constants import APPLIED_ANNOTATION, FRACTION_ANNOTATION, REQUEST_ANNOTATIONS
from webhook.core import KAI_SCHEDULER
from webhook.install.device_checks import device_check, sets_devices
from webhook.install.policy_facts import (
    ENV_LIMIT,
    LIMIT_HELD,
    POOL_MODES,
    SELECTOR_HELD,
    WHOLE_GPU_KEY,
    PolicyFacts,
    cel_list,
    cel_map,
    cel_string,
    concat,
    limits_literal,
    record_field,
    selector_literal,
)

# The webhook's words (webhook/core/verdict.py), so a denial reads the same either way.
NEVER_MUTATED_MESSAGE = (
    "This pod asks for a GPU share but was never mutated by gpushare: the mutating webhook "
    "was unreachable or skipped it. Check that mutate.gpushare.io is up and registered, "
    "then create the pod again."
)
# A pod sent to kai-scheduler is KAI's: gpushare leaves it alone (it reads the same
# annotations), so it is never mutated on purpose.
KAI_POD = f"object.spec.?schedulerName.orValue('') == {cel_string(KAI_SCHEDULER)}"
CHANGED_PREFIX = "The GPU-sharing settings injected at admission were changed afterwards"
CHANGED_SUFFIX = (
    f"; remove the webhook or edit that changes them, or drop the {FRACTION_ANNOTATION} annotation."
)


def variables(facts: PolicyFacts, *, refuse_unmutated: bool = True) -> list[dict[str, str]]:
    """The named CEL values the checks share; long because each is one line of CEL.

    ``refuse_unmutated`` (failurePolicy Fail): an annotated pod is the mutating webhook's,
    and ``never-mutated`` refuses it where the webhook did not answer, so the hand-ask check
    skips it. Without it (failurePolicy Ignore) an annotated pod nobody mutated is admitted
    as written, so the hand-ask check reads it too: only a mutated pod (the webhook wrote
    its resources) and one of KAI's (never mutated on purpose) are skipped."""
    annotated = " || ".join(
        f"{cel_string(k)} in variables.annotations" for k in REQUEST_ANNOTATIONS
    )
    denied = cel_map({k: cel_string(v) for k, v in sorted(facts.denied_resources.items())})
    resource_asked = (
        "(has(c.resources) && ((has(c.resources.limits) && variables.deniedResource in "
        "c.resources.limits) || (has(c.resources.requests) && variables.deniedResource in "
        "c.resources.requests)))"
    )
    limit = ENV_LIMIT
    skipped = (
        "variables.annotated"
        if refuse_unmutated
        else f"(variables.annotated && (variables.applied != '' || {KAI_POD}))"
    )
    pairs = [
        ("podNamespace", "request.namespace"),
        ("annotations", "object.metadata.?annotations.orValue({})"),
        ("labels", "object.metadata.?labels.orValue({})"),
        ("annotated", annotated),
        ("policy", facts.selection),
        ("applied", f"variables.annotations[?{cel_string(APPLIED_ANNOTATION)}].orValue('')"),
        ("deniedResource", f"{denied}[?variables.policy].orValue('')"),
        (
            "handAsking",
            f"{skipped} || variables.deniedResource == '' ? [] : "
            f"object.spec.containers.filter(c, {resource_asked}).map(c, c.name) + "
            f"object.spec.?initContainers.orValue([]).filter(c, {resource_asked}).map(c, c.name)",
        ),
        ("setsDevices", sets_devices(facts.device_denied, KAI_POD)),
        ("checksRecord", "variables.annotated && variables.applied != ''"),
        # The record's fields are read only from a record the checks read: the matchCondition
        # evaluates every field (bind_all), and a pod nobody mutated may carry anything.
        ("record", "variables.checksRecord ? variables.applied : ''"),
        ("recordContainer", record_field("container")),
        ("recordResource", record_field("resource")),
        ("recordSlots", record_field("slots", number=True)),
        (
            "recordCount",
            "variables.recordSlots != '' ? variables.recordSlots : "
            f"{record_field('gpus', number=True)}",
        ),
        ("recordMode", record_field("mode")),
        ("recordVersion", f"{record_field('policy')} + '@' + {record_field('policyVersion')}"),
        (
            "recordKey",
            f"variables.recordVersion + '/' + (variables.recordMode == {cel_string(WHOLE_GPU_KEY)}"
            f" ? {cel_string(WHOLE_GPU_KEY)} : {record_field('pool')})",
        ),
        (
            # The record's count is the container's count of its resource: slots for the
            # device plugin's modes, GPUs where the policy's whole GPUs are counted so.
            "countsResource",
            f"variables.recordMode in {cel_list(sorted(m.value for m in POOL_MODES))} || "
            f"(variables.recordMode == {cel_string(WHOLE_GPU_KEY)} && "
            f"variables.recordVersion in {cel_list(facts.whole_counted)})",
        ),
        (
            "gpuIndex",
            "object.spec.containers.map(c, c.name).indexOf(variables.recordContainer)",
        ),
        (
            "gpuLimit",
            "variables.gpuIndex < 0 ? '' : string(object.spec.containers[variables.gpuIndex]"
            ".?resources.?limits[?variables.recordResource].orValue('none'))",
        ),
        ("nodeSelector", "object.spec.?nodeSelector.orValue({})"),
        (
            "selector",
            f"!variables.checksRecord ? {{}} : {selector_literal(facts)}"
            "[?variables.recordKey].orValue({})",
        ),
        (
            "selectorDrift",
            f"variables.selector.filter(k, !({SELECTOR_HELD}))"
            ".map(k, k + '=' + variables.selector[k])",
        ),
        (
            "limits",
            f"!variables.checksRecord || variables.gpuIndex < 0 ? {{}} : {limits_literal(facts)}"
            "[?variables.recordKey + '/' + variables.recordCount].orValue({})",
        ),
        (
            "limitDrift",
            f"variables.limits.filter(name, !({LIMIT_HELD}))"
            f".map(name, 'exact' in {limit} ? name + '=' + {limit}.exact : "
            f"name + ' at most ' + {limit}.prefix + {limit}.bound + {limit}.suffix)",
        ),
    ]
    return [{"name": name, "expression": expression} for name, expression in pairs]


def _escaped_key(expression: str) -> str:
    """CEL: a JSON Pointer token of ``expression`` (RFC 6901), as the webhook's paths are."""
    return f"{expression}.replace('~', '~0').replace('/', '~1')"


def _changed(detail: Sequence[str]) -> str:
    return concat(CHANGED_PREFIX + " (", *detail, ")" + CHANGED_SUFFIX)


def _only_when_failing(validation: dict[str, str]) -> dict[str, str]:
    """The message built only for a pod its check refuses. The apiserver evaluates every
    messageExpression on every admission, whether its check held or not, and in a context
    of its own that evaluates the variables again (k8s.io/apiserver v0.37.2,
    admission/plugin/policy/validating/validator.go: ``messageFilter.ForInput`` after the
    checks; admission/plugin/cel/composition.go: a new context per ``ForInput``)."""
    if "messageExpression" not in validation:
        return validation
    expression, message = validation["expression"], validation["messageExpression"]
    return {**validation, "messageExpression": f"({expression}) ? '' : ({message})"}


def validations(refused: list[dict[str, str]]) -> list[dict[str, str]]:
    """The ``checks()``, each message built only for a pod its check refuses."""
    return [_only_when_failing(v) for v in refused]


def _hand_ask_message(refuse_unmutated: bool) -> str:
    """The hand-ask check's message: for a pod without the annotations, and, where an
    unmutated annotated pod is admitted (``refuse_unmutated`` off), for one with them."""
    asks = ["container '", "=variables.handAsking[0]", "' asks for ", "=variables.deniedResource"]
    plain = concat(
        *asks,
        " directly, which policy '",
        "=variables.policy",
        "' does not allow: remove it and annotate the pod with "
        f'{FRACTION_ANNOTATION}: "0.5" (or the share you need) instead.',
    )
    if refuse_unmutated:
        return plain
    annotated = concat(
        *asks,
        " directly, which policy '",
        "=variables.policy",
        "' does not allow, and gpushare's mutating webhook did not mutate this pod "
        "(failurePolicy Ignore admits a pod as written, not a share asked for by hand): "
        "remove it; the pod's annotation asks for the share.",
    )
    return f"variables.annotated ? ({annotated}) : ({plain})"


def checks(*, refuse_unmutated: bool = True) -> list[dict[str, str]]:
    """The checks and their messages; long because each is one literal.

    ``never-mutated`` only with ``refuse_unmutated`` (failurePolicy Fail): under Ignore the
    apiserver admits an annotated pod unmutated while the webhook does not answer, and the
    safety net lets it through as written (it asks for no GPU: the annotation alone holds
    nothing), but for a share it asks for by hand (``variables``)."""
    container = "='/spec/containers/' + string(variables.gpuIndex)"
    never_mutated = {
        # The record first: a mutated pod then never evaluates the selection.
        "expression": "!variables.annotated || variables.applied != '' || "
        f"variables.policy == '' || {KAI_POD}",
        "message": NEVER_MUTATED_MESSAGE,
        "reason": "Forbidden",
    }
    return [
        *([never_mutated] if refuse_unmutated else []),
        # Before the hand ask, as the webhook's validate says it first.
        device_check(),
        {
            "expression": "size(variables.handAsking) == 0",
            "messageExpression": _hand_ask_message(refuse_unmutated),
            "message": "A container asks for the shared GPU resource directly, which the "
            f"policy does not allow: annotate the pod with {FRACTION_ANNOTATION} instead.",
            "reason": "Forbidden",
        },
        {
            "expression": "!variables.checksRecord || variables.gpuIndex >= 0",
            "messageExpression": "variables.recordContainer == '' ? "
            + _changed([f"the {APPLIED_ANNOTATION} record is not one gpushare wrote"])
            + " : "
            + _changed(
                [
                    f"the {APPLIED_ANNOTATION} record names container '",
                    "=variables.recordContainer",
                    "', which the pod no longer has",
                ]
            ),
            "message": f"{CHANGED_PREFIX} (the container named in {APPLIED_ANNOTATION} is "
            f"gone){CHANGED_SUFFIX}",
            "reason": "Forbidden",
        },
        {
            "expression": "!variables.checksRecord || variables.gpuIndex < 0 || "
            "!variables.countsResource || variables.recordResource == '' || "
            "variables.recordCount == '' || variables.gpuLimit == variables.recordCount",
            "messageExpression": _changed(
                [
                    "at ",
                    container,
                    "/resources/limits/",
                    "=" + _escaped_key("variables.recordResource"),
                    f": {APPLIED_ANNOTATION} records ",
                    "=variables.recordCount",
                    ", the container asks for ",
                    "=variables.gpuLimit",
                ]
            ),
            "message": f"{CHANGED_PREFIX} (the GPU resource of the container){CHANGED_SUFFIX}",
            "reason": "Forbidden",
        },
        {
            "expression": f"variables.selector.all(k, {SELECTOR_HELD})",
            "messageExpression": _changed(
                [
                    "at /spec/nodeSelector: policy version ",
                    "=variables.recordKey.split('/')[0]",
                    " selects ",
                    "=variables.selectorDrift.join(', ')",
                ]
            ),
            "message": f"{CHANGED_PREFIX} (the node selector){CHANGED_SUFFIX}",
            "reason": "Forbidden",
        },
        {
            "expression": f"variables.limits.all(name, {LIMIT_HELD})",
            "messageExpression": _changed(
                [
                    "at ",
                    container,
                    "/env: policy version ",
                    "=variables.recordKey.split('/')[0]",
                    " sets ",
                    "=variables.limitDrift.join(', ')",
                    " for ",
                    "=variables.recordCount",
                    " slot(s) of pool ",
                    "=variables.recordKey.split('/')[1]",
                ]
            ),
            "message": f"{CHANGED_PREFIX} (the hard limits in the env){CHANGED_SUFFIX}",
            "reason": "Forbidden",
        },
    ]
