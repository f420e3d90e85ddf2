"""The end-to-end benchmark's parts that need no apiserver: scoping each mode's admission
configuration to its namespace, and the report of interleaved turns."""

from __future__ import annotations

import copy
from typing import Any

from bench.e2e_bench import MODE_NAMESPACES, MODES, Cell, report, scoped

ONLY_BENCH = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["bench-x"]}


def _documents() -> list[dict[str, Any]]:
    excluded = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["k"]}
    return [
        {
            "kind": "MutatingWebhookConfiguration",
            "webhooks": [{"name": "a", "namespaceSelector": {"matchExpressions": [excluded]}}],
        },
        {"kind": "ValidatingWebhookConfiguration", "webhooks": [{"name": "b"}]},
        {"kind": "MutatingAdmissionPolicy", "spec": {"matchConstraints": {}}},
        {"kind": "ValidatingAdmissionPolicyBinding", "spec": {"policyName": "p"}},
    ]


def test_every_webhook_and_policy_is_limited_to_the_namespace() -> None:
    documents = _documents()
    before = copy.deepcopy(documents)
    mutating, validating, policy, binding = scoped(documents, "bench-x")
    assert documents == before  # the caller's documents are left as they were
    expressions = mutating["webhooks"][0]["namespaceSelector"]["matchExpressions"]
    excluded = before[0]["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]
    assert expressions == [excluded, ONLY_BENCH]
    assert validating["webhooks"][0]["namespaceSelector"] == {"matchExpressions": [ONLY_BENCH]}
    assert policy["spec"]["matchConstraints"]["namespaceSelector"] == {
        "matchExpressions": [ONLY_BENCH]
    }
    assert binding == before[3]


def test_each_mode_has_a_namespace_of_its_own() -> None:
    assert sorted(MODE_NAMESPACES) == sorted(MODES)
    assert len(set(MODE_NAMESPACES.values())) == len(MODES)


def test_interleaved_turns_report_no_cpu_per_mode_and_compare_latencies() -> None:
    added_ms = {"none": 0.0, "noop": 1.0, "reference": 1.1, "shipped": 2.9, "compiled": 1.2}
    cells = []
    for mode, extra in added_ms.items():
        cell = Cell(mode, 1, latencies=[(2.0 + extra + d) / 1000 for d in (-0.1, 0.0, 0.1)])
        cell.seconds = sum(cell.latencies)
        cell.apiserver_cpu = float("nan")
        cells.append(cell)
    met, lines = report(cells, [1])
    assert all("(interleaved)" in line for line in lines[1:6])
    text = "\n".join(lines)
    assert "shipped +2.90 ms (2.90x)" in text
    assert "target c=1 p50 shipped <= 3.0x noop: met" in text
    assert "target c=1 p50 compiled <= 1.25x noop: met" in text
    assert met


def test_batches_report_each_rounds_ratios_beside_the_pooled_ones() -> None:
    # Round 0 quiet; round 1 with a slow spell under "none" that makes its ratios odd.
    added_ms = [
        {"none": 0.0, "noop": 2.0, "reference": 2.2, "shipped": 5.0, "compiled": 2.5},
        {"none": 3.0, "noop": 2.5, "reference": 3.0, "shipped": 6.0, "compiled": 3.2},
    ]
    cells = []
    for index, round_added in enumerate(added_ms):
        for mode, extra in round_added.items():
            latencies = [(5.0 + extra + d) / 1000 for d in (-0.2, 0.0, 0.2)]
            cells.append(Cell(mode, 8, latencies=latencies, round_index=index))
    _, lines = report(cells, [8])
    text = "\n".join(lines)
    # Round 0: shipped 5.0 / 2.0; round 1: (6.0 - 3.0) / (2.5 - 3.0) has no meaning.
    assert "round by round: shipped 2.50-2.50x (median 2.50x) noop" in text
    assert "compiled 0.07-0.50x (median 0.28x) shipped" in text
    # A no-op webhook adding nothing (p99 here) gives no multiple rather than a wrong one.
    assert "nanx" not in text
