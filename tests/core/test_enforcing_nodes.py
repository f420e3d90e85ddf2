"""Which pools have a node enforcing the driver memory limit: nodes as ``kubectl get nodes -o
yaml`` lists them; an error where ``require`` leaves a pool's pods no node, a warning where
``auto``/``inject`` pods may run uncapped, nothing for ``off`` and the other schemes."""

from __future__ import annotations

from typing import Any

from webhook.core import (
    Severity,
    enforcing_node_findings,
    pool_coverage,
    writes_driver_limit,
)

from .support import policies_from, policy_doc, simple_policy

A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
POOLS = [
    {"name": "a100-half", "replicas": 2, "nodeSelector": A100},
    {"name": "any-quarter", "replicas": 4},
]


def node(
    name: str, enforcing: str | None = None, reason: str = "", **labels: str
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if enforcing is not None:
        metadata["labels"]["gpushare.io/driver-memory-limit"] = enforcing
    if reason:
        metadata["annotations"] = {"gpushare.io/driver-memory-limit-reason": reason}
    return {"apiVersion": "v1", "kind": "Node", "metadata": metadata}


def a100(name: str, enforcing: str | None = None, reason: str = "") -> dict[str, Any]:
    return node(name, enforcing, reason, **A100)


def policies(setting: str, mode: str = "time-slicing") -> Any:
    return policies_from(
        simple_policy(
            mode=mode, pools=POOLS, gpuMemory="80Gi", enforcement={"driverMemoryLimit": setting}
        )
    )


def test_require_with_no_enforcing_node_is_an_error_per_pool() -> None:
    nodes = [a100("gpu-1", "false", "driver 550.54 is older than R615"), node("cpu-1")]
    findings = enforcing_node_findings(policies("require"), nodes)
    assert [(f.severity, f.at) for f in findings] == [
        (Severity.ERROR, ("spec", "pools", 0)),
        (Severity.ERROR, ("spec", "pools", 1)),
    ]
    assert findings[0].message == (
        "pods of pool 'a100-half' will stay Pending (driverMemoryLimit: require): none of the "
        "1 node(s) matching its nodeSelector (nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB) "
        "carries gpushare.io/driver-memory-limit=true (gpu-1: driver 550.54 is older than "
        "R615): run `gpushare node-agent` on the pool's nodes (docs/enforcement.md)."
    )
    # A pool without a nodeSelector may land on any node: both are listed.
    assert "none of the 2 node(s) matching it (no nodeSelector: every node)" in (
        findings[1].message
    )


def test_require_with_one_enforcing_node_is_fine() -> None:
    nodes = [a100("gpu-1", "true"), a100("gpu-2", "false")]
    findings = enforcing_node_findings(policies("require"), nodes)
    assert findings == []  # require keeps pods off gpu-2; any-quarter has gpu-1 too


def test_no_node_matching_the_selector_is_said_so() -> None:
    (finding,) = enforcing_node_findings(policies("require"), [node("t4", "true")])
    assert finding.at == ("spec", "pools", 0)
    assert "no node given matches its nodeSelector (nvidia.com/gpu.product=" in finding.message


def test_auto_and_inject_warn_where_pods_run_uncapped() -> None:
    for setting in ("auto", "inject"):
        nodes = [a100("gpu-1"), a100("gpu-2")]
        findings = enforcing_node_findings(policies(setting), nodes)
        assert {f.severity for f in findings} == {Severity.WARNING}
        assert findings[0].message.startswith(
            f"pods of pool 'a100-half' run without the driver memory limit "
            f"(driverMemoryLimit: {setting}): none of the 2 node(s)"
        )
        assert "or set driverMemoryLimit: require to keep them Pending instead" in (
            findings[0].message
        )


def test_auto_warns_about_the_nodes_that_lack_the_label() -> None:
    nodes = [a100("gpu-1", "true"), *(a100(f"gpu-{n}", "false") for n in range(2, 7))]
    (finding, other) = enforcing_node_findings(policies("auto"), nodes)
    assert finding.severity is Severity.WARNING
    assert "placed on 5 of its 6 nodes run without the driver memory limit" in finding.message
    assert "(gpu-2; gpu-3; gpu-4; and 2 more)" in finding.message
    assert other.at == ("spec", "pools", 1)


def test_off_and_other_schemes_write_no_limit() -> None:
    assert enforcing_node_findings(policies("off"), []) == []
    hami = policies_from(policy_doc("h", mode="hami", default=True))
    assert not writes_driver_limit(hami.policies[0])
    assert pool_coverage(hami, [a100("gpu-1")]) == []


def test_coverage_lists_matching_and_enforcing_nodes() -> None:
    nodes = [a100("gpu-1", "true"), a100("gpu-2", "false"), node("t4", "true"), "junk", {}]
    first, second = pool_coverage(policies("inject", "mps-daemon"), nodes)  # type: ignore[list-item]
    assert [n.name for n in first.matching] == ["gpu-1", "gpu-2"]
    assert first.enforcing == ("gpu-1",)
    assert [n.name for n in second.lacking] == ["gpu-2"]
    assert second.enforcing == ("gpu-1", "t4")
