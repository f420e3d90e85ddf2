"""The audit's findings told once each: a Warning Event on the pod and a JSON log line.

An audit runs every interval and finds the same uncapped process every time; its pod gets one
Event per reason (``GpuMemoryUncapped``, ``GpuMemoryOverShare``), not one per round, and the
log one line. What was told is remembered in memory, per pod UID and reason (per GPU and PID
for processes in no pod), and forgotten once the pod or process is gone, so the memory is
bounded by what runs on the node; an agent that restarts tells each finding once more. An
Event the API refused is not remembered, so the next round tries again.
"""

from __future__ import annotations

import logging

from webhook.node.errors import PodApiError
from webhook.node.events import emit
from webhook.node.gpu_audit import OVER_SHARE, UNATTRIBUTED, UNCAPPED, AuditReport, Finding
from webhook.node.pod_api import PodApi
from webhook.node.pod_limits import MIB

EVENT_REASONS = {UNCAPPED: "GpuMemoryUncapped", OVER_SHARE: "GpuMemoryOverShare"}
LOG_EVENTS = {
    UNCAPPED: "gpu_process_uncapped",
    OVER_SHARE: "gpu_process_over_share",
    UNATTRIBUTED: "gpu_process_unattributed",
}

Key = tuple[str, str]


class FindingReporter:
    """Tells each finding once, through ``pods`` (Events) and the event log."""

    def __init__(self, pods: PodApi) -> None:
        self.pods = pods
        self._told: set[Key] = set()

    @property
    def told(self) -> frozenset[Key]:
        return frozenset(self._told)

    def report(self, report: AuditReport) -> None:
        """Tell what is new in ``report``; forget what no longer runs."""
        current: set[Key] = set()
        for finding in report.findings:
            key = finding_key(finding)
            if key in current:
                continue  # another process of the same pod: told (or tried) already
            current.add(key)
            if key not in self._told and self._tell(finding):
                self._told.add(key)
        self._told &= current

    def _tell(self, finding: Finding) -> bool:
        item = finding.audited
        pod = item.pod
        used = item.process.used_bytes
        emit(
            LOG_EVENTS[finding.kind],
            finding.message,
            level=logging.WARNING,
            finding=finding.kind,
            namespace=pod.namespace if pod else None,
            pod=pod.name if pod else None,
            container=item.container,
            gpu=item.gpu.index,
            gpu_uuid=item.gpu.uuid,
            pid=item.process.pid,
            used_mib=None if used is None else used // MIB,
        )
        reason = EVENT_REASONS.get(finding.kind)
        if pod is None or reason is None:
            return True
        try:
            self.pods.warn(pod, reason, finding.message)
        except PodApiError as exc:
            emit("event_failed", f"{exc} Will retry at the next round.", level=logging.WARNING)
            return False
        return True


def finding_key(finding: Finding) -> Key:
    """One Event per pod and reason; one log line per process in no pod."""
    item = finding.audited
    if item.pod is not None:
        return item.pod.uid, finding.kind
    return f"gpu{item.gpu.index}/pid{item.process.pid}", finding.kind
