"""``gpushare share-capacity`` without a cluster: the decision, a pass, and the loop driven
through a fake ``NodeApi`` with a fake clock (no real sleeping; every run is bounded).

The fake keeps nodes as the apiserver would for this purpose: a merge patch of the status
sets or (null) removes the share resource, and stores 2000 the apiserver's way, as "2k".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client as k8s

from webhook.cli import main
from webhook.constants import GFD_COUNT_LABEL, SHARE_RESOURCE
from webhook.quota import (
    MAX_GPUS_PER_NODE,
    NodeApiError,
    NodeEvent,
    NodeShare,
    ShareCapacity,
    WatchExpiredError,
    capacity_patch,
    desired_share_capacity,
    gpu_count,
    run,
)
from webhook.quota.kube_nodes import node_share
from webhook.quota.share_capacity import FIRST_BACKOFF_S, MAX_BACKOFF_S


def gpu_labels(count: str) -> dict[str, str]:
    return {GFD_COUNT_LABEL: count, "kubernetes.io/hostname": "n"}


# -- the decision --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "milligpu"),
    [
        ("1", 1000),
        ("2", 2000),
        ("8", 8000),
        (str(MAX_GPUS_PER_NODE), MAX_GPUS_PER_NODE * 1000),
        (None, None),  # no label: no GPU node
        ("abc", None),
        ("-1", None),
        ("99999", None),  # over the bound
        (str(MAX_GPUS_PER_NODE + 1), None),
        ("0", None),
        ("2.0", None),
        (" 2", None),
        ("+2", None),
        ("", None),
        ("9" * 500, None),
    ],
)
def test_the_desired_share_comes_from_the_gpu_count_label(
    value: str | None, milligpu: int | None
) -> None:
    labels = {"kubernetes.io/os": "linux"} if value is None else gpu_labels(value)
    assert desired_share_capacity(labels) == milligpu


def test_no_labels_at_all_means_nothing_advertised() -> None:
    assert desired_share_capacity(None) is None
    assert desired_share_capacity({}) is None


@pytest.mark.parametrize(
    ("labels", "reason"),
    [
        ({}, "no nvidia.com/gpu.count label"),
        (gpu_labels("abc"), "nvidia.com/gpu.count='abc' is not a whole number of GPUs"),
        (gpu_labels("-1"), "nvidia.com/gpu.count='-1' is not a whole number of GPUs"),
        (gpu_labels("99999"), "nvidia.com/gpu.count='99999' is over the bound of 1024 GPUs"),
        (gpu_labels("0"), "nvidia.com/gpu.count='0': no GPUs"),
    ],
)
def test_why_a_node_advertises_nothing(labels: dict[str, str], reason: str) -> None:
    count, why = gpu_count(labels)
    assert count is None
    assert reason in why


def test_a_long_bad_value_is_cut_in_the_reason() -> None:
    _, why = gpu_count(gpu_labels("x" * 5000))
    assert len(why) < 120


def patch_of(value: str | None) -> dict[str, Any]:
    return {"status": {"capacity": {SHARE_RESOURCE: value}, "allocatable": {SHARE_RESOURCE: value}}}


@pytest.mark.parametrize(
    ("capacity", "allocatable", "desired", "patch"),
    [
        (None, None, 2000, patch_of("2000")),  # new GPU node
        ("2000", "2000", 2000, None),  # already right
        ("2k", "2k", 2000, None),  # as the apiserver stores it
        ("2000", None, 2000, patch_of("2000")),  # allocatable missing (no kubelet copied it)
        ("0", "0", 2000, patch_of("2000")),  # reset by someone
        ("2k", "2k", 4000, patch_of("4000")),  # relabelled
        ("bogus", "bogus", 2000, patch_of("2000")),  # not a quantity
        ("2k", "2k", None, patch_of(None)),  # label gone: removed
        (None, "2k", None, patch_of(None)),
        (None, None, None, None),  # never advertised, nothing to do
    ],
)
def test_a_patch_only_when_the_value_differs(
    capacity: str | None, allocatable: str | None, desired: int | None, patch: Any
) -> None:
    node = NodeShare("n", {}, capacity, allocatable)
    assert capacity_patch(node, desired) == patch


def test_a_v1_node_is_read_for_its_labels_and_share_resource() -> None:
    node = k8s.V1Node(
        metadata=k8s.V1ObjectMeta(name="gpu-1", labels=gpu_labels("2")),
        status=k8s.V1NodeStatus(
            capacity={"cpu": "16", SHARE_RESOURCE: "2k"}, allocatable={"cpu": "16"}
        ),
    )
    assert node_share(node) == NodeShare("gpu-1", gpu_labels("2"), "2k", None)
    bare = k8s.V1Node(metadata=k8s.V1ObjectMeta(name="cpu-1"))
    assert node_share(bare) == NodeShare("cpu-1", {}, None, None)


# -- a fake API and clock --------------------------------------------------------------------


def stored(value: str | None) -> str | None:
    """The apiserver's canonical form of a whole quantity (2000 -> 2k)."""
    if value is None or not value.isdigit() or int(value) % 1000 or value == "0":
        return value
    return f"{int(value) // 1000}k"


class FakeTime:
    """A clock that moves only when the loop waits or a fake watch runs its course."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        assert len(self.waits) < 200, "the loop keeps waiting: a runaway test"
        self.now += seconds
        return False


Script = list[NodeEvent] | Exception


class FakeNodeApi:
    """Nodes in memory; each watch plays the next script (events, or an error), then lasts
    its timeout on the fake clock; once the scripts are played, ``stop`` is set."""

    def __init__(self, nodes: list[NodeShare], time: FakeTime, stop: threading.Event) -> None:
        self.nodes = {node.name: node for node in nodes}
        self.time = time
        self.stop = stop
        self.version = 100
        self.event_version = 200
        self.patches: list[tuple[str, Mapping[str, Any]]] = []
        self.lists = 0
        self.list_errors: list[Exception] = []
        self.watches: list[Script] = []
        self.watched: list[tuple[str, int]] = []
        self.patch_errors: list[NodeApiError] = []

    def list_nodes(self) -> tuple[list[NodeShare], str]:
        self.lists += 1
        if self.list_errors:
            raise self.list_errors.pop(0)
        return list(self.nodes.values()), str(self.version)

    def watch_nodes(self, resource_version: str, timeout_s: int) -> Iterator[NodeEvent]:
        self.watched.append((resource_version, timeout_s))
        if not self.watches:
            self.stop.set()
            return
        script = self.watches.pop(0)
        if isinstance(script, Exception):
            raise script
        for event in script:
            if event.node is not None:
                self.nodes[event.node.name] = event.node
            yield event
        self.time.now += timeout_s

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> None:
        self.patches.append((name, patch))
        if self.patch_errors:
            raise self.patch_errors.pop(0)
        if name not in self.nodes:
            raise NodeApiError(f"node {name} not found", 404)
        status = patch["status"]
        self.nodes[name] = replace(
            self.nodes[name],
            capacity=stored(status["capacity"][SHARE_RESOURCE]),
            allocatable=stored(status["allocatable"][SHARE_RESOURCE]),
        )
        self.version += 1

    def event(self, kind: str, node: NodeShare) -> NodeEvent:
        self.event_version += 1
        return NodeEvent(kind, node, str(self.event_version))


@pytest.fixture
def time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def stop() -> threading.Event:
    return threading.Event()


def gpu_node(name: str, count: str | None, value: str | None = None) -> NodeShare:
    labels = {} if count is None else gpu_labels(count)
    return NodeShare(name, labels, value, value)


def run_fake(api: FakeNodeApi, stop: threading.Event, time: FakeTime, **kwargs: Any) -> None:
    run(ShareCapacity(api), stop, clock=time.clock, wait=time.wait, **kwargs)
    assert stop.is_set()


# -- a pass ----------------------------------------------------------------------------------


def test_a_pass_patches_only_the_nodes_that_differ(time: FakeTime, stop: threading.Event) -> None:
    api = FakeNodeApi(
        [
            gpu_node("new", "2"),
            gpu_node("right", "4", "4k"),
            gpu_node("reset", "1", "0"),
            gpu_node("cpu", None),
            gpu_node("bad", "abc"),
            gpu_node("was-gpu", None, "2k"),
        ],
        time,
        stop,
    )
    controller = ShareCapacity(api)
    version, result = controller.resync()
    assert version == "100"
    assert sorted(result.advertised) == ["new=2000", "reset=1000"]
    assert result.removed == ["was-gpu"]
    assert (result.unchanged, result.skipped, result.errors) == (1, 3, [])
    assert {name for name, _ in api.patches} == {"new", "reset", "was-gpu"}
    assert api.nodes["new"].capacity == api.nodes["new"].allocatable == "2k"
    assert api.nodes["was-gpu"].capacity is None
    api.patches.clear()
    _, again = controller.resync()
    assert api.patches == []
    assert (again.unchanged, again.skipped) == (3, 3)


def test_a_failed_patch_is_an_error_and_a_node_gone_is_not(
    time: FakeTime, stop: threading.Event
) -> None:
    api = FakeNodeApi([gpu_node("a", "2")], time, stop)

    def refuse(name: str, patch: Mapping[str, Any]) -> None:
        raise NodeApiError("HTTP 403: forbidden", 403)

    api.patch_node_status = refuse  # type: ignore[method-assign]
    result = ShareCapacity(api).reconcile(api.nodes["a"])
    assert result.errors == ["node a: HTTP 403: forbidden"]
    gone = ShareCapacity(FakeNodeApi([], time, stop)).reconcile(gpu_node("gone", "2"))
    assert gone.errors == [] and gone.advertised == []


def test_why_a_node_is_skipped_is_logged_once(
    time: FakeTime, stop: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    api = FakeNodeApi([gpu_node("bad", "abc"), gpu_node("cpu", None)], time, stop)
    controller = ShareCapacity(api)
    with caplog.at_level(logging.DEBUG, logger="gpushare.quota"):
        controller.resync()
        controller.resync()
        controller.reconcile(gpu_node("bad", "-1"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "node bad: no gpushare.io/milligpu advertised: nvidia.com/gpu.count='abc' is not a "
        "whole number of GPUs",
        "node bad: no gpushare.io/milligpu advertised: nvidia.com/gpu.count='-1' is not a "
        "whole number of GPUs",
    ]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert debug == ["node cpu: no gpushare.io/milligpu advertised: no nvidia.com/gpu.count label"]


# -- the loop --------------------------------------------------------------------------------


def test_watch_events_relabel_and_remove(time: FakeTime, stop: threading.Event) -> None:
    api = FakeNodeApi([gpu_node("a", "2")], time, stop)
    api.watches = [
        [api.event("MODIFIED", gpu_node("a", "4", "2k"))],
        [api.event("MODIFIED", gpu_node("a", None, "4k"))],
        [api.event("ADDED", gpu_node("b", "1")), api.event("DELETED", gpu_node("b", "1"))],
    ]
    run_fake(api, stop, time)
    assert [(name, p["status"]["capacity"][SHARE_RESOURCE]) for name, p in api.patches] == [
        ("a", "2000"),  # the first pass
        ("a", "4000"),  # relabelled to 4
        ("a", None),  # label gone: removed
        ("b", "1000"),
    ]
    assert api.nodes["a"].capacity is None and api.nodes["a"].allocatable is None
    assert api.lists == 1
    # Each watch goes on from the last resourceVersion seen: the list's, then the events'.
    assert [version for version, _ in api.watched] == ["100", "201", "202", "204"]


def test_a_resync_puts_back_a_value_reset_without_an_event(
    time: FakeTime, stop: threading.Event
) -> None:
    api = FakeNodeApi([gpu_node("a", "2")], time, stop)

    class Reset(list[NodeEvent]):
        """An empty watch during which someone resets the node's status, unseen."""

        def __iter__(self) -> Iterator[NodeEvent]:
            api.nodes["a"] = gpu_node("a", "2", "0")
            return iter(())

    api.watches = [Reset(), [], [], []]
    run_fake(api, stop, time, resync_s=60.0, watch_s=30)
    assert api.lists >= 2
    assert [p["status"]["capacity"][SHARE_RESOURCE] for _, p in api.patches] == ["2000", "2000"]
    assert api.nodes["a"].capacity == "2k"
    # The watches are cut to end at the resync, never later.
    assert {timeout for _, timeout in api.watched} <= {30}
    assert time.waits == []  # nothing failed: no back-off


def test_a_patch_failed_on_an_event_is_retried_by_a_resync_soon(
    time: FakeTime, stop: threading.Event
) -> None:
    api = FakeNodeApi([gpu_node("a", "2", "2k")], time, stop)
    api.watches = [[api.event("MODIFIED", gpu_node("a", "4", "2k"))], [], [], []]
    api.patch_errors = [NodeApiError("HTTP 500: etcd timeout", 500)]
    run_fake(api, stop, time, resync_s=3600.0, watch_s=30)
    assert [p["status"]["capacity"][SHARE_RESOURCE] for _, p in api.patches] == ["4000"] * 2
    assert api.nodes["a"].capacity == "4k"
    assert api.lists == 2  # the second, a minute after the failure rather than an hour


def test_a_watch_ends_at_the_next_resync(time: FakeTime, stop: threading.Event) -> None:
    api = FakeNodeApi([gpu_node("a", "2")], time, stop)
    api.watches = [[], []]
    run_fake(api, stop, time, resync_s=45.0, watch_s=30)
    assert [timeout for _, timeout in api.watched][:2] == [30, 15]


def test_a_watch_reconnects_after_errors_with_a_bounded_back_off(
    time: FakeTime, stop: threading.Event
) -> None:
    api = FakeNodeApi([gpu_node("a", "2")], time, stop)
    broken = NodeApiError("watch nodes: ProtocolError: connection reset")
    api.watches = [broken] * 9 + [[api.event("MODIFIED", gpu_node("a", "3", "2k"))], broken]
    run_fake(api, stop, time, resync_s=3600.0)
    doubling = [FIRST_BACKOFF_S * 2**i for i in range(9)]
    assert time.waits == [min(w, MAX_BACKOFF_S) for w in doubling] + [FIRST_BACKOFF_S]
    assert max(time.waits) == MAX_BACKOFF_S
    assert api.lists == 1  # reconnected from the last version, not listed again
    assert {version for version, _ in api.watched[:10]} == {"100"}
    assert api.nodes["a"].capacity == "3k"


def test_an_expired_watch_lists_again(time: FakeTime, stop: threading.Event) -> None:
    api = FakeNodeApi([gpu_node("a", "2")], time, stop)
    api.watches = [WatchExpiredError("watch nodes: HTTP 410: Gone", 410), []]
    run_fake(api, stop, time)
    assert api.lists == 2
    assert time.waits == []


def test_a_failed_list_is_retried_with_back_off(time: FakeTime, stop: threading.Event) -> None:
    api = FakeNodeApi([gpu_node("a", "2")], time, stop)
    api.list_errors = [NodeApiError("list nodes: HTTP 500: boom")] * 3
    run_fake(api, stop, time)
    assert time.waits == [1.0, 2.0, 4.0]
    assert api.lists == 4
    assert api.nodes["a"].capacity == "2k"


def test_a_watch_that_ends_at_once_with_nothing_backs_off(
    time: FakeTime, stop: threading.Event
) -> None:
    api = FakeNodeApi([gpu_node("a", "2")], time, stop)

    class Instant(list[NodeEvent]):
        """A server that ends every watch at once: no fake time passes."""

    api.watches = [Instant(), Instant(), Instant()]
    original = api.watch_nodes

    def no_time(resource_version: str, timeout_s: int) -> Iterator[NodeEvent]:
        before = time.now
        yield from original(resource_version, timeout_s)
        time.now = before

    api.watch_nodes = no_time  # type: ignore[method-assign]
    run_fake(api, stop, time)
    assert time.waits == [1.0, 2.0, 4.0]


def test_the_loop_stops_when_asked(time: FakeTime, stop: threading.Event) -> None:
    api = FakeNodeApi([gpu_node("a", "2")], time, stop)
    stop.set()
    run(ShareCapacity(api), stop, clock=time.clock, wait=time.wait)
    assert api.lists == 0


# -- the command -----------------------------------------------------------------------------


def test_the_command_refuses_a_resync_that_is_not_positive(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["share-capacity", "--kubeconfig", "/nonexistent", "--resync", "0"])
    assert exit_info.value.code == 2
    assert "--resync 0: give a positive number of seconds" in capsys.readouterr().err


def test_the_command_names_a_kubeconfig_it_cannot_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["share-capacity", "--once", "--kubeconfig", "/nonexistent/config"]) == 2
    assert "cannot configure a Kubernetes client from /nonexistent/config" in (
        capsys.readouterr().err
    )
