"""The node agent (``gpushare node-agent``): one per GPU node, every interval and at start,

1. reads what the node offers the driver memory limit (``driver_limit_facts``), judges it
   (``driver_limit_verdict``) and keeps the node's ``gpushare.io/driver-memory-limit`` label
   and its annotations current, writing only changes;
2. audits every process on the GPUs (``gpu_audit``: NVML's processes, their cgroups, the
   node's pods), exports the result as metrics (``agent_metrics``) and tells each finding
   once (``finding_events``).

A round never stops the agent: what cannot be read becomes a fact ("NVML failed ..."), a
failed write is retried next round. On SIGTERM the label goes to "false" (fail closed).
``run_once`` reads and judges without writing anything, for ``--once``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from webhook.constants import GFD_REPLICAS_LABEL, GFD_STRATEGY_LABEL, MPS_READY_LABEL
from webhook.errors import GpushareError
from webhook.node.agent_metrics import NodeAgentMetrics
from webhook.node.cdi_specs import DEFAULT_CDI_DIRS, CdiSpec
from webhook.node.driver_limit_facts import NodeFacts, read_facts
from webhook.node.driver_limit_verdict import DriverLimitLabel, Verdict, verdict
from webhook.node.errors import NodeApiError
from webhook.node.events import emit
from webhook.node.finding_events import FindingReporter
from webhook.node.gpu_audit import AuditedProcess, AuditReport, audit
from webhook.node.node_api import NodeApi
from webhook.node.nvml import GpuProcess, Nvml
from webhook.node.pod_api import PodApi
from webhook.node.pod_limits import MIB
from webhook.node.process_cgroups import DEFAULT_PROC_ROOT, ProcessOwner, read_owner
from webhook.node.status_server import Health, loop_alive

DEFAULT_INTERVAL_S = 60.0
DEFAULT_AGENT_LISTEN = "0.0.0.0:9401"


@dataclass(frozen=True)
class AgentPaths:
    """Where the agent reads the node: /sys/fs/cgroup under ``host_root``, the processes'
    cgroups under ``proc_root``, the CDI specs in ``cdi_dirs``."""

    host_root: Path = Path("/")
    proc_root: Path = DEFAULT_PROC_ROOT
    cdi_dirs: tuple[Path, ...] = DEFAULT_CDI_DIRS


@dataclass(frozen=True)
class RoundResult:
    """One round: the facts and verdict, and the audit or why it could not run."""

    facts: NodeFacts
    verdict: Verdict
    report: AuditReport | None
    audit_error: str | None

    def as_json(self, node_name: str) -> dict[str, Any]:
        """What ``--once`` prints."""
        return {
            "node": node_name,
            "driverMemoryLimit": {
                "enforced": self.verdict.enforced,
                "reason": self.verdict.reason,
                "facts": dict(self.verdict.facts),
                "cdiSpecs": [_spec_json(spec) for spec in self.facts.specs],
            },
            "processes": [_process_json(p) for p in (self.report.processes if self.report else ())],
            "findings": [
                {"kind": f.kind, **_process_json(f.audited), "message": f.message}
                for f in (self.report.findings if self.report else ())
            ],
            "auditError": self.audit_error,
        }


def _spec_json(spec: CdiSpec) -> dict[str, Any]:
    return {
        "path": str(spec.path),
        "kind": spec.kind,
        "devices": spec.devices,
        "hookGpus": sorted(spec.hook_gpu_ids),
        "error": spec.error,
    }


def _process_json(item: AuditedProcess) -> dict[str, Any]:
    used = item.process.used_bytes
    return {
        "gpu": item.gpu.index,
        "gpuUuid": item.gpu.uuid,
        "pid": item.process.pid,
        "usedMiB": None if used is None else used // MIB,
        "mpsClient": item.process.mps_client,
        "namespace": item.pod.namespace if item.pod else None,
        "pod": item.pod.name if item.pod else None,
        "container": item.container,
    }


class NodeAgent:
    """The rounds of one node's agent."""

    def __init__(
        self,
        *,
        nvml: Nvml,
        node: NodeApi,
        pods: PodApi,
        paths: AgentPaths,
        metrics: NodeAgentMetrics,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self.nvml = nvml
        self.node = node
        self.pods = pods
        self.paths = paths
        self.metrics = metrics
        self.interval_s = interval_s
        self.label = DriverLimitLabel(node)
        self.reporter = FindingReporter(pods)
        self._nvml_up = False
        self._last_tick = time.monotonic()
        self._rounds = 0

    def health(self) -> Health:
        published = self.label.published
        return Health(
            alive=loop_alive(self._last_tick, self.interval_s),
            ready=published is not None,
            detail={
                "node": self.node.node_name,
                "rounds": self._rounds,
                "enforced": None if published is None else published.enforced,
                "reason": None if published is None else published.reason,
            },
        )

    def observe(self) -> RoundResult:
        """Read and judge the node, audit its GPUs; writes nothing."""
        if not self._nvml_up:
            self._nvml_up = _start(self.nvml)
        labels = self._labels()
        facts = read_facts(
            self.nvml, host_root=self.paths.host_root, cdi_dirs=self.paths.cdi_dirs, labels=labels
        )
        judged = verdict(facts)
        try:
            report = self._audit(facts, judged.enforced, labels or {})
        except GpushareError as exc:
            return RoundResult(facts, judged, None, str(exc))
        return RoundResult(facts, judged, report, None)

    def round(self) -> RoundResult:
        """One round: observe, then publish the label, the metrics and the findings."""
        result = self.observe()
        self.label.publish(result.verdict)
        self.metrics.observe_verdict(result.verdict.enforced)
        if result.report is not None:
            self.metrics.observe_audit(result.report)
            self.reporter.report(result.report)
        else:
            self.metrics.audit_failures.inc()
            emit("audit_failed", f"{result.audit_error} Will retry at the next round.",
                 level=logging.WARNING)  # fmt: skip
        self._rounds += 1
        self._last_tick = time.monotonic()
        return result

    def run(self, stop: threading.Event) -> int:
        """Rounds until ``stop``; then the label to "false". Exit code 1 if that failed."""
        while True:
            self.round()
            if stop.wait(self.interval_s):
                break
        return 0 if self.label.withdraw() else 1

    def _labels(self) -> Mapping[str, str] | None:
        try:
            return self.node.read_labels()
        except NodeApiError as exc:
            emit("node_read_failed", f"{exc} Will retry at the next round.", level=logging.WARNING)
            return None

    def _audit(self, facts: NodeFacts, enforced: bool, labels: Mapping[str, str]) -> AuditReport:
        if facts.gpu_error is not None:
            raise GpushareError(facts.gpu_error)
        processes: dict[int, list[GpuProcess]] = {
            gpu.index: self.nvml.processes(gpu.index) for gpu in facts.gpus
        }
        owners: dict[int, ProcessOwner | None] = {
            p.pid: read_owner(self.paths.proc_root, p.pid)
            for found in processes.values()
            for p in found
        }
        pods = self.pods.list_pods() if owners else []
        return audit(
            facts.gpus,
            processes,
            owners,
            pods,
            driver_limit_enforced=enforced,
            node_shares_gpus=shares_gpus(labels),
        )


def shares_gpus(labels: Mapping[str, str]) -> bool:
    """Whether the node's GPUs are shared: GFD's sharing labels, or the MPS daemon serving."""
    replicas = labels.get(GFD_REPLICAS_LABEL, "")
    strategy = labels.get(GFD_STRATEGY_LABEL, "none")
    return (
        (replicas.isdigit() and int(replicas) > 1)
        or strategy not in ("", "none")
        or labels.get(MPS_READY_LABEL) == "true"
    )


def _start(nvml: Nvml) -> bool:
    try:
        nvml.init()
    except GpushareError as exc:
        emit("nvml_unavailable", f"{exc} Will retry at the next round.", level=logging.WARNING)
        return False
    return True
