"""The safety net's lookup of the records gpushare writes (webhook/install/known_records.py).

What the lookup decides in the real kube-apiserver, against the general path, is in
tests/e2e/test_safety_net_policy.py; here: that it covers every pool record the webhook
writes, with the webhook's own facts, and that a record it reads is read as the general path
reads it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from webhook.constants import APPLIED_ANNOTATION, FRACTION_ANNOTATION
from webhook.core import PolicySet, load_policies, load_policy_text, mutate, mutated_pod
from webhook.install.known_records import HEAD_KEYS, HEAD_PATTERN, MODE_KEY, known_records
from webhook.install.policy_facts import POOL_MODES, policy_facts, record_pattern
from webhook.install.validating_policy import (
    MAX_EXPRESSION_CODE_POINTS,
    SafetyNetSettings,
    safety_net,
)

REPO = Path(__file__).resolve().parents[2]
POLICY_FILES = [
    REPO / "policies/default.yaml",
    *sorted((REPO / "policies/examples").glob("*.yaml")),
]
FRACTIONS = ["0.05", "0.1", "0.125", "0.2", "0.25", "0.3", "0.33", "0.4", "0.5", "0.6", "0.75"]
RECORD_FIELDS = ("gpus", "mode", "policy", "policyVersion", "pool", "resource")


def _namespace(policies: PolicySet) -> str:
    """A namespace the file's first policy governs ("team-a" for a default policy)."""
    patterns = policies.policies[0].match.namespaces
    return patterns[0].replace("*", "x") if patterns else "team-a"


def _pod(fraction: str) -> dict[str, Any]:
    container = {"name": "trainer-0", "image": "tensorflow/tensorflow:2.17.0-gpu"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": {FRACTION_ANNOTATION: fraction}},
        "spec": {"containers": [container]},
    }


def _general_reading(record: str, name: str, *, number: bool = False) -> str:
    """``policy_facts.record_field`` in Python: the first match in the whole record."""
    key, value = record_pattern(name, number=number)
    found = re.search(key + value, record)
    return found.group(0)[len(key) :].replace('"', "") if found else ""


@pytest.mark.parametrize("path", POLICY_FILES, ids=lambda p: p.stem)
def test_every_pool_record_the_webhook_writes_is_known_with_the_facts_of_its_pod(
    path: Path,
) -> None:
    policies = load_policies(path)
    known = known_records(policies, policy_facts(policies))
    namespace = _namespace(policies)
    checked = 0
    for fraction in FRACTIONS:
        pod = _pod(fraction)
        verdict = mutate(pod, namespace, policies)
        if not verdict.allowed or verdict.decision is None:
            continue
        mutated = mutated_pod(pod, verdict.decision)
        record = mutated["metadata"]["annotations"][APPLIED_ANNOTATION]
        pooled = json.loads(record)["mode"] in {mode.value for mode in POOL_MODES}
        if not pooled or "nodeGpuMemory" in record:
            assert record[record.index(MODE_KEY) :] not in known
            continue
        assert re.search(HEAD_PATTERN, record), record
        facts = known[record[record.index(MODE_KEY) :]]
        container = mutated["spec"]["containers"][0]
        assert container["resources"]["limits"][facts.resource] == facts.count
        assert facts.selector.items() <= mutated["spec"].get("nodeSelector", {}).items()
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert set(facts.limits) <= set(env)
        checked += 1
    modes = {policy.mode for policy in policies.policies}
    assert checked > 0 if modes & POOL_MODES else not known


def test_the_lookup_covers_each_pool_and_slot_count_once() -> None:
    policies = load_policies(REPO / "policies/examples/mps.yaml")
    known = known_records(policies, policy_facts(policies))
    (policy,) = policies.policies
    assert len(known) == sum(pool.replicas for pool in policy.pools)
    assert {(r.resource, r.count) for r in known.values()} == {
        (policy.resource_name, str(slots))
        for pool in policy.pools
        for slots in range(1, pool.replicas + 1)
    }


_VALUE = st.text(alphabet='ab0:,"\\{}mode', max_size=12)


@settings(max_examples=300, deadline=None)
@example(
    head=[("fraction", '"0.5"'), ("milliGpus", "500"), ("gpuModel", '"A100 80GB"')],
    container="main",
)
@given(
    head=st.lists(
        st.tuples(
            st.sampled_from([*HEAD_KEYS, "resource", "slots", "pool", "mode", "zz"]),
            st.one_of(_VALUE.map(json.dumps), st.integers(0, 99).map(str), _VALUE),
        ),
        max_size=4,
    ),
    container=_VALUE,
)
def test_a_record_the_lookup_reads_is_read_as_the_general_path_reads_it(
    head: list[tuple[str, str]], container: str
) -> None:
    """Whatever sits before a known tail, a record the lookup reads (the head pattern lets it
    through and its tail, from the first "mode" key on, is the known one) yields, for every
    field, the general path's first match in the whole record from the tail alone."""
    tail = (
        '"mode":"mps","policy":"ml-mps","policyVersion":"0123456789ab","pool":"half",'
        '"resource":"nvidia.com/gpu.shared","slots":2}'
    )
    fields = "".join(f',"{key}":{value}' for key, value in head)
    record = '{"container":"' + container + '"' + fields + "," + tail
    if not re.search(HEAD_PATTERN, record) or record[record.index(MODE_KEY) :] != tail:
        return  # the general path reads it
    for name in RECORD_FIELDS:
        number = name in ("gpus", "slots")
        assert _general_reading(record, name, number=number) == _general_reading(
            "{" + tail, name, number=number
        )
    assert _general_reading(record, "container") == container


@pytest.mark.parametrize(
    "record",
    [
        # A key the core does not write before the mode: the general path reads it.
        '{"container":"main","fraction":"0.5","pool":"x","mode":"time-slicing"}',
        # A quote inside a value of the head.
        '{"container":"main","gpuModel":"A\\"100","mode":"time-slicing"}',
        # Not gpushare's shape at all.
        '{"mode":"time-slicing","container":"main"}',
        "",
    ],
)
def test_records_in_another_shape_are_left_to_the_general_path(record: str) -> None:
    assert not re.search(HEAD_PATTERN, record)


def _safety_condition(policies: PolicySet) -> str:
    settings = SafetyNetSettings(
        name="gpushare",
        failure_policy="Fail",
        namespace_selector={},
        match_conditions=[{"name": "annotated", "expression": "true"}],
    )
    (policy, _) = safety_net(settings, policies)
    (condition,) = policy["spec"]["matchConditions"]
    return str(condition["expression"])


def test_the_lookup_is_used_where_it_fits_within_cels_size_bound() -> None:
    """cel-go refuses an expression over 100,000 code points: a policy set whose lookup
    maps would pass it is checked by the general path alone (the apiserver refused such a
    set's policy in tests/e2e/test_compiled_policies.py before this bound was kept)."""
    assert "known_asked" in _safety_condition(load_policies(REPO / "policies/default.yaml"))

    text = (REPO / "policies/examples/mps.yaml").read_text()
    pools = "".join(f"    - name: mps-{n}\n      replicas: {n}\n" for n in (48, 40, 32, 24, 16))
    start = text.index("  pools:\n") + len("  pools:\n")
    end = text.index("  mps:\n")
    big = load_policy_text(text[:start] + pools + text[end:])
    assert len(known_records(big, policy_facts(big))) == 160
    condition = _safety_condition(big)
    assert len(condition) <= MAX_EXPRESSION_CODE_POINTS
    assert "known_asked" not in condition
