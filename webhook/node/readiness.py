"""What the node tells the cluster about its MPS daemon: the ready label and annotations.

The ready label (the policy's ``mpsDaemon.readyLabel``) is on the Node only while the daemon
serves with its defaults applied; pods that need the daemon select on it. Next to it, the
annotations (``node_annotations``) say what the node serves: pool, GPU count and memory,
compute mode, limits. ``NodeReadiness`` writes both through ``NodeApi`` as the supervisor's
verdict changes, remembers whether the last write landed (a failed write is retried at the
next check), and takes everything off on shutdown.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from webhook.constants import ANNOTATION_PREFIX
from webhook.node.errors import NodeApiError
from webhook.node.events import emit
from webhook.node.mps_control import MpsDefaults
from webhook.node.node_api import NodeApi
from webhook.node.nvml import ComputeMode, GpuDevice
from webhook.node.status_server import LauncherMetrics


def node_annotations(
    pool_name: str, gpus: Sequence[GpuDevice], defaults: MpsDefaults, exclusive: bool
) -> dict[str, str]:
    """What the node advertises next to the ready label."""
    annotations = {
        f"{ANNOTATION_PREFIX}mps-pool": pool_name,
        f"{ANNOTATION_PREFIX}mps-gpus": str(len(gpus)),
        f"{ANNOTATION_PREFIX}mps-gpu-memory-mib": str(min(g.memory_mib for g in gpus)),
        f"{ANNOTATION_PREFIX}mps-compute-mode": (
            ComputeMode.EXCLUSIVE_PROCESS.name if exclusive else "DEFAULT (degraded)"
        ),
    }
    if defaults.active_thread_percentage is not None:
        annotations[f"{ANNOTATION_PREFIX}mps-active-thread-percentage"] = str(
            defaults.active_thread_percentage
        )
    if defaults.pinned_memory_mib:
        annotations[f"{ANNOTATION_PREFIX}mps-pinned-memory-mib"] = str(
            min(defaults.pinned_memory_mib.values())
        )
    return annotations


@dataclass(frozen=True)
class ReadinessState:
    """The supervisor's verdict and whether the Node shows it."""

    ready: bool
    # True/False: the label is on/off the Node; None: unknown (never written, or write failed).
    published: bool | None
    reason: str


class NodeReadiness:
    """The ready label and MPS annotations of one Node, kept in line with ``set``."""

    def __init__(self, node: NodeApi, ready_label: str, metrics: LauncherMetrics) -> None:
        self.node = node
        self.ready_label = ready_label
        self.metrics = metrics
        self.annotations: dict[str, str] = {}
        self._published: bool | None = None
        self._ready = False
        self._reason = "starting"
        self._lock = threading.Lock()

    def state(self) -> ReadinessState:
        """A consistent snapshot, for the probes (called from the HTTP server's threads)."""
        with self._lock:
            return ReadinessState(self._ready, self._published, self._reason)

    def set(self, ready: bool, reason: str) -> None:
        """Record the verdict and publish it unless the Node already shows it.

        A failed patch is logged and leaves the published state unknown, so the next
        ``set`` writes again.
        """
        with self._lock:
            self._ready = ready
            self._reason = reason
        if self._published is ready:
            return
        try:
            if ready:
                self.node.patch_metadata(
                    labels={self.ready_label: "true"}, annotations=self.annotations
                )
            else:
                self.node.patch_metadata(labels={self.ready_label: None})
        except NodeApiError as exc:
            with self._lock:
                self._published = None
            self.metrics.node_ready.set(0)
            emit(
                "node_patch_failed",
                f"{exc} Will retry at the next check.",
                level=logging.WARNING,
                want_ready=ready,
            )
            return
        with self._lock:
            self._published = ready
        self.metrics.node_ready.set(1 if ready else 0)
        self._announce(ready, reason)

    def _announce(self, ready: bool, reason: str) -> None:
        name = self.node.node_name
        if ready:
            emit("node_ready", f"Node {name} labelled {self.ready_label}=true.", node=name)
        else:
            emit(
                "node_not_ready",
                f"Label {self.ready_label} removed from node {name}: {reason}.",
                node=name,
                reason=reason,
            )

    def withdraw(self) -> bool:
        """Take the label and every MPS annotation off; False if the Node refused."""
        removals: dict[str, str | None] = dict.fromkeys(self.annotations)
        try:
            self.node.patch_metadata(labels={self.ready_label: None}, annotations=removals)
        except NodeApiError as exc:
            emit(
                "node_patch_failed",
                f"{exc} The node may still advertise MPS: remove the label "
                f"{self.ready_label} by hand.",
                level=logging.ERROR,
                want_ready=False,
            )
            return False
        with self._lock:
            self._published = False
            self._ready = False
            self._reason = "stopping"
        self.metrics.node_ready.set(0)
        emit(
            "node_not_ready",
            f"Label {self.ready_label} and MPS annotations removed from node "
            f"{self.node.node_name}: shutting down.",
            node=self.node.node_name,
            reason="shutdown",
        )
        return True
