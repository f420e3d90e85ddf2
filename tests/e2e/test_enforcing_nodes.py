"""Driver-enforced limits through the real apiserver and scheduler (docs/enforcement.md).

gpushare serves one policy, ``enforced``: time-slicing halves of a 16 GiB Tesla T4 with
``enforcement.driverMemoryLimit: require`` and 450 MiB kept per T4 for the driver and the
CUDA context. Fake GPU nodes (GPU Feature Discovery's labels, the shared resource in their
status) stand for three nodes of the pool: one the node agent labelled
``gpushare.io/driver-memory-limit=true``, one it labelled ``false`` (no hook in the device
plugin's CDI spec, say), one it never labelled (no agent). Each has two free half slots.

- Every pod gpushare admits carries NVIDIA_GPU_MEMORY_REQUEST/LIMIT = floor(0.5 x (16384 -
  450)) = 7967 MiB and the node selector: the enforcing node takes two, the third and fourth
  stay Pending with the scheduler saying the other nodes do not match, although they have
  free slots; when the agent later labels another node ``true``, the scheduler binds them
  there.
- A value the user wrote for the limit, in ``env`` or through ``envFrom``, loses to
  gpushare's: ``env`` is written over, and an explicit ``env`` entry takes precedence over
  ``envFrom`` (Kubernetes, "Define Environment Variables for a Container").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import unique_name
from gpu_nodes import FakeGpuNode
from kubernetes import client as k8s

from harness.api import as_json, create_pod, ensure_namespace
from harness.controlplane import ControlPlane
from harness.processes import wait_for
from harness.registration import PAUSE_IMAGE, GpushareWebhook
from harness.webhookserver import WebhookServer
from webhook.constants import APPLIED_ANNOTATION, DRIVER_LIMIT_LABEL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
POOL_LABEL = "e2e.gpushare.io/enforcing-pool"
T4_MIB = 16384
LIMIT_MIB = str((T4_MIB - 450) // 2)
SCHEDULE_TIMEOUT_S = 30.0
ENFORCED_POLICY: dict[str, Any] = {
    "apiVersion": "gpushare.io/v1alpha1",
    "kind": "GpuSharingPolicy",
    "metadata": {"name": "enforced"},
    "spec": {
        "default": True,
        "mode": "time-slicing",
        "gpuMemory": f"{T4_MIB}Mi",
        "pools": [
            {
                "name": "t4-half",
                "replicas": 2,
                "nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4"},
            }
        ],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "enforcement": {
            "driverMemoryLimit": "require",
            "reservedMemory": {"products": {"Tesla-T4": "450Mi"}},
        },
    },
}

NodeFactory = Callable[[FakeGpuNode], k8s.V1Node]


@pytest.fixture(scope="module")
def enforced_webhook(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane
) -> Iterator[GpushareWebhook]:
    """`gpushare serve` with the ``enforced`` policy (and the bundled settings), registered
    as `gpushare webhook-config` prints it, for this module."""
    policies = tmp_path_factory.mktemp("enforced-policies")
    settings = next(
        d
        for d in yaml.safe_load_all((REPO / "policies/default.yaml").read_text())
        if d and d["kind"] == "GpuSharingSettings"
    )
    (policies / "policies.yaml").write_text(yaml.safe_dump_all([settings, ENFORCED_POLICY]))
    server = WebhookServer.start(tmp_path_factory.mktemp("enforced-webhook"), policies)
    try:
        ensure_namespace(k8s.CoreV1Api(control_plane.api), "e2e-probe")
        webhook = GpushareWebhook(server, control_plane.api, "e2e-probe")
        webhook.register()
        try:
            yield webhook
        finally:
            webhook.unregister()
    finally:
        server.stop()


def t4_node(name: str, label: str, enforces: str | None) -> FakeGpuNode:
    extra = {POOL_LABEL: label}
    if enforces is not None:
        extra[DRIVER_LIMIT_LABEL] = enforces
    return FakeGpuNode(
        name=name, replicas=2, product="Tesla-T4", gpu_memory_mib=T4_MIB, extra_labels=extra
    )


def share_pod(name: str, label: str, env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": PAUSE_IMAGE}
    if env:
        container["env"] = env
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"gpu-fraction": "0.5"}},
        "spec": {"containers": [container], "nodeSelector": {POOL_LABEL: label}},
    }


def read_pod(core_v1: k8s.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = as_json(core_v1.api_client, core_v1.read_namespaced_pod(name, namespace))
    return pod


def bound_node(core_v1: k8s.CoreV1Api, namespace: str, name: str) -> str:
    def node_name() -> str | None:
        bound: str | None = read_pod(core_v1, namespace, name)["spec"].get("nodeName")
        return bound

    return wait_for(f"pod {name} to be bound", node_name, timeout=SCHEDULE_TIMEOUT_S)


def unschedulable_message(core_v1: k8s.CoreV1Api, namespace: str, name: str) -> str:
    def condition() -> str | None:
        conditions = read_pod(core_v1, namespace, name).get("status", {}).get("conditions", [])
        for found in conditions:
            if found["type"] == "PodScheduled" and found["status"] == "False":
                message: str = found["message"]
                return message
        return None

    return wait_for(f"the scheduler's verdict on {name}", condition, timeout=SCHEDULE_TIMEOUT_S)


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env", [])}


def test_only_enforcing_nodes_get_the_pods_and_the_rest_wait(
    enforced_webhook: GpushareWebhook,
    core_v1: k8s.CoreV1Api,
    namespace: str,
    fake_nodes: NodeFactory,
) -> None:
    label = unique_name("enf")
    enforcing = fake_nodes(t4_node(f"{label}-yes", label, "true")).metadata.name
    refusing = fake_nodes(t4_node(f"{label}-no", label, "false")).metadata.name
    fake_nodes(t4_node(f"{label}-unknown", label, None))
    api = enforced_webhook.api

    created = [create_pod(api, namespace, share_pod(f"p{i}", label)) for i in range(4)]
    admitted = [c.pod for c in created]

    # The developer is told at creation where the pod may run (kubectl prints it).
    assert created[0].warnings == [
        f"runs only on nodes labelled {DRIVER_LIMIT_LABEL}=true (driver enforces its {LIMIT_MIB}Mi)"
    ]
    for pod in admitted:
        assert env_of(pod)["NVIDIA_GPU_MEMORY_LIMIT"] == LIMIT_MIB
        assert env_of(pod)["NVIDIA_GPU_MEMORY_REQUEST"] == LIMIT_MIB
        assert pod["spec"]["nodeSelector"][DRIVER_LIMIT_LABEL] == "true"
        assert APPLIED_ANNOTATION in pod["metadata"]["annotations"]
    bound = {bound_node(core_v1, namespace, name) for name in ("p0", "p1")}
    assert bound == {enforcing}
    for name in ("p2", "p3"):
        message = unschedulable_message(core_v1, namespace, name)
        # The enforcing node is full; the two others have free slots but do not enforce.
        assert "2 node(s) didn't match Pod's node affinity/selector" in message
        assert "Insufficient nvidia.com/gpu.shared" in message
        assert "nodeName" not in read_pod(core_v1, namespace, name)["spec"]

    # The node agent finds the hook on the second node: the waiting pods go there.
    core_v1.patch_node(refusing, {"metadata": {"labels": {DRIVER_LIMIT_LABEL: "true"}}})
    assert {bound_node(core_v1, namespace, name) for name in ("p2", "p3")} == {refusing}


def test_the_users_own_limit_loses_in_env_and_through_env_from(
    enforced_webhook: GpushareWebhook, core_v1: k8s.CoreV1Api, namespace: str
) -> None:
    core_v1.create_namespaced_config_map(
        namespace,
        k8s.V1ConfigMap(
            metadata=k8s.V1ObjectMeta(name="limits"),
            data={"NVIDIA_GPU_MEMORY_LIMIT": "16384", "NVIDIA_GPU_MEMORY_REQUEST": "16384"},
        ),
    )
    pod = share_pod(
        "own-limit", "none", env=[{"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "16384"}]
    )
    pod["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "limits"}}]

    created = create_pod(enforced_webhook.api, namespace, pod)

    env = created.pod["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "NVIDIA_GPU_MEMORY_LIMIT"] == [
        {"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": LIMIT_MIB}
    ]
    assert {"name": "NVIDIA_GPU_MEMORY_REQUEST", "value": LIMIT_MIB} in env
    assert any("NVIDIA_GPU_MEMORY_LIMIT" in w for w in created.warnings)
