"""The parameters of the other device-plugin sharing schemes a policy's ``mode`` can name:
their frozen values, their JSON Schema, their builders and their cross-field rules.

One section per scheme (``awsVgpu``, ``tencentVcuda``, ``aliyunGpushare``, ``hami``,
``kai``), valid only with its own mode; the facts behind every default (resource names,
units, limits) are cited in docs/schemes.md and in the mode modules under
``webhook.core.modes``. Like the rest of the policy package: no I/O, and builders report
nothing (``scheme_findings`` says what is wrong).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from webhook.core.policy.model import Mode, frozen_map

# -- values -------------------------------------------------------------------------------

# awslabs/aws-virtual-gpu-device-plugin: pkg/gpu/nvidia/server.go (resourceName), main.go
# (--vgpu default 10; VOLTA_MAXIMUM_MPS_CLIENT 48), manifests/device-plugin.yml (node label,
# the MPS sidecar's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE "10", /tmp/nvidia-mps).
AWS_VGPU_RESOURCE = "k8s.amazonaws.com/vgpu"
AWS_VGPU_NODE_LABEL = "k8s.amazonaws.com/accelerator"
AWS_MAX_VGPUS = 48
# tkestack/gpu-manager: pkg/types/types.go (names, MemoryBlockSize 268435456 = 256 MiB),
# pkg/device/nvidia/tree.go (HundredCore = one GPU).
VCUDA_CORE_RESOURCE = "tencent.com/vcuda-core"
VCUDA_MEMORY_RESOURCE = "tencent.com/vcuda-memory"
VCUDA_CORE_LIMIT_ANNOTATION = "tencent.com/vcuda-core-limit"
VCUDA_MEMORY_UNIT_MIB = 256
VCUDA_CORES_PER_GPU = 100
# AliyunContainerService/gpushare-device-plugin: pkg/gpu/nvidia/const.go, cmd/nvidia/main.go
# (--memory-unit GiB by default, or MiB), device-plugin-ds.yaml (node label gpushare=true).
ALIYUN_MEMORY_RESOURCE = "aliyun.com/gpu-mem"
ALIYUN_NODE_LABEL = "gpushare"
# Project-HAMi/HAMi: charts/hami/values.yaml (resource names, schedulerName), the chart's
# webhook objectSelector (pods labelled hami.io/webhook=ignore are skipped).
HAMI_GPU_RESOURCE = "nvidia.com/gpu"
HAMI_MEMORY_RESOURCE = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENTAGE_RESOURCE = "nvidia.com/gpumem-percentage"
HAMI_CORES_RESOURCE = "nvidia.com/gpucores"
HAMI_SCHEDULER = "hami-scheduler"
HAMI_WEBHOOK_LABEL = "hami.io/webhook"
HAMI_WEBHOOK_IGNORE = "ignore"
# NVIDIA/KAI-Scheduler: pkg/common/constants/constants.go.
KAI_SCHEDULER = "kai-scheduler"
KAI_QUEUE_LABEL = "kai.scheduler/queue"
KAI_NUM_DEVICES_ANNOTATION = "gpu-fraction-num-devices"

# The modes of this module; every other mode rejects their sections.
SCHEME_SECTIONS: Mapping[Mode, str] = {
    Mode.AWS_VGPU: "awsVgpu",
    Mode.TENCENT_VCUDA: "tencentVcuda",
    Mode.ALIYUN_GPUSHARE: "aliyunGpushare",
    Mode.HAMI: "hami",
    Mode.KAI: "kai",
}


@dataclass(frozen=True)
class AwsVgpuSettings:
    """AWS virtual-gpu-device-plugin: ``vgpus_per_gpu`` vGPUs per GPU behind one MPS daemon
    per node, whose thread percentage holds for every client."""

    vgpus_per_gpu: int = 10
    resource_name: str = AWS_VGPU_RESOURCE
    # The MPS daemon's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (the sidecar's env, daemon-wide).
    thread_percentage: int = 10
    pipe_directory: str = "/tmp/nvidia-mps"
    node_selector: Mapping[str, str] = field(
        default_factory=lambda: frozen_map({AWS_VGPU_NODE_LABEL: "vgpu"})
    )
    # More than one vGPU per pod only where nodes have one GPU (the plugin's README).
    single_gpu_nodes: bool = False


@dataclass(frozen=True)
class TencentVcudaSettings:
    """tkestack gpu-manager: cores (100 = a GPU) and memory in 256 MiB units."""

    # tencent.com/vcuda-core-limit: None keeps the hard limit at vcuda-core; a number lets
    # the pod burst up to that many cores when the GPU is idle.
    core_limit: int | None = None


class AliyunUnit(StrEnum):
    GIB = "GiB"
    MIB = "MiB"


@dataclass(frozen=True)
class AliyunSettings:
    """Aliyun gpushare: GPU memory in the unit the device plugin was started with."""

    memory_unit: AliyunUnit = AliyunUnit.GIB

    @property
    def unit_mib(self) -> int:
        return 1024 if self.memory_unit is AliyunUnit.GIB else 1


class HamiMemory(StrEnum):
    MIB = "mib"  # nvidia.com/gpumem
    PERCENTAGE = "percentage"  # nvidia.com/gpumem-percentage


@dataclass(frozen=True)
class HamiSettings:
    """HAMi: one vGPU with a memory and a core share, scheduled by hami-scheduler."""

    memory: HamiMemory = HamiMemory.MIB
    cores: bool = True
    scheduler_name: str = HAMI_SCHEDULER
    # Label pods hami.io/webhook=ignore so HAMi's own webhook skips what gpushare mutated.
    skip_hami_webhook: bool = True


@dataclass(frozen=True)
class KaiSettings:
    """KAI-Scheduler hand-over: the pod keeps its annotations and goes to kai-scheduler."""

    scheduler_name: str = KAI_SCHEDULER
    queue: str | None = None


@dataclass(frozen=True)
class SchemeSettings:
    """Every scheme's section; only the policy's own mode's is read."""

    aws_vgpu: AwsVgpuSettings = field(default_factory=AwsVgpuSettings)
    tencent_vcuda: TencentVcudaSettings = field(default_factory=TencentVcudaSettings)
    aliyun: AliyunSettings = field(default_factory=AliyunSettings)
    hami: HamiSettings = field(default_factory=HamiSettings)
    kai: KaiSettings = field(default_factory=KaiSettings)
    # spec.gpuMemory: the memory of one GPU of the scheme's nodes (None: not declared).
    gpu_memory_mib: int | None = None


# -- schema -------------------------------------------------------------------------------

_LABEL_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 63}
_RESOURCE_NAME = {"type": "string", "pattern": r"^[a-z0-9.-]+/[A-Za-z0-9._-]+$"}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": properties}


SCHEME_SCHEMA: dict[str, Any] = {
    "awsVgpu": _object(
        {
            "vgpusPerGpu": {
                "type": "integer",
                "minimum": 1,
                "maximum": AWS_MAX_VGPUS,
                "description": "The device plugin's --vgpu (default 10, at most 48).",
            },
            "resourceName": _RESOURCE_NAME,
            "threadPercentage": {
                "type": "integer",
                "minimum": 1,
                "maximum": 100,
                "description": "The MPS daemon's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (10).",
            },
            "pipeDirectory": {"type": "string", "pattern": "^/"},
            "nodeSelector": _LABEL_MAP,
            "singleGpuNodes": {
                "type": "boolean",
                "description": "Nodes have one GPU: a pod may take more than one vGPU.",
            },
        }
    ),
    "tencentVcuda": _object(
        {
            "coreLimit": {
                "type": "integer",
                "minimum": 1,
                "maximum": 100,
                "description": "tencent.com/vcuda-core-limit: cores a pod may burst to.",
            },
        }
    ),
    "aliyunGpushare": _object({"memoryUnit": {"enum": ["GiB", "MiB"]}}),
    "hami": _object(
        {
            "memory": {"enum": ["mib", "percentage"]},
            "cores": {"type": "boolean"},
            "schedulerName": _NAME,
            "skipHamiWebhook": {"type": "boolean"},
        }
    ),
    "kai": _object({"schedulerName": _NAME, "queue": _NAME}),
}


# -- builders -----------------------------------------------------------------------------

_AWS_FIELDS = (
    ("vgpusPerGpu", "vgpus_per_gpu"),
    ("resourceName", "resource_name"),
    ("threadPercentage", "thread_percentage"),
    ("pipeDirectory", "pipe_directory"),
    ("singleGpuNodes", "single_gpu_nodes"),
)


def _present(raw: Mapping[str, Any], fields: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    return {name: raw[key] for key, name in fields if key in raw}


def build_schemes(spec: Mapping[str, Any], gpu_memory_mib: int | None) -> SchemeSettings:
    """The scheme sections of a schema-valid spec (absent ones at their defaults)."""
    aws = spec.get("awsVgpu", {})
    aws_args = _present(aws, _AWS_FIELDS)
    if "nodeSelector" in aws:
        aws_args["node_selector"] = frozen_map(aws["nodeSelector"])
    hami = spec.get("hami", {})
    hami_args = _present(
        hami,
        (
            ("cores", "cores"),
            ("schedulerName", "scheduler_name"),
            ("skipHamiWebhook", "skip_hami_webhook"),
        ),
    )
    if "memory" in hami:
        hami_args["memory"] = HamiMemory(hami["memory"])
    aliyun = spec.get("aliyunGpushare", {})
    return SchemeSettings(
        aws_vgpu=AwsVgpuSettings(**aws_args),
        tencent_vcuda=TencentVcudaSettings(
            **_present(spec.get("tencentVcuda", {}), (("coreLimit", "core_limit"),))
        ),
        aliyun=AliyunSettings(
            **({"memory_unit": AliyunUnit(aliyun["memoryUnit"])} if "memoryUnit" in aliyun else {})
        ),
        hami=HamiSettings(**hami_args),
        kai=KaiSettings(
            **_present(
                spec.get("kai", {}), (("schedulerName", "scheduler_name"), ("queue", "queue"))
            )
        ),
        gpu_memory_mib=gpu_memory_mib,
    )


def scheme_resource(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``resource_name`` of a scheme mode's policy: the resource a pod asking by hand
    (``directResourceRequests``) would name; none for KAI, which takes annotations."""
    primary = {
        Mode.AWS_VGPU.value: spec.get("awsVgpu", {}).get("resourceName", AWS_VGPU_RESOURCE),
        Mode.TENCENT_VCUDA.value: VCUDA_CORE_RESOURCE,
        Mode.ALIYUN_GPUSHARE.value: ALIYUN_MEMORY_RESOURCE,
        Mode.HAMI.value: HAMI_MEMORY_RESOURCE,
    }.get(spec["mode"])
    if primary is None or "resourceName" in spec:
        return {}
    return {"resource_name": primary}


# -- rules --------------------------------------------------------------------------------


def scheme_findings(mode: Mode, spec: Mapping[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    """(message, spec path) for each scheme rule the spec breaks."""
    findings: list[tuple[str, tuple[str, ...]]] = []
    for other, section in SCHEME_SECTIONS.items():
        if other is not mode and section in spec:
            findings.append(
                (f"{section} settings apply only to mode {other.value}: remove them", (section,))
            )
    if mode not in SCHEME_SECTIONS:
        return findings
    if "pools" in spec:
        findings.append(
            (
                f"mode {mode.value} shares GPUs through its own device plugin and resources, "
                "not the NVIDIA device plugin's replica pools: remove pools",
                ("pools",),
            )
        )
    if "resourceName" in spec:
        findings.append(
            (
                f"mode {mode.value} decides the pod's resources itself: remove resourceName"
                + (
                    " (awsVgpu.resourceName renames the vGPU resource)"
                    if mode is Mode.AWS_VGPU
                    else ""
                ),
                ("resourceName",),
            )
        )
    if "allocation" in spec:
        findings.append(
            (f"mode {mode.value} has no replica allocation: remove allocation", ("allocation",))
        )
    if mode is Mode.TENCENT_VCUDA and "gpuMemory" not in spec:
        findings.append(
            (
                "mode tencent-vcuda asks for cores and memory together (gpu-manager refuses "
                "a share with either at zero), so it needs the memory of one GPU to turn a "
                "gpu-fraction into memory and a gpu-memory into cores: set gpuMemory (e.g. 16Gi)",
                (),
            )
        )
    return findings
