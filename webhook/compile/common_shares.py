"""The shares people write, decided when compiling: a lookup in place of the plan's arithmetic.

Nearly every annotated pod asks for a round share ("0.5", "0.25", "0.1"), and what one
policy makes of a ``gpu-fraction`` alone (the pool, its slots, the share, the share as the
record writes it, the driver memory limit) depends on nothing else in the pod. The
compiler asks the webhook's own core (``read_request``, then the mode's ``place_request``)
for each common share and bakes the answers into constant CEL maps: the apiserver builds a
constant map literal once, when it compiles the policy (cel-go's ``OptOptimize``, which
Kubernetes sets), so a pod asking for one of these shares skips about a dozen variables:
the strict decimal parsing, the pool choice and the number formatting. Any other text, a
``gpu-memory`` or container-name annotation, a share the policy refuses, or a pod whose GPU
container is not its first (``request_cel.first_is_chosen``) takes the general CEL path,
which decides the same way (``tests/e2e/test_compiled_policies.py`` holds both equal to the
webhook).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from webhook.compile import cel
from webhook.compile.pod_cel import V, s
from webhook.compile.request_cel import first_is_chosen
from webhook.constants import (
    CONTAINER_ANNOTATION,
    DEVICES_ANNOTATION,
    DRIVER_MEMORY_LIMIT_VAR,
    FRACTION_ANNOTATION,
    MEMORY_ANNOTATION,
)
from webhook.core import (
    Placement,
    Policy,
    format_fraction,
    mode_changes,
    place_request,
    read_request,
)

# Hundredths (0.01 .. 0.99) and the eighths, sixteenths, thirds and sixths people write.
_EXTRA_SHARES = (
    "0.125",
    "0.375",
    "0.625",
    "0.875",
    "0.0625",
    "0.333",
    "0.3333",
    "0.667",
    "0.6667",
    "0.1667",
    "0.8333",
)


def _common_texts() -> list[str]:
    # As people write them: "0.5", not "0.50".
    hundredths = [f"0.{n:02d}".rstrip("0") for n in range(1, 100)]
    return [*hundredths, *_EXTRA_SHARES]


@dataclass(frozen=True)
class CommonShare:
    """What ``policy`` makes of ``gpu-fraction: <text>`` on its own."""

    text: str
    pool_index: int
    slots: int
    fraction: float
    formatted: str
    # The driver memory limit the mode writes (MiB), -1 for none.
    driver_limit: int = -1


def common_shares(policy: Policy) -> list[CommonShare]:
    """The common shares ``policy`` grants without a problem, decided by the core."""
    shares = []
    for text in _common_texts():
        request = read_request({FRACTION_ANNOTATION: text})
        if isinstance(request, list) or request.is_whole or request.fraction is None:
            continue
        placement = place_request(policy, request)
        if not isinstance(placement, Placement) or placement.node_gpu_memory_mib is not None:
            continue
        limits = [
            int(env.value)
            for env in mode_changes(policy, placement).env
            if env.name == DRIVER_MEMORY_LIMIT_VAR
        ]
        shares.append(
            CommonShare(
                text,
                policy.pools.index(placement.pool),
                placement.slots,
                placement.fraction,
                format_fraction(placement.fraction),
                limits[0] if limits else -1,
            )
        )
    return shares


@dataclass(frozen=True)
class CommonPath:
    """What compiling decided for pods asking only ``gpu-fraction`` with a common share.

    ``variables``: the plan's variables with ``common`` added and, where it holds, the pool,
    slots and share read from constant maps. ``guard``: the same test as ``common``,
    written inline (no variable evaluated). ``facts``: variable name -> its value under the
    guard, as an expression using no variables (``cel_inlining.specialize`` rewrites the
    usual pod's patch with them)."""

    variables: list[tuple[str, str]]
    guard: str
    facts: dict[str, str]


# The request's problems and the general path's choices, known for a common share.
_DECIDED = {"fp": "''", "whole": "false", "rp": "[]", "bad": "[]", "none": "false", "pp": "[]"}
# What the common share's constant maps give (the pool's index, slots, share, as written).
_COLUMNS: dict[str, Callable[[CommonShare], str]] = {
    "pi": lambda x: str(x.pool_index),
    "fx": lambda x: cel.double(x.fraction),
    "slots": lambda x: str(x.slots),
    "ff": lambda x: s(x.formatted),
    "dl": lambda x: str(x.driver_limit),
}
_ANNOTATIONS = "object.metadata.annotations"
_FRACTION = f"{_ANNOTATIONS}[{s(FRACTION_ANNOTATION)}]"
# The request's and the container's variables (request_cel, plan) under the guard: only
# gpu-fraction asked, so no memory, container name or node-memory pool; the first container,
# which the guard also checks is the one chosen (request_cel.first_is_chosen).
_USUAL = {
    "a": _ANNOTATIONS,
    "hf": "true",
    "hm": "false",
    "hc": "false",
    "ft": _FRACTION,
    "mt": "''",
    "cn": "''",
    "fok": "true",
    "mok": "false",
    "f": f"double({_FRACTION})",
    "ci": "0",
    "c": "object.spec.containers[0]",
    "cpath": s("/spec/containers/0"),
    "bn": "false",
    "nm": "0",
    "common": "true",
}


def _guard(texts: str) -> str:
    """``common`` read from the pod's annotations alone, and container 0 the GPU container
    (``_USUAL``'s ``ci``, ``c``, ``cpath``): no variable evaluated."""
    others = (MEMORY_ANNOTATION, CONTAINER_ANNOTATION, DEVICES_ANNOTATION)
    return (
        f"{s(FRACTION_ANNOTATION)} in {_ANNOTATIONS} && "
        + " && ".join(f"!({s(name)} in {_ANNOTATIONS})" for name in others)
        + f" && {_FRACTION} in {texts} && {first_is_chosen('object.spec.containers')}"
    )


def decide_common_shares(policy: Policy, variables: list[tuple[str, str]]) -> CommonPath | None:
    """The plan's ``variables`` with a ``common`` variable (a pod asking only
    ``gpu-fraction``, with a common share) and, where it holds, the pool, slots and share
    read from constant maps and the request's problems known to be none; the variables
    this makes unnecessary are then never evaluated (CEL variables are lazy). None when the
    policy grants no common share."""
    shares = common_shares(policy)
    if not shares:
        return None

    def table(value: Callable[[CommonShare], str], key: str) -> str:
        entries = ", ".join(f"{s(x.text)}: {value(x)}" for x in shares)
        return f"{{{entries}}}[{key}]"

    texts = cel.strings(x.text for x in shares)
    known = f"{V}hf && !{V}hm && !{V}hc && !({s(DEVICES_ANNOTATION)} in {V}a) && {V}ft in {texts}"
    decided = {**_DECIDED, **{n: table(value, f"{V}ft") for n, value in _COLUMNS.items()}}
    facts = {
        **_DECIDED,
        **{name: table(value, _FRACTION) for name, value in _COLUMNS.items()},
        **_USUAL,
    }
    result = []
    for name, general in variables:
        if name in decided:
            result.append((name, f"{V}common ? {decided[name]} : ({general})"))
        else:
            result.append((name, general))
        if name == "cn":
            result.append(("common", known))
    return CommonPath(result, _guard(texts), facts)
