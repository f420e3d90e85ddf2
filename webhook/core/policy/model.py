"""Frozen values for parsed policy documents. No parsing, no I/O: see ``loader`` for that."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from webhook.constants import (
    API_GROUP,
    DEFAULT_EXCLUDED_NAMESPACES,
    MPS_READY_LABEL,
    SHARED_GPU_RESOURCE,
    WHOLE_GPU_RESOURCE,
)
from webhook.core.policy.enforcement import EnforcementSettings
from webhook.core.policy.quota import QuotaSettings

if TYPE_CHECKING:
    from webhook.core.policy.schemes import SchemeSettings
    from webhook.core.workload_kinds import WorkloadKind

API_VERSION = f"{API_GROUP}/v1alpha1"
POLICY_KIND = "GpuSharingPolicy"
SETTINGS_KIND = "GpuSharingSettings"


def frozen_map(values: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """A read-only copy of ``values`` so frozen dataclasses stay immutable all the way down."""
    return MappingProxyType(dict(values or {}))


class Mode(StrEnum):
    """How the cluster shares a GPU; one module under ``webhook.core.modes`` per value."""

    TIME_SLICING = "time-slicing"
    MPS = "mps"
    MPS_DAEMON = "mps-daemon"
    # Other device plugins' schemes (parameters in ``policy.schemes``, docs/schemes.md).
    AWS_VGPU = "aws-vgpu"
    TENCENT_VCUDA = "tencent-vcuda"
    ALIYUN_GPUSHARE = "aliyun-gpushare"
    HAMI = "hami"
    KAI = "kai"
    DRA = "dra"


class Allocation(StrEnum):
    """How a fraction becomes slots of the shared resource."""

    # One slot on the pool whose slice 1/R is the smallest that still covers the fraction.
    REPLICA_CLASS = "replica-class"
    # ceil(f * R) slots; only safe where every node of the pool has exactly one GPU, since
    # the device plugin may otherwise hand out slots of different GPUs.
    COUNT = "count"


class DirectRequests(StrEnum):
    """What the validating webhook does with a pod asking for the shared resource by hand."""

    ALLOW = "allow"
    DENY = "deny"


@dataclass(frozen=True)
class Pool:
    """A set of nodes offering the same slice of a GPU (one device-plugin config)."""

    name: str
    replicas: int
    gpu_memory_mib: int | None = None
    gpus_per_node: int | None = None
    node_selector: Mapping[str, str] = field(default_factory=frozen_map)
    # Name of the device-plugin config the GPU Operator selects with
    # ``nvidia.com/device-plugin.config=<name>``; defaults to the pool name.
    device_plugin_config: str | None = None

    @property
    def slice_fraction(self) -> float:
        return 1.0 / self.replicas

    @property
    def config_name(self) -> str:
        return self.device_plugin_config or self.name


@dataclass(frozen=True)
class WholeGpus:
    """Whole-GPU requests (``gpu-fraction: "2"``): no sharing, no sharing env."""

    resource_name: str = WHOLE_GPU_RESOURCE
    max: int = 8
    node_selector: Mapping[str, str] = field(default_factory=frozen_map)


@dataclass(frozen=True)
class Headroom:
    """Memory left for the CUDA context and libraries outside a framework's allocator."""

    fraction: float = 0.0
    memory_mib: int = 0

    def as_fraction(self, gpu_memory_mib: int | None) -> float | None:
        """The headroom as a share of a GPU; None where it needs GPU memory nobody declared."""
        if self.memory_mib == 0:
            return self.fraction
        if gpu_memory_mib is None:
            return None
        return self.memory_mib / gpu_memory_mib


@dataclass(frozen=True)
class FrameworkImages:
    """Which containers run a framework: image globs (None: the built-in official images of
    ``framework_images.DEFAULT_IMAGES``), and versions declared for images whose reference
    does not tell (glob, version) in order."""

    images: tuple[str, ...] | None = None
    versions: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TensorFlowKnobs(FrameworkImages):
    allow_growth: bool = True


@dataclass(frozen=True)
class JaxKnobs(FrameworkImages):
    memory_fraction: bool = True
    preallocate: bool | None = None


@dataclass(frozen=True)
class PyTorchKnobs(FrameworkImages):
    """``per_process_memory_fraction`` in the caching allocator's config.

    PyTorch before 2.10 refuses unknown allocator keys, so the knob is off unless enabled and
    goes only into images whose PyTorch version is known to be 2.10 or later.
    """

    memory_fraction: bool = False


@dataclass(frozen=True)
class Frameworks:
    # Framework env into the GPU container whatever its image (the PyTorch key still needs
    # a known version: it breaks older PyTorch).
    all_containers: bool = False
    tensorflow: TensorFlowKnobs = field(default_factory=TensorFlowKnobs)
    jax: JaxKnobs = field(default_factory=JaxKnobs)
    pytorch: PyTorchKnobs = field(default_factory=PyTorchKnobs)


class ServerMemory(StrEnum):
    """What gpushare does with an inference server's own GPU memory flag."""

    WARN = "warn"  # a warning when it asks more than the share
    SET = "set"  # the flag set to the share (appended when absent)
    IGNORE = "ignore"


@dataclass(frozen=True)
class InferenceServers:
    """vLLM (--gpu-memory-utilization) and SGLang (--mem-fraction-static) size themselves
    from flags; images whose entrypoint is the server (None: the built-in ones)."""

    memory: ServerMemory = ServerMemory.WARN
    vllm_images: tuple[str, ...] | None = None
    sglang_images: tuple[str, ...] | None = None


@dataclass(frozen=True)
class MpsSettings:
    """Client-side MPS limits; they can only tighten what the daemon allows."""

    enforce_thread_percentage: bool = True
    enforce_memory_limit: bool = True
    # Multiplies the thread share so idle SMs can be used (NVIDIA suggests up to 2x).
    thread_overprovision: float = 1.0


@dataclass(frozen=True)
class MpsDaemonSettings:
    """The project's own node-side MPS daemon (``gpushare mps-daemon``)."""

    pipe_directory: str = "/run/gpushare/mps/pipe"
    log_directory: str = "/run/gpushare/mps/log"
    ready_label: str = MPS_READY_LABEL
    host_ipc: bool = False
    set_exclusive_process: bool = True


# The driver name (and attribute domain) of NVIDIA's DRA driver, and its DeviceClass for
# whole GPUs (kubernetes-sigs/dra-driver-nvidia-gpu, templates/deviceclass-gpu.yaml).
NVIDIA_DRA_DRIVER = "gpu.nvidia.com"


class DraSharing(StrEnum):
    """The ``sharing.strategy`` of NVIDIA's ``GpuConfig``; NONE sends no config."""

    NONE = "None"
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"


@dataclass(frozen=True)
class DraSettings:
    """The ``dra`` mode: which devices a claim asks for, how much, and with what config."""

    device_class: str = NVIDIA_DRA_DRIVER
    driver: str = NVIDIA_DRA_DRIVER
    # The consumable capacity a share is asked as (NVIDIA: "memory", in bytes).
    capacity: str = "memory"
    # spec.gpuMemory: the memory a gpu-fraction is a share of (required by the rules).
    gpu_memory_mib: int = 0
    # Shares round up to this; one ResourceClaimTemplate per size in each namespace.
    granularity_mib: int = 1024
    product_names: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()
    min_gpu_memory_mib: int | None = None
    sharing: DraSharing = DraSharing.NONE
    time_slice_interval: str | None = None


@dataclass(frozen=True)
class Injections:
    """Extra values a policy adds to every pod it mutates."""

    env: tuple[tuple[str, str], ...] = ()
    labels: Mapping[str, str] = field(default_factory=frozen_map)
    annotations: Mapping[str, str] = field(default_factory=frozen_map)
    tolerations: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Match:
    namespaces: tuple[str, ...] = ()
    exclude_namespaces: tuple[str, ...] = ()
    pod_labels: Mapping[str, str] = field(default_factory=frozen_map)


@dataclass(frozen=True)
class Policy:
    name: str
    source: str
    mode: Mode
    pools: tuple[Pool, ...]
    match: Match = field(default_factory=Match)
    default: bool = False
    priority: int = 0
    resource_name: str = SHARED_GPU_RESOURCE
    allocation: Allocation = Allocation.REPLICA_CLASS
    min_fraction: float = 0.01
    max_fraction: float = 1.0
    whole_gpus: WholeGpus = field(default_factory=WholeGpus)
    headroom: Headroom = field(default_factory=Headroom)
    frameworks: Frameworks = field(default_factory=Frameworks)
    inference_servers: InferenceServers = field(default_factory=InferenceServers)
    mps: MpsSettings = field(default_factory=MpsSettings)
    mps_daemon: MpsDaemonSettings = field(default_factory=MpsDaemonSettings)
    dra: DraSettings = field(default_factory=DraSettings)
    inject: Injections = field(default_factory=Injections)
    # The other schemes' sections (``policy.schemes``); None for the NVIDIA plugin's modes.
    schemes: SchemeSettings | None = None
    direct_requests: DirectRequests = DirectRequests.DENY
    # GPU shares in the cluster's quotas (``policy.quota``, docs/quotas.md).
    quota: QuotaSettings = field(default_factory=QuotaSettings)
    # Limits the node enforces and what a pod may not set itself (``policy.enforcement``,
    # docs/enforcement.md).
    enforcement: EnforcementSettings = field(default_factory=EnforcementSettings)
    # A digest of the spec this policy was built from, recorded in each pod it mutates, so
    # a replica still serving another version can tell version skew from tampering.
    version: str = ""


@dataclass(frozen=True)
class PolicySet:
    """Every policy loaded from one place, plus the namespaces none of them may touch."""

    policies: tuple[Policy, ...]
    excluded_namespaces: frozenset[str] = frozenset(DEFAULT_EXCLUDED_NAMESPACES)
    sources: tuple[str, ...] = ()
    # The settings' own workload kinds (GpuSharingSettings.spec.workloadKinds).
    workload_kinds: tuple[WorkloadKind, ...] = ()

    @functools.cached_property
    def shared_resource_names(self) -> frozenset[str]:
        return frozenset(p.resource_name for p in self.policies)

    @functools.cached_property
    def gpu_resource_names(self) -> frozenset[str]:
        """Every resource a policy hands out, shared or whole."""
        return self.shared_resource_names | {p.whole_gpus.resource_name for p in self.policies}

    @functools.cached_property
    def selecting_label_keys(self) -> tuple[str, ...]:
        """The pod label keys any policy's match looks at."""
        return tuple(sorted({k for p in self.policies for k in p.match.pod_labels}))
