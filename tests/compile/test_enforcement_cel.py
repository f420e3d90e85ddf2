"""The compiled policies' ``enforcement``: the driver memory limit in CEL against the core's
own ``NVIDIA_GPU_MEMORY_LIMIT`` (cel-python on the plan's variables, for fractions and
memory asks under a reservation per GPU model), the refusals' words taken from the core,
device variables and hand-set limits wired into the mutating policy. The apiserver holds
the compiled pods equal to the webhook's in tests/e2e/test_compiled_policies.py."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import celpy
import pytest
from celpy import celtypes

from webhook.compile import compile_policies
from webhook.compile.cel import python_repr_text
from webhook.compile.core_words import (
    CONTAINER,
    PLANNED,
    POLICY,
    VALUE,
    device_sentence,
    hand_set_sentence,
)
from webhook.compile.device_cel import sets_devices
from webhook.compile.plan import PlanCel
from webhook.compile.refusals import refusals
from webhook.constants import DRIVER_MEMORY_LIMIT_VAR
from webhook.core import (
    DeviceVariables,
    HandSetLimits,
    Placement,
    Policy,
    PolicySet,
    load_policy_text,
    mode_changes,
    place_request,
    read_request,
)

POLICIES = """
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: enforced}
spec:
  default: true
  mode: mps
  gpuMemory: 16Gi
  fraction: {min: 0.05, max: 0.5}
  pools:
    - {name: t4, replicas: 4, nodeSelector: {nvidia.com/gpu.product: Tesla-T4}}
    - {name: half, replicas: 2}
    - {name: eighth, replicas: 8, gpuMemory: 24Gi}
  enforcement:
    driverMemoryLimit: require
    reservedMemory: {default: 256Mi, products: {Tesla-T4: 450Mi}}
    handSetLimits: deny
---
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: mixed}
spec:
  match: {namespaces: [mixed]}
  mode: time-slicing
  allocation: count
  fraction: {min: 0.05, max: 0.5}
  pools:
    - {name: sized, replicas: 4, gpuMemory: 24Gi, gpusPerNode: 1}
    - {name: unsized, replicas: 2, gpusPerNode: 1}
"""
ASKS = [
    *({"gpu-fraction": f"{n / 100:g}"} for n in range(5, 51, 3)),
    {"gpu-fraction": "0.123"},
    {"gpu-fraction": "0.3333"},
    *({"gpu-memory": text} for text in ("1Gi", "3Gi", "3983Mi", "3900", "5Gi", "1.5G", "7Gi")),
]


def _program(expression: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(expression))


def _driver_limit_in_cel(plan: PlanCel, inputs: dict[str, Any]) -> int:
    """``dl`` evaluated with cel-python, its own variables (us, bd, ask) first."""
    variables = dict(plan.variables)
    known = dict(inputs, common=False)
    for name in ("us", "bd", "ask", "dl"):
        if name in variables:
            activation = {"variables": celpy.json_to_cel(known)}
            known[name] = _program(variables[name]).evaluate(activation)
    return int(known["dl"])


def _core_limit(policy: Policy, placement: Placement) -> int:
    values = [
        e.value for e in mode_changes(policy, placement).env if e.name == DRIVER_MEMORY_LIMIT_VAR
    ]
    return int(values[0]) if values else -1


@pytest.mark.parametrize("name", ["enforced", "mixed"])
def test_the_driver_limit_in_cel_is_the_cores(name: str) -> None:
    policies = load_policy_text(POLICIES)
    (policy,) = [p for p in policies.policies if p.name == name]
    plan = PlanCel(policy, policies)
    checked = 0
    for asked in ASKS:
        request = read_request(asked)
        assert not isinstance(request, list), asked
        placement = place_request(policy, request)
        if not isinstance(placement, Placement):
            continue
        memory = request.memory_mib
        inputs = {
            "pi": policy.pools.index(placement.pool),
            "slots": placement.slots,
            "fx": placement.fraction,
            "mok": memory is not None,
            "mib": memory or 0.0,
        }
        assert _driver_limit_in_cel(plan, inputs) == _core_limit(policy, placement), asked
        checked += 1
    assert checked > 10


def test_the_words_come_from_the_core_with_their_placeholders() -> None:
    """Each sentence holds each placeholder once, so cutting it there is unambiguous; a
    change of wording in the core goes into the compiled policies by itself."""
    for variable in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        for field in ("containers", "initContainers"):
            text = device_sentence(variable, field)
            assert text.count(repr(CONTAINER)) == 1 and text.count(repr(POLICY)) == 1, text
    for from_elsewhere in (True, False):
        for planned in (True, False):
            text = hand_set_sentence(from_elsewhere, planned)
            assert text.count(repr(CONTAINER)) == 1, text
            assert text.count(repr(VALUE)) == (0 if from_elsewhere else 1), text
            assert text.count(PLANNED) == (1 if planned else 0), text


@pytest.mark.parametrize(
    "text", ["3983", "", "it's", 'say "hi"', "both ' and \"", "back\\slash", "a\nb\tc\rd"]
)
def test_a_users_value_is_quoted_as_python_quotes_it(text: str) -> None:
    environment = celpy.Environment()

    def replace(value: str, old: str, new: str) -> celtypes.StringType:
        return celtypes.StringType(value.replace(old, new))

    program = environment.program(
        environment.compile(python_repr_text("variables.v")), functions={"replace": replace}
    )
    activation = {"variables": celpy.json_to_cel({"v": text})}
    assert program.evaluate(activation) == repr(text)


def _mutating(policies: PolicySet) -> dict[str, Any]:
    spec: dict[str, Any] = compile_policies(policies)[0]["spec"]
    return spec


def _text(spec: dict[str, Any]) -> str:
    """The patch and every variable: all the CEL of a mutating policy."""
    patch: str = spec["mutations"][0]["jsonPatch"]["expression"]
    return " ".join([patch, *(v["expression"] for v in spec["variables"])])


def test_device_variables_and_hand_set_limits_only_where_the_policy_refuses_them() -> None:
    policies = load_policy_text(POLICIES)
    enforced = _mutating(PolicySet(policies.policies[:1], policies.excluded_namespaces))
    patch = _text(enforced)
    conditions = [c["name"] for c in enforced["matchConditions"]]
    assert conditions[0] == "requests-gpu-share-or-asks-by-hand-or-sets-devices"
    assert "enforcement.deviceVariables: deny" in patch
    assert "enforcement.handSetLimits: deny" in patch
    assert '"kai-scheduler"' in (sets_devices(policies.policies[0]) or "")

    loose = dataclasses.replace(
        policies.policies[0],
        enforcement=dataclasses.replace(
            policies.policies[0].enforcement,
            device_variables=DeviceVariables.ALLOW,
            hand_set_limits=HandSetLimits.OVERRIDE,
        ),
    )
    assert sets_devices(loose) is None
    spec = _mutating(PolicySet((loose,), policies.excluded_namespaces))
    patch = _text(spec)
    assert "enforcement.deviceVariables" not in patch
    assert "enforcement.handSetLimits" not in patch
    first = spec["matchConditions"][0]["name"]
    assert first == "requests-gpu-share-or-asks-by-hand"
    # Overridden, a hand-set limit is replaced in place like the MPS limits.
    assert re.search(r'"NVIDIA_GPU_MEMORY_LIMIT" && .{0,300}op: "replace"', patch, re.S)


def test_the_usual_pod_reads_its_driver_limit_from_the_common_shares() -> None:
    """A common share's limit is decided when compiling (the core's own value), so the
    usual pod's branch evaluates no limit arithmetic."""
    policies = load_policy_text(POLICIES)
    spec = _mutating(PolicySet(policies.policies[:1], policies.excluded_namespaces))
    copies = {v["name"] for v in spec["variables"] if v["name"].startswith("u_")}
    assert not copies & {"u_dl", "u_bd", "u_ask", "u_us"}, copies
    assert '"0.25": 3983' in _text(spec)


def test_a_driver_limit_injected_by_the_policy_is_refused() -> None:
    policies = load_policy_text(POLICIES)
    policy = policies.policies[0]
    injecting = dataclasses.replace(
        policy, inject=dataclasses.replace(policy.inject, env=((DRIVER_MEMORY_LIMIT_VAR, "1"),))
    )
    [refusal] = refusals(PolicySet((injecting,), policies.excluded_namespaces))
    assert refusal.field == "inject.env"
    assert DRIVER_MEMORY_LIMIT_VAR in refusal.why
