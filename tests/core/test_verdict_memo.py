"""The webhook's verdict memo (``webhook.core.verdict_memo``): replicas of one template get
the verdict planned for the first, which holds only because ``mutate`` never reads a pod's
name. Both are checked here: over the golden corpus (admitted and denied cases) and over
generated pods, a pod renamed gets the same answer planned afresh."""

from __future__ import annotations

import copy
import datetime
import gc
import weakref
from typing import Any

import pytest
from hypothesis import given

from webhook.core import remembered_mutate
from webhook.core.policy.loader import load_policies
from webhook.core.verdict import Verdict, mutate
from webhook.core.verdict_memo import (
    MAX_KEY_BYTES,
    VERDICTS_LIMIT,
    name_free_key,
    remembered_count,
)

from .support import POLICIES_DIR
from .test_corpus import CASES, Case, _ids, _policies
from .test_properties import POLICIES, PROPERTY_SETTINGS, Example, examples


def _answer(verdict: Verdict) -> tuple[Any, ...]:
    """Everything of a verdict the webhook sends or logs."""
    return (
        verdict.allowed,
        verdict.patch,
        verdict.warnings,
        verdict.reasons,
        verdict.code,
        verdict.policy,
    )


def _renamed(pod: dict[str, Any], name: str) -> dict[str, Any]:
    other = copy.deepcopy(pod)
    other.setdefault("metadata", {})["name"] = name
    return other


def _pod(name: str, fraction: str = "0.5") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"gpu-fraction": fraction}},
        "spec": {"containers": [{"name": "trainer", "image": "pytorch/pytorch:2.4.0"}]},
    }


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_no_corpus_verdict_depends_on_the_pod_name(case: Case) -> None:
    policies = _policies(case.policies_path)
    first = mutate(case.pod, case.namespace, policies)
    for name in ("other-name", "x" * 63, ""):
        renamed = mutate(_renamed(case.pod, name), case.namespace, policies)
        assert _answer(renamed) == _answer(first), name


@PROPERTY_SETTINGS
@given(examples())
def test_no_generated_verdict_depends_on_the_pod_name(example: Example) -> None:
    first = mutate(example.pod, example.namespace, POLICIES)
    renamed = mutate(_renamed(example.pod, "replica-7f9c4"), example.namespace, POLICIES)
    assert _answer(renamed) == _answer(first)


def test_replicas_of_one_template_share_the_first_verdict() -> None:
    policies = load_policies(POLICIES_DIR)
    first = remembered_mutate(_pod("trainer-a"), "ml", policies)
    second = remembered_mutate(_pod("trainer-b"), "ml", policies)
    assert first.patch and second is first
    assert remembered_count(policies) == 1


def test_a_pod_differing_in_anything_but_its_name_is_planned_for_itself() -> None:
    policies = load_policies(POLICIES_DIR)
    half = remembered_mutate(_pod("a"), "ml", policies)
    quarter = remembered_mutate(_pod("a", "0.25"), "ml", policies)
    elsewhere = remembered_mutate(_pod("a"), "other-team", policies)
    assert quarter is not half and _answer(quarter) == _answer(
        mutate(_pod("a", "0.25"), "ml", policies)
    )
    assert elsewhere is not half
    assert remembered_count(policies) == 3


def test_a_reloaded_policy_set_plans_afresh() -> None:
    """Verdicts live with the set they were planned under: an equal set loaded again (a
    reload) shares nothing with the old one."""
    old, new = load_policies(POLICIES_DIR), load_policies(POLICIES_DIR)
    assert remembered_mutate(_pod("a"), "ml", new) is not remembered_mutate(_pod("a"), "ml", old)


def test_the_remembered_verdicts_go_with_their_policy_set() -> None:
    """Nothing the memo keeps holds the set it was planned under: after a reload the old
    set, and with it its verdicts, can be collected."""
    policies = load_policies(POLICIES_DIR)
    remembered_mutate(_pod("a"), "ml", policies)
    gone = weakref.ref(policies)
    del policies
    gc.collect()
    assert gone() is None


def test_large_or_non_json_pods_are_planned_every_time() -> None:
    policies = load_policies(POLICIES_DIR)
    large = _pod("big")
    large["metadata"]["annotations"]["note"] = "x" * MAX_KEY_BYTES
    dated = _pod("dated")
    dated["metadata"]["creationTimestamp"] = datetime.datetime(2026, 12, 6)  # what YAML gives
    for pod in (large, dated):
        assert name_free_key(pod) is None
        first = remembered_mutate(pod, "ml", policies)
        assert remembered_mutate(copy.deepcopy(pod), "ml", policies) is not first
        assert _answer(first) == _answer(mutate(pod, "ml", policies))
    assert remembered_count(policies) == 0


def test_the_memo_of_a_policy_set_stays_bounded() -> None:
    policies = load_policies(POLICIES_DIR)
    for index in range(VERDICTS_LIMIT + 10):
        pod = _pod("p")
        pod["metadata"]["labels"] = {"index": str(index)}
        remembered_mutate(pod, "ml", policies)
        assert remembered_count(policies) <= VERDICTS_LIMIT


def test_the_key_leaves_out_the_name_alone() -> None:
    assert name_free_key(_pod("a")) == name_free_key(_pod("b"))
    assert name_free_key(_pod("a")) != name_free_key(_pod("a", "0.25"))
    generated = _pod("")
    del generated["metadata"]["name"]
    generated["metadata"]["generateName"] = "trainer-"
    assert name_free_key(generated) != name_free_key(_pod("a"))
    assert name_free_key({"metadata": None, "spec": {}}) == b'{"metadata":null,"spec":{}}'
