"""Keeps ``gpushare.io/milligpu`` on every GPU node: 1000 for each GPU GFD counts on it.

A policy with ``quota.shareResource`` puts the extended resource ``gpushare.io/milligpu`` (a
thousandth of one GPU) on every pod it admits, so that a ResourceQuota counts GPU share. The
scheduler places a pod asking for an extended resource only on a node whose
``status.allocatable`` has enough of it, so each GPU node must advertise it: here, capacity
and allocatable both 1000 per GPU of ``nvidia.com/gpu.count`` (GFD's label: physical GPUs).
Both, because the kubelet derives allocatable from capacity only on a real node; on a real
node it rewrites allocatable from capacity anyway, and it keeps extended resources it does not
manage (https://kubernetes.io/docs/tasks/administer-cluster/extended-resource-node/).

A node without the label, or with a value that is not a whole number from 1 to
``MAX_GPUS_PER_NODE``, advertises none: if it did before, the resource is removed (a JSON
merge patch with null). Nothing else on the node is touched: every write is a merge patch of
this one key of ``status.capacity`` and ``status.allocatable``, made only when the value
differs (quantities compared as numbers: the apiserver stores ``2000`` as ``2k``).

The pure part (``gpu_count``, ``desired_share_capacity``, ``capacity_patch``) decides;
``ShareCapacity`` applies it through the small ``NodeApi`` (``KubeNodeApi`` in the cluster, a
fake in the unit tests); ``run`` keeps it current: a full pass (list, every node), then a watch
from the list's resourceVersion, reopened from the last version seen when the server ends it,
reconnected with a doubling back-off after errors, relisted when the version has expired
(410 Gone), and a full pass again every ``resync_s`` so a value someone reset is put back even
if no event says so. RBAC (deploy/share-capacity): nodes get/list/watch, nodes/status patch.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from kubernetes.utils import parse_quantity

from webhook.constants import GFD_COUNT_LABEL, MILLI_GPUS_PER_GPU, SHARE_RESOURCE
from webhook.json_logging import json_handler

LOGGER_NAME = "gpushare.quota"
log = logging.getLogger(LOGGER_NAME)

# The most GPUs one node may claim: a label over this is a mistake, not a node.
MAX_GPUS_PER_NODE = 1024
# Back-off between failed lists or watches: doubling from the first to the last.
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
# A watch the server ends sooner than this with nothing in it counts as a failure (no spin).
MIN_WATCH_S = 1.0
_WHOLE_NUMBER = re.compile(r"[0-9]{1,9}")


# -- the decision: pure --------------------------------------------------------------------


def gpu_count(labels: Mapping[str, str] | None) -> tuple[int | None, str]:
    """The node's GPU count from GFD's ``nvidia.com/gpu.count`` label; or None and why not."""
    value = (labels or {}).get(GFD_COUNT_LABEL)
    if value is None:
        return None, f"no {GFD_COUNT_LABEL} label"
    shown = f"{GFD_COUNT_LABEL}={value[:40]!r}"
    if not _WHOLE_NUMBER.fullmatch(value):
        return None, f"{shown} is not a whole number of GPUs"
    count = int(value)
    if count == 0:
        return None, f"{shown}: no GPUs"
    if count > MAX_GPUS_PER_NODE:
        return None, f"{shown} is over the bound of {MAX_GPUS_PER_NODE} GPUs a node"
    return count, ""


def desired_share_capacity(labels: Mapping[str, str] | None) -> int | None:
    """The ``gpushare.io/milligpu`` a node with ``labels`` advertises (None: none)."""
    count, _ = gpu_count(labels)
    return None if count is None else count * MILLI_GPUS_PER_GPU


@dataclass(frozen=True)
class NodeShare:
    """What the controller reads of a Node: its labels and its ``gpushare.io/milligpu`` in
    ``status.capacity`` and ``status.allocatable`` (None: absent), as stored."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    capacity: str | None = None
    allocatable: str | None = None


def _is(value: str | None, desired: int) -> bool:
    if value is None:
        return False
    try:
        return bool(parse_quantity(value) == desired)  # type: ignore[no-untyped-call]
    except ValueError:
        return False


def capacity_patch(node: NodeShare, desired: int | None) -> dict[str, Any] | None:
    """The JSON merge patch of the node's status that makes its share resource ``desired``
    (None: absent); None when it already is."""
    if desired is None:
        if node.capacity is None and node.allocatable is None:
            return None
        value: str | None = None
    else:
        if _is(node.capacity, desired) and _is(node.allocatable, desired):
            return None
        value = str(desired)
    return {"status": {"capacity": {SHARE_RESOURCE: value}, "allocatable": {SHARE_RESOURCE: value}}}


# -- the API it goes through ------------------------------------------------------------------


class NodeApiError(Exception):
    """A call to the Kubernetes API failed; ``status`` is the HTTP status where the apiserver
    answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class WatchExpiredError(NodeApiError):
    """The watch's resourceVersion is too old (410 Gone): list again."""


@dataclass(frozen=True)
class NodeEvent:
    """One watch event: ADDED, MODIFIED, DELETED (with the node) or BOOKMARK (without)."""

    kind: str
    node: NodeShare | None
    resource_version: str


class NodeApi(Protocol):
    """The three calls the controller makes (``KubeNodeApi``: CoreV1Api and watch.Watch)."""

    def list_nodes(self) -> tuple[list[NodeShare], str]:
        """Every node, and the list's resourceVersion."""
        ...

    def watch_nodes(self, resource_version: str, timeout_s: int) -> Iterator[NodeEvent]:
        """Node events after ``resource_version`` until the server ends the watch after
        ``timeout_s``; raises WatchExpiredError (410) or NodeApiError."""
        ...

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> None:
        """A JSON merge patch of the node's status subresource."""
        ...


# -- applying it --------------------------------------------------------------------------------


@dataclass
class PassResult:
    """What a pass did; ``errors`` has one line per failed call."""

    advertised: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, other: PassResult) -> None:
        self.advertised += other.advertised
        self.removed += other.removed
        self.unchanged += other.unchanged
        self.skipped += other.skipped
        self.errors += other.errors

    def summary(self) -> str:
        return (
            f"{len(self.advertised)} advertised, {len(self.removed)} removed, "
            f"{self.unchanged} unchanged, {self.skipped} without GPUs to advertise, "
            f"{len(self.errors)} errors"
        )


@dataclass
class ShareCapacity:
    """Makes each node's share resource what its labels say, through ``api``."""

    api: NodeApi
    # Why each node advertises nothing, as last logged: each reason is logged once a node.
    _skipped: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    def reconcile(self, node: NodeShare) -> PassResult:
        result = PassResult()
        count, reason = gpu_count(node.labels)
        desired = None if count is None else count * MILLI_GPUS_PER_GPU
        if desired is None:
            result.skipped += 1
            self._log_skip(node, reason, labelled=GFD_COUNT_LABEL in node.labels)
        else:
            self._skipped.pop(node.name, None)
        patch = capacity_patch(node, desired)
        if patch is None:
            if desired is not None:
                result.unchanged += 1
            return result
        try:
            self.api.patch_node_status(node.name, patch)
        except NodeApiError as exc:
            if exc.status != 404:  # a node deleted meanwhile needs nothing
                result.errors.append(f"node {node.name}: {exc}")
            return result
        if desired is None:
            result.removed.append(node.name)
            log.info(
                "node %s: %s removed (%s)",
                node.name,
                SHARE_RESOURCE,
                reason,
                extra={"node": node.name, "milligpu": None},
            )
        else:
            result.advertised.append(f"{node.name}={desired}")
            log.info(
                "node %s: %s set to %d (%d GPUs; was %s)",
                node.name,
                SHARE_RESOURCE,
                desired,
                count,
                node.capacity or "absent",
                extra={"node": node.name, "milligpu": desired},
            )
        return result

    def _log_skip(self, node: NodeShare, reason: str, *, labelled: bool) -> None:
        if self._skipped.get(node.name) == reason:
            return
        self._skipped[node.name] = reason
        # A node that is no GPU node at all is the common case; a bad value is a problem.
        level = logging.WARNING if labelled else logging.DEBUG
        log.log(level, "node %s: no %s advertised: %s", node.name, SHARE_RESOURCE, reason)

    def forget(self, name: str) -> None:
        """The node is gone."""
        self._skipped.pop(name, None)

    def resync(self) -> tuple[str | None, PassResult]:
        """A pass over every node: the list's resourceVersion (None: the list failed)."""
        result = PassResult()
        try:
            nodes, version = self.api.list_nodes()
        except NodeApiError as exc:
            result.errors.append(f"list nodes: {exc}")
            return None, result
        for node in nodes:
            result.add(self.reconcile(node))
        for name in set(self._skipped) - {node.name for node in nodes}:
            self.forget(name)
        return version, result


def report(what: str, result: PassResult, *, summary: bool = True) -> None:
    """Log the errors of a pass, and with ``summary`` what it did, when it did anything."""
    for line in result.errors:
        log.warning("share capacity: %s", line)
    if summary and (result.advertised or result.removed or result.errors):
        log.info("share capacity: %s: %s", what, result.summary())


def configure_logging(stream: IO[str] | None = None, level: int = logging.INFO) -> None:
    """The controller's log to ``stream`` (stderr by default), one JSON object a line."""
    log.handlers[:] = [json_handler(stream)]
    log.setLevel(level)
    log.propagate = False


# -- keeping it current ----------------------------------------------------------------------


@dataclass
class _Loop:
    controller: ShareCapacity
    stop: threading.Event
    resync_s: float
    watch_s: int
    clock: Callable[[], float]
    wait: Callable[[float], object]
    backoff: float = FIRST_BACKOFF_S
    version: str | None = None  # None: list before watching
    next_resync: float = 0.0

    def pause(self) -> None:
        self.wait(self.backoff)
        self.backoff = min(self.backoff * 2, MAX_BACKOFF_S)

    def full_pass(self) -> bool:
        version, result = self.controller.resync()
        report("full pass", result)
        if version is None:
            return False
        self.version = version
        # Calls that failed are tried again at the next event, or at a resync coming sooner.
        soon = self.backoff if result.errors else self.resync_s
        self.next_resync = self.clock() + min(self.resync_s, soon)
        return True

    def follow(self) -> bool:
        """Reconcile what one watch brings; False when it ended too soon with nothing."""
        assert self.version is not None
        started = self.clock()
        timeout = max(1, min(self.watch_s, math.ceil(self.next_resync - started)))
        events = 0
        for event in self.controller.api.watch_nodes(self.version, timeout):
            events += 1
            if event.resource_version:
                self.version = event.resource_version
            if event.node is not None and event.kind in ("ADDED", "MODIFIED"):
                result = self.controller.reconcile(event.node)
                report(f"node {event.node.name}", result, summary=False)
                if result.errors:  # tried again at its next event or a resync, soon
                    self.next_resync = min(self.next_resync, self.clock() + MAX_BACKOFF_S)
            elif event.node is not None and event.kind == "DELETED":
                self.controller.forget(event.node.name)
            if self.stop.is_set() or self.clock() >= self.next_resync:
                break
        return events > 0 or self.clock() - started >= MIN_WATCH_S

    def step(self) -> None:
        stale = self.version is None or self.clock() >= self.next_resync
        if stale and not self.full_pass():
            self.pause()
            return
        try:
            lasted = self.follow()
        except WatchExpiredError as exc:
            log.info("share capacity: watch expired (%s); listing again", exc)
            self.version = None
            return
        except NodeApiError as exc:
            log.warning("share capacity: %s; again in %gs", exc, self.backoff)
            self.pause()
            return
        if lasted:
            self.backoff = FIRST_BACKOFF_S
        elif not self.stop.is_set():
            self.pause()


def run(
    controller: ShareCapacity,
    stop: threading.Event,
    *,
    resync_s: float = 300.0,
    watch_s: int = 30,
    clock: Callable[[], float] = time.monotonic,
    wait: Callable[[float], object] | None = None,
) -> None:
    """Keep every node's share resource current until ``stop`` is set: see the module
    docstring. ``clock`` and ``wait`` (default: ``stop.wait``) are for tests."""
    loop = _Loop(controller, stop, resync_s, watch_s, clock, wait or stop.wait)
    while not stop.is_set():
        loop.step()
