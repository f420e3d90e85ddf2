"""The names gpushare shares with the cluster: annotations, labels, namespaces, resources.

Every part of the project (core, server, CLI, node side, install tools) reads these from
here, so a key is spelled once. Values are Kubernetes or NVIDIA facts; each group cites
where it comes from.
"""

from __future__ import annotations

# -- What a developer writes on a pod ----------------------------------------------------
FRACTION_ANNOTATION = "gpu-fraction"
MEMORY_ANNOTATION = "gpu-memory"
CONTAINER_ANNOTATION = "gpu-fraction-container-name"
# The share on each of this many GPUs, as KAI-Scheduler reads it (NVIDIA/KAI-Scheduler
# pkg/common/resources/gpu_sharing.go: GetNumGPUFractionDevices); modes that cannot give
# several GPUs refuse more than one.
DEVICES_ANNOTATION = "gpu-fraction-num-devices"
# Either one makes a pod gpushare's business; the webhook configurations' matchConditions
# send only pods carrying one of these.
REQUEST_ANNOTATIONS: tuple[str, ...] = (FRACTION_ANNOTATION, MEMORY_ANNOTATION)

# -- What gpushare writes -------------------------------------------------------------------
API_GROUP = "gpushare.io"
ANNOTATION_PREFIX = f"{API_GROUP}/"
# The record of what a pod got (policy, mode, fraction, pool, slots); its presence is how
# validation tells "mutated, then changed" from "never mutated".
APPLIED_ANNOTATION = f"{API_GROUP}/applied"
# Namespace label an admin sets to keep the webhooks away: gpushare.io/webhook=exclude.
OPT_OUT_LABEL = f"{API_GROUP}/webhook"
OPT_OUT_VALUE = "exclude"
# Node label the MPS daemon launcher sets only while its daemons serve.
MPS_READY_LABEL = f"{API_GROUP}/mps-ready"

# -- Kubernetes --------------------------------------------------------------------------------
# The kubelet marks the API copy of a static pod with this annotation; admission cannot
# change such mirror pods (the kubelet recreates them from the file), so they are skipped.
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
# The control plane's own namespace: never touched, whatever the policies say.
ALWAYS_EXCLUDED_NAMESPACES: tuple[str, ...] = ("kube-system",)
# Namespaces excluded when the policies' GpuSharingSettings document names none; the one
# setting that feeds the server, policy selection and the generated webhook configurations.
DEFAULT_EXCLUDED_NAMESPACES: tuple[str, ...] = (
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "gpushare-system",
)

# -- NVIDIA device plugin and GPU Feature Discovery --------------------------------------------
WHOLE_GPU_RESOURCE = "nvidia.com/gpu"
# The plugin's name for shared replicas under ``renameByDefault: true``
# (DefaultSharedRename: the resource name + ".shared").
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# Labels GFD sets from the plugin's sharing config.
GFD_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
GFD_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
# Labels GFD sets from the GPU itself (k8s-device-plugin v0.20.0, internal/lm/resource.go):
# the memory of one GPU in MiB (NVML's total / 2^20), and the product name ("-SHARED"
# appended where the sharing config keeps the resource name).
GFD_MEMORY_LABEL = "nvidia.com/gpu.memory"
GFD_PRODUCT_LABEL = "nvidia.com/gpu.product"
# The GPU Operator's config-manager picks a named device-plugin config by this node label.
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"

# Resource names of the sharing schemes gpushare knows; a container asking for one of them by
# hand besides the annotation would be counted twice.
KNOWN_GPU_RESOURCES: frozenset[str] = frozenset(
    {
        WHOLE_GPU_RESOURCE,
        SHARED_GPU_RESOURCE,
        "nvidia.com/gpumem",
        "nvidia.com/gpucores",
        "nvidia.com/gpumem-percentage",
        "k8s.amazonaws.com/vgpu",
        "tencent.com/vcuda-core",
        "tencent.com/vcuda-memory",
        "aliyun.com/gpu-mem",
        "aliyun.com/gpu-count",
    }
)

# -- CUDA MPS ---------------------------------------------------------------------------------
MPS_THREAD_PERCENTAGE_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_MEMORY_LIMIT_VAR = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_LIMIT_VARS: tuple[str, ...] = (MPS_THREAD_PERCENTAGE_VAR, MPS_MEMORY_LIMIT_VAR)
# Where MPS clients find the control daemon's pipes.
MPS_PIPE_DIRECTORY_VAR = "CUDA_MPS_PIPE_DIRECTORY"
