"""``gpushare share-capacity`` against the real kube-apiserver and kube-scheduler.

The controller runs in a thread of the test (its loop, ``webhook.quota.run``, on a client of
its own, with short resync and watch periods) or as the CLI in a subprocess under the
ServiceAccount of deploy/share-capacity (a token from the TokenRequest API, so the
ClusterRole is what is tested, not the admin's rights). It must give a node labelled
``nvidia.com/gpu.count=2`` capacity and allocatable ``gpushare.io/milligpu`` 2000, follow
relabelling, remove the resource when the label goes, put back a value someone reset (through
the resync even when no watch event shows it), and the real scheduler must then bind a plain
pod asking ``gpushare.io/milligpu: 500`` to the advertising node and leave one asking for
more than any node has left Pending. There is no kubelet: the node's status is what the
controller writes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import unique_name
from gpu_nodes import FakeGpuNode
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity
from pods import plain_pod

from harness.api import as_json, ensure_namespace
from harness.controlplane import ControlPlane
from webhook.constants import GFD_COUNT_LABEL, SHARE_RESOURCE
from webhook.quota import KubeNodeApi, NodeEvent, NodeShare, ShareCapacity, run

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy/share-capacity"
SYSTEM_NAMESPACE = "gpushare-system"
SERVICE_ACCOUNT = "gpushare-share-capacity"
# How long the controller may take to act on a change it is watching (it acts at once; the
# margin is for a loaded machine), and how often it resyncs in these tests.
CHANGE_TIMEOUT_S = 20.0
RESYNC_S = 3.0
SCHEDULE_TIMEOUT_S = 30.0
pytestmark = pytest.mark.timeout(180, func_only=True)


def wait_for(what: str, check: Callable[[], Any], timeout: float = CHANGE_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result is not None and result is not False:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def share(core_v1: k8s.CoreV1Api, name: str) -> tuple[int | None, int | None]:
    """The node's gpushare.io/milligpu in capacity and allocatable, as numbers."""
    status = as_json(core_v1.api_client, core_v1.read_node(name)).get("status") or {}

    def read(field: str) -> int | None:
        value = (status.get(field) or {}).get(SHARE_RESOURCE)
        return None if value is None else int(parse_quantity(value))

    return read("capacity"), read("allocatable")


def wait_for_share(core_v1: k8s.CoreV1Api, name: str, milligpu: int | None) -> None:
    wait_for(
        f"node {name} to advertise {SHARE_RESOURCE}={milligpu}",
        lambda: share(core_v1, name) == (milligpu, milligpu),
    )


def set_gpu_count(core_v1: k8s.CoreV1Api, name: str, count: str | None) -> None:
    core_v1.patch_node(name, {"metadata": {"labels": {GFD_COUNT_LABEL: count}}})


def reset_share(core_v1: k8s.CoreV1Api, name: str) -> None:
    """What a kubelet restarting, or someone by hand, might do: the share set to 0."""
    body = {"status": {"capacity": {SHARE_RESOURCE: "0"}, "allocatable": {SHARE_RESOURCE: "0"}}}
    core_v1.patch_node_status(name, body, _content_type="application/merge-patch+json")


@dataclass
class Controller:
    """The controller loop in a thread; ``stop`` ends it (the test waits for that)."""

    thread: threading.Thread
    stop: threading.Event


@pytest.fixture
def start_controller(control_plane: ControlPlane) -> Iterator[Callable[..., Controller]]:
    """Starts ``webhook.quota.run`` in a thread on a client of its own; stopped at the end."""
    running: list[tuple[Controller, k8s.ApiClient]] = []

    def start(wrap: Callable[[KubeNodeApi], Any] = lambda api: api) -> Controller:
        client = control_plane.api_client()
        stop = threading.Event()
        api = wrap(KubeNodeApi(client))
        thread = threading.Thread(
            target=run,
            args=(ShareCapacity(api), stop),
            kwargs={"resync_s": RESYNC_S, "watch_s": 5},
            daemon=True,
        )
        thread.start()
        controller = Controller(thread, stop)
        running.append((controller, client))
        return controller

    try:
        yield start
    finally:
        for controller, _ in running:
            controller.stop.set()
        for controller, client in running:
            # A watch ends within its 5 seconds; its read timeout is 15 more.
            controller.thread.join(timeout=25)
            assert not controller.thread.is_alive(), "the controller did not stop"
            client.close()  # type: ignore[no-untyped-call]


def test_a_gpu_node_gets_its_share_and_follows_its_label(
    start_controller: Callable[..., Controller],
    fake_nodes: Callable[[FakeGpuNode], k8s.V1Node],
    core_v1: k8s.CoreV1Api,
) -> None:
    gpu = unique_name("share-gpu")
    cpu = unique_name("share-cpu")
    fake_nodes(FakeGpuNode(gpu, gpus=2))
    fake_nodes(FakeGpuNode(cpu, extra_labels={GFD_COUNT_LABEL: "abc"}))
    start_controller()

    wait_for_share(core_v1, gpu, 2000)
    stored = as_json(core_v1.api_client, core_v1.read_node(gpu))["status"]
    assert parse_quantity(stored["capacity"][SHARE_RESOURCE]) == 2000  # stored as "2k"
    assert stored["capacity"]["nvidia.com/gpu.shared"] == "2"  # the rest untouched
    assert share(core_v1, cpu) == (None, None)

    set_gpu_count(core_v1, gpu, "4")
    wait_for_share(core_v1, gpu, 4000)

    set_gpu_count(core_v1, gpu, None)
    wait_for_share(core_v1, gpu, None)
    capacity = as_json(core_v1.api_client, core_v1.read_node(gpu))["status"]["capacity"]
    assert capacity["cpu"] == "16" and SHARE_RESOURCE not in capacity

    set_gpu_count(core_v1, gpu, "1")
    wait_for_share(core_v1, gpu, 1000)
    reset_share(core_v1, gpu)
    wait_for_share(core_v1, gpu, 1000)


class Blind:
    """The controller's API with the watch blind to one node: only a resync can see it."""

    def __init__(self, api: KubeNodeApi, node: str) -> None:
        self.api = api
        self.node = node

    def list_nodes(self) -> tuple[list[NodeShare], str]:
        return self.api.list_nodes()

    def watch_nodes(self, resource_version: str, timeout_s: int) -> Iterator[NodeEvent]:
        for event in self.api.watch_nodes(resource_version, timeout_s):
            if event.node is None or event.node.name != self.node:
                yield event

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> None:
        self.api.patch_node_status(name, patch)


def test_a_reset_share_is_put_back_by_the_resync(
    start_controller: Callable[..., Controller],
    fake_nodes: Callable[[FakeGpuNode], k8s.V1Node],
    core_v1: k8s.CoreV1Api,
) -> None:
    """The watch never shows this node: the reset is seen, and undone, by a full pass."""
    name = unique_name("share-resync")
    fake_nodes(FakeGpuNode(name, gpus=2))
    start_controller(lambda api: Blind(api, name))
    wait_for_share(core_v1, name, 2000)
    reset_share(core_v1, name)
    assert share(core_v1, name) == (0, 0)
    started = time.monotonic()
    wait_for_share(core_v1, name, 2000)
    assert time.monotonic() - started <= RESYNC_S + CHANGE_TIMEOUT_S


def scheduled_condition(core_v1: k8s.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    def condition() -> dict[str, Any] | None:
        pod = as_json(core_v1.api_client, core_v1.read_namespaced_pod(name, namespace))
        conditions = (pod.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "PodScheduled"), None)

    found: dict[str, Any] = wait_for(
        f"the scheduler's verdict on {name}", condition, SCHEDULE_TIMEOUT_S
    )
    return found


def share_pod(name: str, milligpu: str, selector: dict[str, str]) -> dict[str, Any]:
    resources = {"requests": {SHARE_RESOURCE: milligpu}, "limits": {SHARE_RESOURCE: milligpu}}
    pod = plain_pod(name, resources=resources)
    pod["spec"]["nodeSelector"] = selector
    return pod


def test_the_scheduler_places_share_pods_on_the_advertising_node_only(
    start_controller: Callable[..., Controller],
    fake_nodes: Callable[[FakeGpuNode], k8s.V1Node],
    core_v1: k8s.CoreV1Api,
    namespace: str,
) -> None:
    """No gpushare webhook: a plain pod with the extended resource, as a policy with
    quota.shareResource would leave it. Both nodes match its selector; one advertises."""
    selector = {"e2e.gpushare.io/share-capacity": unique_name("run")}
    gpu = unique_name("share-sched-gpu")
    other = unique_name("share-sched-none")
    fake_nodes(FakeGpuNode(gpu, gpus=2, extra_labels=selector))
    fake_nodes(FakeGpuNode(other, gpus=1, extra_labels=selector))
    set_gpu_count(core_v1, other, None)  # a node GFD has not counted (yet)
    start_controller()
    wait_for_share(core_v1, gpu, 2000)

    core_v1.create_namespaced_pod(namespace, share_pod("half", "500", selector))
    condition = scheduled_condition(core_v1, namespace, "half")
    assert condition["status"] == "True", condition
    pod = core_v1.read_namespaced_pod("half", namespace)
    assert pod.spec.node_name == gpu

    # 1500 left on the one node that advertises any: 2000 fits nowhere.
    core_v1.create_namespaced_pod(namespace, share_pod("too-big", "2000", selector))
    condition = scheduled_condition(core_v1, namespace, "too-big")
    assert condition["status"] == "False"
    assert condition["reason"] == "Unschedulable"
    assert f"2 Insufficient {SHARE_RESOURCE}" in condition["message"], condition["message"]
    time.sleep(2)  # and it stays so
    pod = core_v1.read_namespaced_pod("too-big", namespace)
    assert pod.spec.node_name is None
    assert pod.status.phase == "Pending"

    # GFD counts the other node: 1000 there, and the pod waiting is still too big for it...
    set_gpu_count(core_v1, other, "1")
    wait_for_share(core_v1, other, 1000)
    core_v1.create_namespaced_pod(namespace, share_pod("quarter", "250", selector))
    assert scheduled_condition(core_v1, namespace, "quarter")["status"] == "True"
    assert core_v1.read_namespaced_pod("too-big", namespace).spec.node_name is None


# -- deploy/share-capacity: its RBAC, and the CLI under it -----------------------------------


@pytest.fixture
def service_account_kubeconfig(
    control_plane: ControlPlane, core_v1: k8s.CoreV1Api, tmp_path: Path
) -> Iterator[Path]:
    """deploy/share-capacity applied (the Deployment in a server-side dry run: there is no
    kubelet to run it; the RBAC for real), and a kubeconfig with a token of its
    ServiceAccount. The RBAC is deleted afterwards."""
    ensure_namespace(core_v1, SYSTEM_NAMESPACE)
    rendered = control_plane.kubectl("kustomize", str(DEPLOY)).stdout
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(rendered) if d)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount"]
    control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
    control_plane.kubectl("apply", "-f", str(DEPLOY / "rbac.yaml"))
    try:
        path = control_plane.service_account_kubeconfig(
            SYSTEM_NAMESPACE, SERVICE_ACCOUNT, tmp_path / "share-capacity-kubeconfig"
        )
        yield path
    finally:
        control_plane.kubectl("delete", "--ignore-not-found", "-f", str(DEPLOY / "rbac.yaml"))


def gpushare(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_cli_under_the_deployments_service_account(
    service_account_kubeconfig: Path,
    fake_nodes: Callable[[FakeGpuNode], k8s.V1Node],
    core_v1: k8s.CoreV1Api,
    control_plane: ControlPlane,
) -> None:
    """One pass (--once) as the ServiceAccount, then the long-running command until
    SIGTERM; the ServiceAccount may patch node status and nothing else of a node."""
    name = unique_name("share-cli")
    fake_nodes(FakeGpuNode(name, gpus=2))

    def one_pass() -> subprocess.CompletedProcess[str] | None:  # RBAC takes a moment
        result = gpushare("share-capacity", "--once", "--kubeconfig", str(kubeconfig))
        return result if result.returncode == 0 else None

    kubeconfig = service_account_kubeconfig
    result = wait_for("a pass as the ServiceAccount", one_pass)
    assert f"advertised {name}=2000" in result.stdout.splitlines(), result
    assert share(core_v1, name) == (2000, 2000)

    as_account = k8s.CoreV1Api(control_plane.api_client())
    as_account.api_client.set_default_header(
        "Impersonate-User", f"system:serviceaccount:{SYSTEM_NAMESPACE}:{SERVICE_ACCOUNT}"
    )
    try:
        for forbidden in (
            lambda: as_account.patch_node(name, {"metadata": {"labels": {"x": "y"}}}),
            lambda: as_account.list_namespaced_secret(SYSTEM_NAMESPACE),
            lambda: as_account.delete_node(name),
        ):
            with pytest.raises(ApiException) as refused:
                forbidden()
            assert refused.value.status == 403
    finally:
        as_account.api_client.close()  # type: ignore[no-untyped-call]

    command = ["share-capacity", "--resync", "3", "--kubeconfig", str(kubeconfig)]
    process = subprocess.Popen(
        [sys.executable, "-m", "webhook.cli", *command],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        set_gpu_count(core_v1, name, "3")
        wait_for_share(core_v1, name, 3000)
        reset_share(core_v1, name)
        wait_for_share(core_v1, name, 3000)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert any(line.get("node") == name and line.get("milligpu") == 3000 for line in lines), stderr
    assert {line["logger"] for line in lines} == {"gpushare.quota"}
    assert "SIGTERM: stopping" in [line["message"] for line in lines]
