"""The plan's word on the driver memory limit: per pool of a policy that writes it, how many
of the nodes its nodeSelector picks the node agent labelled
``gpushare.io/driver-memory-limit=true``, and the findings ``gpushare policy check --nodes``
prints (no such node under ``require``: its pods stay Pending; under ``auto``/``inject``:
they run uncapped there). Both come from the core (``pool_coverage``,
``enforcing_node_findings``): in the table as lines below the details, in ``-o json`` as
``enforcingNodes``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook.constants import DRIVER_LIMIT_LABEL
from webhook.core import (
    PolicySet,
    PoolCoverage,
    enforcing_node_findings,
    finding_lines,
    pool_coverage,
)


def _summary(item: PoolCoverage) -> str:
    setting = item.policy.enforcement.driver_memory_limit.value
    return (
        f"  {item.policy.name}/{item.pool.name} (driverMemoryLimit: {setting}): "
        f"{len(item.enforcing)} of {len(item.matching)} node(s) enforce it"
    )


def enforcement_lines(policies: PolicySet, nodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """The table's section: one line per pool, then the findings; none where no policy
    writes the driver limit."""
    nodes = list(nodes)
    coverage = pool_coverage(policies, nodes)
    if not coverage:
        return []
    findings = enforcing_node_findings(policies, nodes)
    return [
        f"enforcing nodes ({DRIVER_LIMIT_LABEL}=true):",
        *(_summary(item) for item in coverage),
        *(f"  {line}" for line in finding_lines(findings, ())),
    ]


def enforcement_json(
    policies: PolicySet, nodes: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``enforcingNodes`` of ``-o json``: per pool, its nodes, the enforcing ones, and the
    finding about it (severity and message), if any."""
    nodes = list(nodes)
    findings = {(f.policy.name, f.at): f for f in enforcing_node_findings(policies, nodes)}
    report = []
    for item in pool_coverage(policies, nodes):
        finding = findings.get((item.policy.name, ("spec", "pools", item.index)))
        report.append(
            {
                "policy": item.policy.name,
                "pool": item.pool.name,
                "driverMemoryLimit": item.policy.enforcement.driver_memory_limit.value,
                "nodes": [node.name for node in item.matching],
                "enforcingNodes": list(item.enforcing),
                **(
                    {"severity": finding.severity.value, "message": finding.message}
                    if finding is not None
                    else {}
                ),
            }
        )
    return report
