"""Smoke tests proving the e2e harness: a real apiserver, scheduler and kubectl work together."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from conftest import unique_name
from gpu_nodes import FakeGpuNode
from kubernetes import client as k8s

from bench.e2e_bench import (
    ALLOCATED,
    GC_CYCLES,
    apiserver_profile,
    go_heap_totals,
)
from harness.api import as_json
from harness.binary import HARNESS_DIR
from harness.controlplane import ControlPlane
from harness.processes import wait_for

SHARED = "nvidia.com/gpu.shared"
SCHEDULE_TIMEOUT_S = 30.0

NodeFactory = Callable[[FakeGpuNode], k8s.V1Node]


def kubernetes_version() -> str:
    """The k8s.io/kubernetes version harness/go.mod builds, e.g. v1.37.2."""
    text = (HARNESS_DIR / "go.mod").read_text()
    match = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", text, re.MULTILINE)
    assert match, "k8s.io/kubernetes missing from harness/go.mod"
    return match.group(1)


def gpu_pod(name: str, shared_gpus: int, node_selector: dict[str, str]) -> k8s.V1Pod:
    """A pod asking for `shared_gpus` of the shared GPU resource (requests == limits)."""
    resources = {SHARED: str(shared_gpus)}
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1PodSpec(
            node_selector=node_selector,
            containers=[
                k8s.V1Container(
                    name="main",
                    # Never pulled: there is no kubelet.
                    image="registry.k8s.io/pause:3.10",
                    resources=k8s.V1ResourceRequirements(requests=resources, limits=resources),
                )
            ],
        ),
    )


def read_pod(core_v1: k8s.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    """The pod as the API serves it (camelCase JSON), free of the models' Optionals."""
    return as_json(core_v1.api_client, core_v1.read_namespaced_pod(name, namespace))


def pod_scheduled_condition(
    core_v1: k8s.CoreV1Api, namespace: str, name: str
) -> dict[str, Any] | None:
    """The pod's PodScheduled condition, or None while the scheduler has not looked at it."""
    conditions = read_pod(core_v1, namespace, name).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "PodScheduled"), None)


@pytest.fixture
def two_pools(fake_nodes: NodeFactory) -> tuple[str, dict[int, str]]:
    """Two fake GPU nodes, replicas=2 and replicas=4, sharing a per-test label.

    Returns the label value and the node name per replica count. The per-test label keeps
    the pods of this test off nodes other tests may have left behind.
    """
    pool = unique_name("pool")
    names: dict[int, str] = {}
    for replicas in (2, 4):
        node = fake_nodes(
            FakeGpuNode(
                name=f"{pool}-r{replicas}",
                replicas=replicas,
                extra_labels={"e2e.gpushare.io/pool": pool},
            )
        )
        assert node.metadata is not None
        assert node.metadata.name is not None
        names[replicas] = node.metadata.name
    return pool, names


def test_fake_node_is_ready_untainted_and_advertises_shared_gpus(
    core_v1: k8s.CoreV1Api, fake_nodes: NodeFactory
) -> None:
    """The status write sticks, and TaintNodesByCondition is off (no not-ready taint)."""
    spec = FakeGpuNode(name=unique_name("node"), replicas=4, gpus=2)
    fake_nodes(spec)

    node = as_json(core_v1.api_client, core_v1.read_node(spec.name))

    assert "taints" not in node.get("spec", {})
    assert node["status"]["allocatable"][SHARED] == "8"
    assert node["status"]["capacity"][SHARED] == "8"
    ready = [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready == ["True"]
    assert node["metadata"]["labels"]["nvidia.com/gpu.replicas"] == "4"
    assert node["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] == "time-slicing"


def test_scheduler_binds_pod_to_the_selected_pool(
    core_v1: k8s.CoreV1Api, namespace: str, two_pools: tuple[str, dict[int, str]]
) -> None:
    pool, nodes = two_pools
    core_v1.create_namespaced_pod(
        namespace,
        gpu_pod(
            "shared-gpu",
            shared_gpus=1,
            node_selector={"nvidia.com/gpu.replicas": "4", "e2e.gpushare.io/pool": pool},
        ),
    )

    def bound_node() -> str | None:
        node_name: str | None = read_pod(core_v1, namespace, "shared-gpu")["spec"].get("nodeName")
        return node_name

    node_name = wait_for("the pod to be bound", bound_node, timeout=SCHEDULE_TIMEOUT_S)

    assert node_name == nodes[4]
    condition = pod_scheduled_condition(core_v1, namespace, "shared-gpu")
    assert condition is not None
    assert condition["status"] == "True"


class Unfit(NamedTuple):
    """A pod no node can take, and what the scheduler's message must say about it."""

    shared_gpus: int
    replicas: str
    expected_reason: str


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Unfit(100, "4", f"Insufficient {SHARED}"), id="too-many-shared-gpus"),
        pytest.param(Unfit(1, "8", "didn't match Pod's node affinity/selector"), id="no-such-pool"),
    ],
)
def test_pod_that_fits_no_node_stays_pending(
    core_v1: k8s.CoreV1Api,
    namespace: str,
    two_pools: tuple[str, dict[int, str]],
    case: Unfit,
) -> None:
    pool, _ = two_pools
    core_v1.create_namespaced_pod(
        namespace,
        gpu_pod(
            "too-big",
            shared_gpus=case.shared_gpus,
            node_selector={
                "nvidia.com/gpu.replicas": case.replicas,
                "e2e.gpushare.io/pool": pool,
            },
        ),
    )

    condition = wait_for(
        "PodScheduled=False",
        lambda: pod_scheduled_condition(core_v1, namespace, "too-big"),
        timeout=SCHEDULE_TIMEOUT_S,
    )

    assert condition["status"] == "False"
    assert condition["reason"] == "Unschedulable"
    assert case.expected_reason in condition["message"]
    pod = read_pod(core_v1, namespace, "too-big")
    assert "nodeName" not in pod["spec"]
    assert pod["status"]["phase"] == "Pending"


def test_kubectl_talks_to_the_apiserver(control_plane: ControlPlane, namespace: str) -> None:
    version = json.loads(control_plane.kubectl("version", "--output=json").stdout)
    expected = kubernetes_version()
    assert version["clientVersion"]["gitVersion"] == expected
    assert version["serverVersion"]["gitVersion"] == expected

    names = control_plane.kubectl("get", "namespaces", "--output=name").stdout.split()
    assert {"namespace/default", "namespace/kube-system", f"namespace/{namespace}"} <= set(names)


def test_kubectl_applies_a_kustomization(
    control_plane: ControlPlane, core_v1: k8s.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        f"namespace: {namespace}\n"
        "configMapGenerator:\n"
        "  - name: settings\n"
        "    literals: [mode=time-slicing]\n"
        "generatorOptions:\n"
        "  disableNameSuffixHash: true\n"
    )

    result = control_plane.kubectl("apply", "--kustomize", str(tmp_path))

    assert "configmap/settings created" in result.stdout
    config_map = core_v1.read_namespaced_config_map("settings", namespace)
    assert config_map.data == {"mode": "time-slicing"}


def test_kubectl_failure_is_reported(control_plane: ControlPlane) -> None:
    result = control_plane.kubectl("get", "namespace", "does-not-exist", check=False)

    assert result.returncode != 0
    assert "NotFound" in result.stderr


def test_the_apiserver_gives_the_cpu_profile_the_end_to_end_bench_reads(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """bench/e2e_bench.py --profile: /debug/pprof/profile of the harness's apiserver (on by
    default, for the admin user), a gzipped protobuf profile for `go tool pprof`."""
    into = tmp_path / "apiserver.pprof"
    apiserver_profile(control_plane, into)
    assert into.read_bytes()[:2] == b"\x1f\x8b"


def test_the_apiserver_counts_what_the_end_to_end_bench_reads_of_its_heap(
    control_plane: ControlPlane,
) -> None:
    """bench/e2e_bench.py reads what each batch at concurrency 8 allocated and collected
    from the Go runtime's counters in the apiserver's /metrics (``go_heap_totals``)."""
    before = go_heap_totals(control_plane)
    core = k8s.CoreV1Api(control_plane.api)
    for _ in range(20):
        core.list_namespace()
    after = go_heap_totals(control_plane)
    assert after[ALLOCATED] > before[ALLOCATED] > 0
    assert after[GC_CYCLES] >= before[GC_CYCLES] >= 1
