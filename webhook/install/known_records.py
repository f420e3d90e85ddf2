"""The ``gpushare.io/applied`` records the webhook writes for pods on device-plugin pools,
known when the safety net is generated, so that the net reads such a record by one lookup
instead of parsing it.

The record is compact, key-sorted JSON (``webhook.core.planning``). For the pool modes
(time-slicing, MPS, the MPS daemon) everything from its ``"mode":`` key on, the *tail*,
follows from the policy version, the pool and the slots; what the pod itself decides (its
container, fraction, memory ask, the share it holds) sorts before it, in the *head*. So the
tails are few (one per pool and slot count) and each stands for the facts the checks read:
the resource and count the GPU container must ask for, the pool's node selector and its
enforced env limits.

The net's matchCondition checks a record whose head holds only the fields the webhook writes
there and whose tail is one of these with the facts baked in (``fast_gate``); any other
record (another policy version, a memory-sized pool, whole GPUs, another scheme, a
hand-edited one) goes through the general checks, which parse it field by field. Why: on
e2e_bench.py's pod the general path cost 570 allocations per admission, of which about 130
were the record's seven regular-expression finds and about 50 the seventeen values bound on
the way (bench/cel_cost.py; bench/README.md).

The lookup answers what the general path answers: each tail's facts are read from the tail
with the general path's own patterns (``record_field``), and the head pattern admits no
quote inside a value, so the first match of each field's pattern in the whole record, which
the general path takes, lies in the tail (tests/install/test_known_records.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import orjson

from webhook.constants import APPLIED_ANNOTATION, REQUEST_ANNOTATIONS
from webhook.core import Placement, PolicySet, mode_changes
from webhook.install.policy_facts import (
    POOL_MODES,
    EnvLimit,
    PolicyFacts,
    cel_map,
    cel_string,
    env_limits_map,
    limit_held,
    record_pattern,
    selector_map,
)

CONTAINER_KEY = '{"container":"'
MODE_KEY = '"mode":'
# The keys the core writes before "mode" in a pool mode's record, each with a value holding
# no quote or backslash: the head of a record the lookup may read.
HEAD_KEYS = ("fraction", "gpuMemoryMiB", "gpuModel", "memory", "milliGpus")
HEAD_PATTERN = (
    "^" + re.escape(CONTAINER_KEY) + '[^"\\\\]*"'
    '(,"(' + "|".join(HEAD_KEYS) + ')":("[^"\\\\]*"|[0-9]+))*,' + re.escape(MODE_KEY) + '"'
)


@dataclass(frozen=True)
class KnownRecord:
    """What the checks read from a record with this tail."""

    resource: str
    count: str
    selector: Mapping[str, str]
    limits: Mapping[str, EnvLimit]


def _field(tail: str, name: str, *, number: bool = False) -> str:
    """The general path's reading of one field (``record_field``), in Python."""
    key, value = record_pattern(name, number=number)
    found = re.search(key + value, tail)
    return found.group(0)[len(key) :].replace('"', "") if found else ""


def known_records(policies: PolicySet, facts: PolicyFacts) -> dict[str, KnownRecord]:
    """Tail -> facts, for every pool and slot count of the pool-mode policies."""
    known: dict[str, KnownRecord] = {}
    for policy in policies.policies:
        if policy.mode not in POOL_MODES:
            continue
        for pool in policy.pools:
            for slots in range(1, pool.replicas + 1):
                changes = mode_changes(policy, Placement(pool, slots, slots / pool.replicas))
                record = {
                    "mode": policy.mode.value,
                    "policy": policy.name,
                    "policyVersion": policy.version,
                    **changes.record,
                }
                if min(record) != "mode":
                    continue  # a scheme writing its own fields before the mode
                tail = orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode()[1:]
                known[tail] = _facts(tail, facts)
    return {tail: record for tail, record in known.items() if record.resource and record.count}


def _facts(tail: str, facts: PolicyFacts) -> KnownRecord:
    """The general path's facts for a record ending in ``tail`` (``safety_checks.variables``:
    recordResource, recordCount, recordKey, selector, limits) for a pool mode."""
    version = f"{_field(tail, 'policy')}@{_field(tail, 'policyVersion')}"
    key = f"{version}/{_field(tail, 'pool')}"
    count = _field(tail, "slots", number=True)
    return KnownRecord(
        resource=_field(tail, "resource"),
        count=count,
        selector=facts.node_selectors.get(key, {}),
        limits=facts.env_limits.get(f"{key}/{count}", {}),
    )


def _literal(known: Mapping[str, KnownRecord], value: Callable[[KnownRecord], str]) -> str:
    """CEL: tail (less its ``"mode":`` key, which the CEL splits off) -> ``value`` of its
    facts, a constant map the apiserver builds once (its CEL programs run with OptOptimize).
    One map per fact: the apiserver's CEL refuses map literals whose values differ in
    type."""
    return cel_map({tail[len(MODE_KEY) :]: value(record) for tail, record in sorted(known.items())})


def fast_gate(known: Mapping[str, KnownRecord], device_ok: str, general_fails: str) -> str:
    """CEL: whether some check refuses the pod, ``general_fails`` unless the pod is annotated
    and carries a known record; then: not ``device_ok``, or the record's container is gone,
    asks for another count of the record's resource, or lost its pool's node selector or
    env limits (``safety_checks.checks``; never-mutated and the hand-ask pass for an
    annotated pod with a record). Each value used more than once is bound
    (``cel_inlining.bind_all``'s one-element comprehension)."""
    if not known:
        return general_fails
    annotated = " || ".join(f"{cel_string(k)} in known_annotations" for k in REQUEST_ANNOTATIONS)
    applied = f"known_annotations[?{cel_string(APPLIED_ANNOTATION)}].orValue('')"
    # Split, not indexOf and substring: cel-go's strings extension turns the whole record
    # into runes for each of those (about 3 KiB a pod, bench/cel_cost.py's memory profile).
    # The head pattern has matched: the record starts with CONTAINER_KEY, the name holds no
    # quote (it is the piece after CONTAINER_KEY's quotes), and the first MODE_KEY starts
    # the tail.
    quotes = CONTAINER_KEY.count('"')
    container = f"known_record.split('\"', {quotes + 2})[{quotes}]"
    asked = _literal(known, lambda r: f"[{cel_string(r.resource)}, {cel_string(r.count)}]")
    # The container by its name: the apiserver has refused a pod with two containers of one
    # name before any validating admission (the pod's validation runs first), so this is the
    # general path's first container of that name.
    in_container = [
        "c.name == known_container",
        "string(c.?resources.?limits[?known_asked[0]].orValue('none')) == known_asked[1]",
    ]
    if any(record.limits for record in known.values()):
        limits = _literal(known, lambda r: env_limits_map(r.limits))
        in_container.append(
            f"[dyn({limits}[known_tail])].all(known_limits, "
            f"known_limits.all(name, {limit_held('known_limits[name]', 'c')}))"
        )
    held = [
        f"[{container}].all(known_container, "
        f"object.spec.containers.exists(c, {' && '.join(in_container)}))"
    ]
    if any(record.selector for record in known.values()):
        node_selector = "object.spec.nodeSelector"
        selectors = _literal(known, lambda r: selector_map(r.selector))
        held.append(
            f"[dyn({selectors}[known_tail])].all(known_selector, "
            f"known_selector.all(k, has({node_selector}) && k in {node_selector} && "
            f"{node_selector}[k] == known_selector[k]))"
        )
    checked = f"!(({device_ok}) && {' && '.join(held)})"
    tail = (
        f"known_record.matches({cel_string(HEAD_PATTERN)}) ? "
        f"known_record.split({cel_string(MODE_KEY)}, 2)[1] : ''"
    )
    # Each literal once: the whole condition must stay within CEL's size bound.
    return (
        "[object.metadata.?annotations.orValue({})].all(known_annotations, "
        f"[({annotated}) ? {applied} : ''].all(known_record, "
        f"[{tail}].all(known_tail, "
        f"[{asked}[?known_tail].orValue([])].all(known_asked, "
        f"size(known_asked) == 2 ? {checked} : ({general_fails})))))"
    )
