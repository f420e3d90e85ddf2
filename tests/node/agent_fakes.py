"""Test doubles and fixtures of the node agent: a pod API in memory, a /proc tree of cgroup
files, CDI spec files as the device plugin and ``nvidia-ctk cdi generate`` write them, and
pods as the webhook leaves them (the applied record, the limit variables, container IDs).

Nothing here needs a GPU, a cluster or root: the agent reads files under tmp_path and NVML
through ``FakeNvml``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from webhook.constants import APPLIED_ANNOTATION
from webhook.node.errors import PodApiError
from webhook.node.nvml import GpuDevice
from webhook.node.pod_api import NodePod, node_pod

GPU0 = GpuDevice(
    index=0,
    uuid="GPU-11111111-2222-3333-4444-555555555555",
    name="NVIDIA A100-SXM4-80GB",
    memory_mib=81920,
    compute_capability=(8, 0),
)
GPU1 = GpuDevice(
    index=1,
    uuid="GPU-66666666-7777-8888-9999-000000000000",
    name="NVIDIA A100-SXM4-80GB",
    memory_mib=81920,
    compute_capability=(8, 0),
)
MIB = 1024 * 1024


@dataclass
class FakePodApi:
    """Pods in memory; Events recorded as (namespace/name, reason, message)."""

    pods: list[NodePod] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    fail_list: bool = False
    fail_events: bool = False

    def list_pods(self) -> list[NodePod]:
        if self.fail_list:
            raise PodApiError("Cannot list the pods of node gpu-node-1: injected failure.")
        return list(self.pods)

    def warn(self, pod: NodePod, reason: str, message: str) -> None:
        if self.fail_events:
            raise PodApiError(f"Cannot raise event {reason}: injected failure.")
        self.events.append((f"{pod.namespace}/{pod.name}", reason, message))

    @classmethod
    def from_file(cls, path: Path) -> FakePodApi:
        """Pods as a JSON list of Pod objects (what ``kubectl get pods -o json`` holds)."""
        raw = json.loads(path.read_text())
        return cls(pods=[p for p in map(node_pod, raw) if p is not None])


def container_id(n: int) -> str:
    return f"{n:064x}"


def pod_uid(n: int) -> str:
    return f"{n:08x}-aaaa-bbbb-cccc-{n:012x}"


def pod_json(
    name: str,
    n: int,
    *,
    namespace: str = "ml",
    env: Mapping[str, str] | None = None,
    applied: Mapping[str, Any] | None = None,
    container: str = "main",
) -> dict[str, Any]:
    """A Pod as the API returns it; ``n`` numbers its UID and its container's ID."""
    annotations = {APPLIED_ANNOTATION: json.dumps(applied)} if applied is not None else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": pod_uid(n),
            "annotations": annotations,
        },
        "spec": {
            "nodeName": "gpu-node-1",
            "containers": [
                {
                    "name": container,
                    "image": "pytorch/pytorch:2.3.0",
                    "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                }
            ],
        },
        "status": {
            "containerStatuses": [
                {"name": container, "containerID": f"containerd://{container_id(n)}"}
            ]
        },
    }


def shared_record(fraction: str = "0.5", mode: str = "time-slicing") -> dict[str, Any]:
    """The applied record of a pod the webhook gave ``fraction`` of a GPU."""
    return {
        "container": "main",
        "fraction": fraction,
        "mode": mode,
        "policy": "default",
        "pool": "ts-half",
        "resource": "nvidia.com/gpu.shared",
        "slots": 1,
    }


def as_pod(raw: Mapping[str, Any]) -> NodePod:
    pod = node_pod(raw)
    assert pod is not None
    return pod


def systemd_cgroup(n: int, qos: str = "burstable", runtime: str = "cri-containerd") -> str:
    """The cgroup v2 path of pod ``n``'s container under the systemd driver."""
    uid = pod_uid(n).replace("-", "_")
    return (
        f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid}.slice/"
        f"{runtime}-{container_id(n)}.scope"
    )


def write_proc(proc: Path, pid: int, cgroup_path: str) -> None:
    """/proc/<pid>/cgroup of a process on a cgroup v2 host."""
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cgroup").write_text(f"0::{cgroup_path}\n")


def memory_hook(uuid: str, *, ctk: bool = False) -> dict[str, Any]:
    """The createRuntime hook nvcdi gives a full GPU (toolkit v1.20.1 generate_test.go)."""
    if ctk:
        path, args = "/usr/bin/nvidia-ctk", ["nvidia-ctk", "hook", "apply-cuda-memory-limits"]
    else:
        path, args = "/usr/bin/nvidia-cdi-hook", ["nvidia-cdi-hook", "apply-cuda-memory-limits"]
    return {
        "hookName": "createRuntime",
        "path": path,
        "args": [*args, "--driver-root", "/", "--gpu-id", uuid],
        "env": ["NVIDIA_CTK_DEBUG=false"],
    }


def cdi_spec(kind: str, gpus: list[GpuDevice], *, hook: bool) -> dict[str, Any]:
    """A spec with one device per GPU, named by UUID, with or without the memory hook."""
    devices = []
    for gpu in gpus:
        edits: dict[str, Any] = {"deviceNodes": [{"path": f"/dev/nvidia{gpu.index}"}]}
        edits["hooks"] = [
            {
                "hookName": "createContainer",
                "path": "/usr/bin/nvidia-cdi-hook",
                "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib64"],
            }
        ]
        if hook:
            edits["hooks"].append(memory_hook(gpu.uuid))
        devices.append({"name": gpu.uuid, "containerEdits": edits})
    return {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": devices,
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]},
    }


def write_plugin_spec(cdi: Path, gpus: list[GpuDevice], *, hook: bool) -> Path:
    """The device plugin's spec, where it writes it: k8s.device-plugin.nvidia.com-gpu.json."""
    cdi.mkdir(parents=True, exist_ok=True)
    path = cdi / "k8s.device-plugin.nvidia.com-gpu.json"
    path.write_text(json.dumps(cdi_spec("k8s.device-plugin.nvidia.com/gpu", gpus, hook=hook)))
    return path


def write_generated_spec(cdi: Path, gpus: list[GpuDevice]) -> Path:
    """What ``nvidia-ctk cdi generate`` writes (YAML, kind nvidia.com/gpu), hook included."""
    import yaml

    cdi.mkdir(parents=True, exist_ok=True)
    path = cdi / "nvidia.yaml"
    path.write_text(yaml.safe_dump(cdi_spec("nvidia.com/gpu", gpus, hook=True)))
    return path


def write_cgroup_v2(host_root: Path) -> None:
    marker = host_root / "sys/fs/cgroup/cgroup.controllers"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("cpuset cpu io memory hugetlb pids rdma misc\n")


def fake_node_files(directory: Path) -> tuple[Path, Path, list[str]]:
    """A node for ``fake_gpu_node_agent.py``: one A100 with a capped pod's process, a planted
    uncapped one and a host process; the device plugin's spec with the hook; cgroup v2.
    Returns the inventory, the pods file and the agent's path flags."""
    gpu = {"uuid": GPU0.uuid, "name": GPU0.name, "memoryMiB": GPU0.memory_mib}
    processes = [
        {"pid": 101, "usedMiB": 30000},
        {"pid": 102, "usedMiB": 50000},
        {"pid": 4242, "usedMiB": 512},
    ]
    inventory = directory / "gpus.json"
    inventory.write_text(json.dumps({"gpus": [gpu], "processes": {"0": processes}}))
    limited = {"NVIDIA_GPU_MEMORY_REQUEST": "40960", "NVIDIA_GPU_MEMORY_LIMIT": "40960"}
    pods = directory / "pods.json"
    pods.write_text(
        json.dumps(
            [
                pod_json("capped", 1, env=limited, applied=shared_record()),
                pod_json("planted", 2, applied=shared_record()),
            ]
        )
    )
    proc = directory / "proc"
    write_proc(proc, 101, systemd_cgroup(1))
    write_proc(proc, 102, systemd_cgroup(2))
    write_proc(proc, 4242, "/system.slice/ollama.service")
    write_cgroup_v2(directory)
    cdi = directory / "cdi"
    write_plugin_spec(cdi, [GPU0], hook=True)
    flags = ["--host-root", str(directory), "--proc-root", str(proc), "--cdi-dir", str(cdi)]
    return inventory, pods, flags
