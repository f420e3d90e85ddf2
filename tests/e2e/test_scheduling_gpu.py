"""Mutated pods meet the real kube-scheduler: the right pool, or Pending with a reason.

Fake GPU nodes (created through the API: GPU Feature Discovery labels, capacity and
allocatable written through the status subresource, as the device plugin would) form
three pools of the bundled default policy: time-slicing with replicas=2 (a slot is half a
GPU), time-slicing with replicas=4 (a quarter), and whole GPUs (sharing-strategy none).
Like many GPU node pools they carry the taint nvidia.com/gpu:NoSchedule, which only the
toleration the policy injects lets pods past. Developers write nothing but the
annotation; every placement below comes from what the webhook added.

Each test labels its nodes with a pool name of its own and adds that label to its pods'
nodeSelector (the policy keeps user selectors and adds its own), so nodes left by other
tests can never take the pods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import unique_name
from gpu_nodes import FakeGpuNode
from kubernetes import client as k8s
from pods import annotated_pod, plain_pod

from harness.api import as_json, create_pod
from harness.processes import wait_for
from harness.registration import SHARED_RESOURCE, GpushareWebhook
from webhook.constants import (
    APPLIED_ANNOTATION,
    MEMORY_ANNOTATION,
)

POOL_LABEL = "e2e.gpushare.io/pool"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
SCHEDULE_TIMEOUT_S = 30.0

NodeFactory = Callable[[FakeGpuNode], k8s.V1Node]


@dataclass(frozen=True)
class Pools:
    """The per-test pool label value and the node of each pool."""

    label: str
    half: str  # time-slicing, replicas=2: 2 slots on its one GPU
    quarter: str  # time-slicing, replicas=4: 4 slots
    whole: str  # sharing-strategy none: 4 whole GPUs as nvidia.com/gpu

    def pod(self, name: str, fraction: str) -> dict[str, Any]:
        pod = annotated_pod(name, fraction)
        pod["spec"]["nodeSelector"] = {POOL_LABEL: self.label}
        return pod


@pytest.fixture
def pools(fake_nodes: NodeFactory, core_v1: k8s.CoreV1Api) -> Pools:
    label = unique_name("pool")
    specs = {
        "half": FakeGpuNode(name=f"{label}-r2", replicas=2),
        "quarter": FakeGpuNode(name=f"{label}-r4", replicas=4),
        "whole": FakeGpuNode(
            name=f"{label}-whole",
            gpus=4,
            sharing_strategy="none",
            shared_resource="nvidia.com/gpu",
        ),
    }
    for spec in specs.values():
        labelled = FakeGpuNode(
            **{**spec.__dict__, "extra_labels": {POOL_LABEL: label}},
        )
        fake_nodes(labelled)
        core_v1.patch_node(labelled.name, {"spec": {"taints": [GPU_TAINT]}})
    return Pools(label, specs["half"].name, specs["quarter"].name, specs["whole"].name)


def bound_node(core_v1: k8s.CoreV1Api, namespace: str, name: str) -> str:
    def node_name() -> str | None:
        pod = as_json(core_v1.api_client, core_v1.read_namespaced_pod(name, namespace))
        bound: str | None = pod["spec"].get("nodeName")
        return bound

    return wait_for(f"pod {name} to be bound", node_name, timeout=SCHEDULE_TIMEOUT_S)


def scheduled_condition(core_v1: k8s.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    def condition() -> dict[str, Any] | None:
        pod = as_json(core_v1.api_client, core_v1.read_namespaced_pod(name, namespace))
        conditions = pod.get("status", {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "PodScheduled"), None)

    return wait_for(f"the scheduler's verdict on {name}", condition, timeout=SCHEDULE_TIMEOUT_S)


@pytest.mark.parametrize(
    ("fraction", "pool"),
    [("0.5", "half"), ("0.25", "quarter"), ("0.1", "quarter"), ("2", "whole")],
)
def test_annotated_pod_is_bound_to_a_node_of_the_right_pool(
    gpushare_webhook: GpushareWebhook,
    core_v1: k8s.CoreV1Api,
    namespace: str,
    pools: Pools,
    fraction: str,
    pool: str,
) -> None:
    """0.5 needs a half-GPU slot, 0.25 and 0.1 fit a quarter slot, "2" is two whole GPUs."""
    admitted = create_pod(gpushare_webhook.api, namespace, pools.pod("gpu-job", fraction)).pod
    assert APPLIED_ANNOTATION in admitted["metadata"]["annotations"]

    node = bound_node(core_v1, namespace, "gpu-job")

    assert node == getattr(pools, pool)
    assert scheduled_condition(core_v1, namespace, "gpu-job")["status"] == "True"


def test_pod_that_fits_no_pool_stays_pending_with_the_gpu_resource_named(
    gpushare_webhook: GpushareWebhook, core_v1: k8s.CoreV1Api, namespace: str, pools: Pools
) -> None:
    """The half-GPU pool has two slots: the third 0.5 pod waits, and says why."""
    api = gpushare_webhook.api
    for name in ("first", "second"):
        create_pod(api, namespace, pools.pod(name, "0.5"))
        assert bound_node(core_v1, namespace, name) == pools.half

    create_pod(api, namespace, pools.pod("third", "0.5"))
    condition = scheduled_condition(core_v1, namespace, "third")

    assert condition["status"] == "False"
    assert condition["reason"] == "Unschedulable"
    assert f"1 Insufficient {SHARED_RESOURCE}" in condition["message"]
    # The quarter and whole-GPU nodes are not candidates at all: the selector is the pool's.
    assert "didn't match Pod's node affinity/selector" in condition["message"]
    pod = as_json(core_v1.api_client, core_v1.read_namespaced_pod("third", namespace))
    assert "nodeName" not in pod["spec"]
    assert pod["status"]["phase"] == "Pending"


def test_without_the_injected_toleration_the_gpu_nodes_stay_closed(
    gpushare_webhook: GpushareWebhook, core_v1: k8s.CoreV1Api, namespace: str, pools: Pools
) -> None:
    """The control for the tests above: the same pool, no annotation, no toleration.

    Asking for the shared resource by hand is denied by policy, so this pod asks for none;
    the taint alone keeps it off every GPU node, which shows it is the webhook's toleration
    that lets annotated pods on.
    """
    pod = plain_pod("no-annotation")
    pod["spec"]["nodeSelector"] = {POOL_LABEL: pools.label}
    create_pod(gpushare_webhook.api, namespace, pod)

    condition = scheduled_condition(core_v1, namespace, "no-annotation")

    assert condition["status"] == "False"
    # The scheduler names no taint key; the only taint on these nodes is GPU_TAINT.
    assert "3 node(s) had untolerated taint(s)" in condition["message"]


# -- gpu-memory on mixed GPU models --------------------------------------------------------
# GPU memory in MiB as GPU Feature Discovery labels it (nvidia.com/gpu.memory: NVML's total
# / 2^20, k8s-device-plugin v0.20.0 internal/lm/resource.go).
L4_MIB = 23034
A100_MIB = 81920
H200_MIB = 143771


@dataclass(frozen=True)
class MixedGpus:
    """The default policy's pools on three GPU models; the policy declares no gpuMemory."""

    label: str
    l4_half: str  # replicas=2: slots of 11517 MiB
    a100_half: str  # replicas=2: slots of 40960 MiB
    h200_quarter: str  # replicas=4: slots of 35942 MiB

    def pod(self, name: str, memory: str) -> dict[str, Any]:
        pod = annotated_pod(name)
        pod["metadata"]["annotations"] = {MEMORY_ANNOTATION: memory}
        pod["spec"]["nodeSelector"] = {POOL_LABEL: self.label}
        return pod


@pytest.fixture
def mixed_gpus(fake_nodes: NodeFactory, core_v1: k8s.CoreV1Api) -> MixedGpus:
    label = unique_name("mixed")
    specs = [
        FakeGpuNode(name=f"{label}-l4", replicas=2, product="NVIDIA-L4", gpu_memory_mib=L4_MIB),
        FakeGpuNode(name=f"{label}-a100", replicas=2, gpu_memory_mib=A100_MIB),
        FakeGpuNode(
            name=f"{label}-h200", replicas=4, product="NVIDIA-H200", gpu_memory_mib=H200_MIB
        ),
    ]
    for spec in specs:
        fake_nodes(FakeGpuNode(**{**spec.__dict__, "extra_labels": {POOL_LABEL: label}}))
        core_v1.patch_node(spec.name, {"spec": {"taints": [GPU_TAINT]}})
    return MixedGpus(label, *(spec.name for spec in specs))


@pytest.mark.parametrize(
    ("memory", "nodes"),
    [
        ("20Gi", {"a100_half"}),  # needs a GPU of 40 GiB: not the L4
        ("8000", {"l4_half", "a100_half"}),  # 8000 MiB: a GPU of 16000 MiB will do
    ],
)
def test_gpu_memory_pod_is_bound_where_one_slot_holds_the_ask(
    gpushare_webhook: GpushareWebhook,
    core_v1: k8s.CoreV1Api,
    namespace: str,
    mixed_gpus: MixedGpus,
    memory: str,
    nodes: set[str],
) -> None:
    """The real kube-scheduler reads the node affinity the webhook added (GFD's
    nvidia.com/gpu.memory Gt replicas x ask - 1) and never picks a GPU whose slot is smaller
    than the ask, nor the quarter pool whose slot the policy did not choose."""
    pod = create_pod(gpushare_webhook.api, namespace, mixed_gpus.pod("memory-job", memory)).pod
    assert "nodeGpuMemory" in pod["metadata"]["annotations"][APPLIED_ANNOTATION]

    node = bound_node(core_v1, namespace, "memory-job")

    assert node in {getattr(mixed_gpus, n) for n in nodes}


def test_gpu_memory_no_slot_holds_stays_pending_on_node_affinity(
    gpushare_webhook: GpushareWebhook,
    core_v1: k8s.CoreV1Api,
    namespace: str,
    mixed_gpus: MixedGpus,
) -> None:
    """60Gi needs a half slot of a 120 GiB GPU: the H200 has the memory but serves quarter
    slots (35 GiB), and the half-slot GPUs are too small. The pod waits and says why."""
    create_pod(gpushare_webhook.api, namespace, mixed_gpus.pod("too-big", "60Gi"))

    condition = scheduled_condition(core_v1, namespace, "too-big")

    assert condition["status"] == "False"
    assert condition["reason"] == "Unschedulable"
    assert "3 node(s) didn't match Pod's node affinity/selector" in condition["message"]
