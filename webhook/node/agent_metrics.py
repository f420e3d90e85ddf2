"""The node agent's Prometheus metrics, in a registry of its own (tests run several agents in
one process), served on /metrics by ``status_server.StatusServer``.

Per container and GPU, the memory its processes use (``gpushare_node_gpu_process_memory_bytes``,
processes in no pod under empty namespace, pod and container labels); per node, how many
processes each audit finding counts, and the driver-limit verdict the node's label carries.
The per-container series are replaced every round, so a container that stopped leaves no
stale series behind.
"""

from __future__ import annotations

import time
from collections import defaultdict

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from webhook.node.gpu_audit import OVER_SHARE, UNATTRIBUTED, UNCAPPED, AuditReport


class NodeAgentMetrics:
    """The metrics and how a round's results set them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.process_memory = Gauge(
            "gpushare_node_gpu_process_memory_bytes",
            "GPU memory used by a container's processes on one GPU (NVML), in bytes.",
            ["namespace", "pod", "container", "gpu"],
            registry=self.registry,
        )
        self.processes = Gauge(
            "gpushare_node_gpu_processes",
            "Processes with a context on this node's GPUs.",
            registry=self.registry,
        )
        self.uncapped = Gauge(
            "gpushare_node_gpu_processes_uncapped",
            "Processes of pods with a GPU share that no enforced limit holds.",
            registry=self.registry,
        )
        self.over_share = Gauge(
            "gpushare_node_gpu_processes_over_share",
            "Processes whose container uses more GPU memory than its limit or share.",
            registry=self.registry,
        )
        self.unattributed = Gauge(
            "gpushare_node_gpu_processes_unattributed",
            "Processes on a shared GPU that belong to no pod of this node.",
            registry=self.registry,
        )
        self.enforced = Gauge(
            "gpushare_node_driver_memory_limit_enforced",
            "1 while the node enforces the driver memory limit (its label says true).",
            registry=self.registry,
        )
        self.audit_ok = Gauge(
            "gpushare_node_audit_last_success_timestamp_seconds",
            "Unix time of the last round whose audit saw every GPU and the node's pods.",
            registry=self.registry,
        )
        self.audit_failures = Counter(
            "gpushare_node_audit_failures",
            "Rounds whose audit could not run (NVML or the pod list failed).",
            registry=self.registry,
        )

    def observe_verdict(self, enforced: bool) -> None:
        self.enforced.set(1 if enforced else 0)

    def observe_audit(self, report: AuditReport, now: float | None = None) -> None:
        """Replace the per-container series and set the counts from ``report``."""
        usage: dict[tuple[str, str, str, str], int] = defaultdict(int)
        for item in report.processes:
            pod = item.pod
            key = (
                pod.namespace if pod else "",
                pod.name if pod else "",
                item.container or "",
                str(item.gpu.index),
            )
            usage[key] += item.process.used_bytes or 0
        self.process_memory.clear()
        for labels, used in usage.items():
            self.process_memory.labels(*labels).set(used)
        self.processes.set(len(report.processes))
        self.uncapped.set(report.count(UNCAPPED))
        self.over_share.set(report.count(OVER_SHARE))
        self.unattributed.set(report.count(UNATTRIBUTED))
        self.audit_ok.set(time.time() if now is None else now)

    def render(self) -> bytes:
        return generate_latest(self.registry)
