"""The pod's own node constraints against what gpushare makes it select: a label value or a
GPU memory that the pod's nodeSelector or required node affinity rules out makes a pod that
can never schedule, so it is refused with both sides named and what would fit.

Kubernetes ("Assigning Pods to Nodes"): nodeSelector and the required node affinity are
ANDed; nodeSelectorTerms are ORed and the matchExpressions of a term ANDed; In and NotIn
compare the label as a string, Exists and DoesNotExist its presence, Gt and Lt the label as
an integer (a label that is not one matches neither).

The GPU memory a pod's selectors leave it is known, never guessed: GPU Feature Discovery's
``nvidia.com/gpu.memory`` says it (MiB); a GPU model label (GFD's product, GKE's
accelerator) has the memory the policies' pools declare (``gpuMemory``) for that value in
their nodeSelector, the largest where pools differ. Any other value refuses nothing.

Pods without nodeSelector or affinity cost one dict lookup; the declared memory is built
once per policy set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeAlias

from webhook.constants import GFD_MEMORY_LABEL, GFD_PRODUCT_LABEL, GPU_MODEL_LABELS
from webhook.constants import MEMORY_ANNOTATION as _MEMORY
from webhook.core.draft import PlanDraft, as_mapping
from webhook.core.memo import PerObject
from webhook.core.placement import Placement, format_fraction
from webhook.core.policy.model import PolicySet
from webhook.core.policy.set_checks import SHARED_PRODUCT_SUFFIX

# (label key, value) → (MiB, where that figure comes from).
DeclaredMemory: TypeAlias = Mapping[tuple[str, str], tuple[int, str]]
# A bound on the GPU memory of the nodes the pod admits: (MiB, what sets it).
_Bound: TypeAlias = tuple[int, str]
# Where a bound is set, as the denial says it around the bound: before, after, the fix
# besides a smaller ask.
_Where: TypeAlias = tuple[str, str, str]
_IN_SELECTOR: _Where = ("but the pod selects ", " in its nodeSelector", "drop that selector")
_IN_AFFINITY: _Where = (
    "but the pod's required node affinity admits only ",
    "",
    "let it admit a larger GPU",
)
# A bound the pod sets: (MiB, the selector or affinity, where).
_PodBound: TypeAlias = tuple[int, str, _Where]
# Expressions (or sizes) and the values of one expression named in a denial, at most: a
# hostile pod's lists stay out of it.
_NAMED = 3
_VALUES_NAMED = 8


def selector_excluded_by_affinity(spec: Mapping[str, Any], key: str, value: str) -> str | None:
    """What in the pod's required node affinity rules out ``key=value`` in every term (the
    expressions, as the user wrote them), or None where some term admits it."""
    terms = _required_terms(spec)
    if not terms:
        return None
    excluding: list[str] = []
    for term in terms:
        expressions = as_mapping(term).get("matchExpressions")
        if not isinstance(term, dict) or not isinstance(expressions, list):
            return None  # malformed: not this check's to judge
        found = next((e for e in expressions if _excludes(as_mapping(e), key, value)), None)
        if found is None:
            return None
        text = _expression_text(found)
        if text not in excluding:
            excluding.append(text)
    named = "; ".join(excluding[:_NAMED]) + ("; ..." if len(excluding) > _NAMED else "")
    return named if len(terms) == 1 else f"every nodeSelectorTerm: {named}"


def refuse_smaller_gpus(draft: PlanDraft, placement: Placement) -> None:
    """A gpu-memory ask sized by the nodes' GPU memory (``placement.node_gpu_memory_mib``)
    on a pod whose own selectors admit only GPUs of known, smaller memory: refused with
    the largest ask that fits them."""
    needed = placement.node_gpu_memory_mib
    spec = draft.spec
    if needed is None or not (spec.get("nodeSelector") or spec.get("affinity")):
        return  # the hot path: nothing of the pod's own to check
    declared = declared_model_memory(draft.policies)
    bounds = [*_selector_bounds(spec, declared), *_affinity_bound(spec, declared)]
    if not bounds:
        return
    largest, source, (before, after, fix) = min(bounds)
    if largest >= needed:
        return
    fit = math.floor(largest * placement.fraction)
    hint = f'ask for at most {_MEMORY} "{fit}Mi", or ' if fit >= 1 else ""
    draft.unschedulable.append(
        f'{_MEMORY} "{draft.annotations.get(_MEMORY)}" needs a GPU with at least {needed}Mi '
        f"({GFD_MEMORY_LABEL} Gt {needed - 1}: one slot of pool {placement.pool.name!r} is "
        f"{format_fraction(placement.fraction)} of a GPU), {before}{source}{after}: {hint}{fix}."
    )


def declared_model_memory(policies: PolicySet) -> DeclaredMemory:
    """The GPU memory the set's pools declare per GPU model label value, built once."""
    held = _DECLARED.of(policies)
    if held.memory is None:
        held.memory = _declared(policies)
    return held.memory


class _Held:
    __slots__ = ("memory",)

    def __init__(self) -> None:
        self.memory: DeclaredMemory | None = None


_DECLARED: PerObject[_Held] = PerObject(_Held)


def _declared(policies: PolicySet) -> DeclaredMemory:
    memory: dict[tuple[str, str], tuple[int, str]] = {}
    for policy in policies.policies:
        for pool in policy.pools:
            mib = pool.gpu_memory_mib
            for key in GPU_MODEL_LABELS:
                value = pool.node_selector.get(key)
                if mib is None or value is None:
                    continue
                model = (key, _model(key, value))
                if model not in memory or memory[model][0] < mib:
                    where = f"gpuMemory of pool {pool.name!r} of policy {policy.name!r}"
                    memory[model] = (mib, where)
    return memory


def _model(key: str, value: str) -> str:
    """GFD appends -SHARED to the product where the resource keeps its name: one model."""
    return value.removesuffix(SHARED_PRODUCT_SUFFIX) if key == GFD_PRODUCT_LABEL else value


def _memory_of(declared: DeclaredMemory, key: str, value: Any) -> _Bound | None:
    """The GPU memory of nodes labelled ``key=value``, where it is known, and whence."""
    if not isinstance(value, str):
        return None
    if key == GFD_MEMORY_LABEL:
        mib = _integer(value)
        return (mib, "the label itself") if mib is not None else None
    found = declared.get((key, _model(key, value)))
    if found is None:
        return None
    return found[0], f"{found[0]}Mi: {found[1]}"


def _selector_bounds(spec: Mapping[str, Any], declared: DeclaredMemory) -> list[_PodBound]:
    bounds: list[_PodBound] = []
    for key, value in as_mapping(spec.get("nodeSelector")).items():
        if key == GFD_MEMORY_LABEL or key in GPU_MODEL_LABELS:
            known = _memory_of(declared, key, value)
            if known is not None:
                shown = f"{key}={value}" + ("" if key == GFD_MEMORY_LABEL else f" ({known[1]})")
                bounds.append((known[0], shown, _IN_SELECTOR))
    return bounds


def _affinity_bound(spec: Mapping[str, Any], declared: DeclaredMemory) -> list[_PodBound]:
    """The largest GPU memory any term of the required node affinity admits, where every
    term bounds it."""
    terms = _required_terms(spec)
    bounds = [_term_bound(term, declared) for term in terms]
    if not bounds or any(b is None for b in bounds):
        return []
    known = [b for b in bounds if b is not None]
    largest = max(b[0] for b in known)
    texts = list(dict.fromkeys(b[1] for b in known))
    named = " or ".join(texts[:_NAMED]) + (" or ..." if len(texts) > _NAMED else "")
    return [(largest, named, _IN_AFFINITY)]


def _term_bound(term: Any, declared: DeclaredMemory) -> _Bound | None:
    expressions = as_mapping(term).get("matchExpressions")
    if not isinstance(expressions, list):
        return None
    bounds = [b for e in expressions if (b := _expression_bound(as_mapping(e), declared))]
    return min(bounds) if bounds else None


def _expression_bound(expression: Mapping[str, Any], declared: DeclaredMemory) -> _Bound | None:
    key, operator = expression.get("key"), expression.get("operator")
    values = expression.get("values")
    if not isinstance(key, str) or not isinstance(values, list) or not values:
        return None
    if key == GFD_MEMORY_LABEL and operator == "Lt":
        below = _integer(values[0])
        return None if below is None else (below - 1, f"{key} Lt {values[0]}")
    if operator != "In" or (key != GFD_MEMORY_LABEL and key not in GPU_MODEL_LABELS):
        return None
    known = [_memory_of(declared, key, v) for v in values]
    if any(k is None for k in known):
        return None  # one value of unknown memory: the term may admit any GPU
    largest = max(k[0] for k in known if k is not None)
    if key == GFD_MEMORY_LABEL:
        return largest, f"{key} In {_values_text(values)}"
    sizes = list(dict.fromkeys(k[1] for k in known if k is not None))
    shown = "; ".join(sizes[:_NAMED]) + ("; ..." if len(sizes) > _NAMED else "")
    return largest, f"{key} In {_values_text(values)} ({shown})"


def _required_terms(spec: Mapping[str, Any]) -> list[Any]:
    affinity = as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity"))
    required = as_mapping(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = required.get("nodeSelectorTerms")
    return terms if isinstance(terms, list) else []


def _excludes(expression: Mapping[str, Any], key: str, value: str) -> bool:
    """Whether a node labelled ``key=value`` fails this expression (unknown forms never)."""
    if expression.get("key") != key:
        return False
    operator, values = expression.get("operator"), expression.get("values")
    if operator == "DoesNotExist":
        return True
    if not isinstance(values, list):
        return False
    if operator == "In":
        return value not in values
    if operator == "NotIn":
        return value in values
    bound = _integer(values[0]) if operator in ("Gt", "Lt") and len(values) == 1 else None
    if bound is None:
        return False
    label = _integer(value)
    if label is None:
        return True
    return not (label > bound if operator == "Gt" else label < bound)


def _integer(text: Any) -> int | None:
    """A label or Gt/Lt value as the int64 Kubernetes parses it; None if it is not one."""
    if not isinstance(text, str) or not text.isascii():
        return None
    digits = text[1:] if text[:1] in ("-", "+") else text
    return int(text) if digits.isdecimal() and len(digits) <= 19 else None


def _expression_text(expression: Mapping[str, Any]) -> str:
    key, operator = expression.get("key"), expression.get("operator")
    values = expression.get("values")
    if operator in ("Exists", "DoesNotExist") or not isinstance(values, list):
        return f"{key} {operator}"
    if operator in ("Gt", "Lt"):
        return f"{key} {operator} {values[0]}"
    return f"{key} {operator} {_values_text(values)}"


def _values_text(values: list[Any]) -> str:
    """``[a, b]``, the first few of a long list and ``...``."""
    shown = ", ".join(str(v) for v in values[:_VALUES_NAMED])
    return f"[{shown}{', ...' if len(values) > _VALUES_NAMED else ''}]"
