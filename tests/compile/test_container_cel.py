"""The compiled policies give the GPU to the container the core chooses: request_cel's ``ci``
and the usual branch's guard (container 0 is the chosen one), evaluated with cel-python on
every list of up to three names drawn from known GPU names, helpers and plain names, against
``container_choice.choose_container``. The apiserver itself holds the whole compiled pod equal
to the webhook's in tests/e2e/test_compiled_policies.py."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import pytest
from celpy import celtypes

from webhook.compile.plan import PlanCel
from webhook.core import load_policies
from webhook.core.container_choice import Rule, choose_container

DEFAULT = Path(__file__).resolve().parents[2] / "policies"
NAMES = ("main", "pytorch", "wait", "istio-proxy", "agent", "app", "sidecar")


def _index_of(items: celtypes.ListType, value: Any) -> celtypes.IntType:
    """Kubernetes' CEL list library ``indexOf``, which cel-python lacks."""
    return celtypes.IntType(next((i for i, item in enumerate(items) if item == value), -1))


def _program(expression: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(expression), functions={"indexOf": _index_of})


def _name_lists() -> Iterator[list[str]]:
    for size in (1, 2, 3):
        for names in itertools.permutations(NAMES, size):
            yield list(names)


@pytest.fixture(scope="module")
def plan() -> PlanCel:
    policies = load_policies(DEFAULT)
    return PlanCel(policies.policies[0], policies)


def test_ci_chooses_the_container_the_core_chooses(plan: PlanCel) -> None:
    ci = _program(dict(plan.variables)["ci"])
    for names in _name_lists():
        unnamed = {"hc": False, "cn": "", "names": names}
        expected = choose_container(names).index if len(names) > 1 else 0
        assert ci.evaluate({"variables": celpy.json_to_cel(unnamed)}) == expected, names
        named = {"hc": True, "cn": names[-1], "names": names}
        assert ci.evaluate({"variables": celpy.json_to_cel(named)}) == len(names) - 1


def test_the_usual_branch_holds_only_where_container_0_is_chosen(plan: PlanCel) -> None:
    assert plan.common is not None
    guard = _program(plan.common.guard)
    usual = 0
    for names in _name_lists():
        pod = {
            "metadata": {"annotations": {"gpu-fraction": "0.5"}},
            "spec": {"containers": [{"name": n, "image": "x"} for n in names]},
        }
        fast = bool(guard.evaluate({"object": celpy.json_to_cel(pod)}))
        choice = choose_container(names) if len(names) > 1 else None
        first = choice is None or choice.index == 0
        assert not fast or first, names
        # Only where every container is a helper does container 0 take the general path.
        assert fast or not first or (choice is not None and choice.rule is Rule.FIRST), names
        usual += fast
    assert usual > 100
