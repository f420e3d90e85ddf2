"""Fake GPU nodes: Node objects written through the API as GPU Feature Discovery and the
NVIDIA device plugin would leave them, for the scheduler to place pods on.

There is no kubelet, so a node is only what its labels and status say.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field

from kubernetes import client as k8s

from harness.api import as_json


@dataclass(frozen=True)
class FakeGpuNode:
    """A Node that looks like a GPU node after GPU Feature Discovery and the device plugin.

    `shared_resource` is advertised as `gpus * replicas` in capacity and allocatable,
    as the NVIDIA device plugin does with time-slicing and renameByDefault.
    """

    name: str
    replicas: int = 1
    gpus: int = 1
    product: str = "NVIDIA-A100-SXM4-80GB"
    gpu_memory_mib: int = 81920
    sharing_strategy: str = "time-slicing"
    shared_resource: str = "nvidia.com/gpu.shared"
    cpu: str = "16"
    memory: str = "64Gi"
    pods: str = "110"
    extra_labels: Mapping[str, str] = field(default_factory=dict)

    def labels(self) -> dict[str, str]:
        """Node labels: the well-known ones plus GPU Feature Discovery's."""
        return {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.count": str(self.gpus),
            "nvidia.com/gpu.replicas": str(self.replicas),
            "nvidia.com/gpu.sharing-strategy": self.sharing_strategy,
            "nvidia.com/gpu.product": self.product,
            "nvidia.com/gpu.memory": str(self.gpu_memory_mib),
            **self.extra_labels,
        }

    def resources(self) -> dict[str, str]:
        """Capacity (and allocatable) including the shared GPU resource."""
        return {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": self.pods,
            self.shared_resource: str(self.gpus * self.replicas),
        }


def create_fake_node(core: k8s.CoreV1Api, spec: FakeGpuNode) -> k8s.V1Node:
    """Create the Node, then write its status (capacity, allocatable, Ready) via /status.

    The create call ignores `status`, so the second, status-subresource write is what the
    scheduler sees. Returns the node as stored after the status write.
    """
    core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name=spec.name, labels=spec.labels())))
    now = datetime.datetime.now(datetime.UTC)
    status = k8s.V1NodeStatus(
        capacity=spec.resources(),
        allocatable=spec.resources(),
        conditions=[
            k8s.V1NodeCondition(
                type="Ready",
                status="True",
                reason="KubeletReady",
                message="fake node created by the gpushare e2e harness",
                last_heartbeat_time=now,
                last_transition_time=now,
            )
        ],
        node_info=k8s.V1NodeSystemInfo(
            architecture="amd64",
            boot_id="",
            container_runtime_version="fake://0",
            kernel_version="",
            kube_proxy_version="",
            kubelet_version="v0.0.0-fake",
            machine_id="",
            operating_system="linux",
            os_image="fake",
            system_uuid="",
        ),
    )
    # A merge patch of the status subresource: no read-modify-write race with anyone.
    # The client would default a dict body to a JSON Patch, hence the explicit type.
    body = {"status": as_json(core.api_client, status)}
    node: k8s.V1Node = core.patch_node_status(
        spec.name, body, _content_type="application/merge-patch+json"
    )
    return node
