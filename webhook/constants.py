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

# -- Which container gets the GPU without CONTAINER_ANNOTATION (docs/annotations.md) ----------
# 1. the first container with one of these names: the name a controller gives (or requires
#    of) the container running the user's GPU code. Name -> whose it is.
GPU_CONTAINER_NAMES: dict[str, str] = {
    # argoproj/argo-workflows workflow/common/common.go MainContainerName: a step's own
    # container, beside the executor's "wait" container.
    "main": "Argo Workflows' main container",
    # kserve/kserve pkg/constants/constants.go InferenceServiceContainerName.
    "kserve-container": "KServe's predictor container",
    # kserve/kserve pkg/constants/constants.go WorkerContainerName: a multi-node predictor's
    # worker pods (docs/workload-kinds-facts.md, KServe).
    "worker-container": "KServe's multi-node worker container",
    # kubeflow/training-operator v1.8.1 MXJob's default container (mxjob_types.go).
    "mxnet": "MXJob's default container",
    # kubeflow/training-operator v1.9 pkg/apis/kubeflow.org/v1/*_types.go
    # <Kind>DefaultContainerName: the container the operator reads and sets env in
    # (PyTorchJob requires it: pytorch_validation.go).
    "pytorch": "PyTorchJob's default container",
    "tensorflow": "TFJob's default container",
    "xgboost": "XGBoostJob's default container",
    "paddle": "PaddleJob's default container",
    "jax": "JAXJob's default container",
    # kubeflow/trainer pkg/constants/constants.go Node: the trainer node's Job and container.
    "node": "Kubeflow Trainer's node container",
    # ray-project/kuberay ray-operator/controllers/ray/common/pod.go RayHeadContainer, and
    # the worker groups' name in KubeRay's samples (KubeRay itself reads container 0).
    "ray-head": "KubeRay's head container",
    "ray-worker": "KubeRay's worker container",
}
# 2. else the first container whose name is none of these: containers that injectors,
#    operators or conventions add beside the user's code, and that never use the GPU.
HELPER_CONTAINER_NAMES: dict[str, str] = {
    # argoproj/argo-workflows workflow/common/common.go WaitContainerName (the executor).
    "wait": "Argo Workflows' wait container",
    # istio/istio pkg/kube/inject/inject.go ProxyContainerName (first where the proxy must
    # start before the app: holdApplicationUntilProxyStarts).
    "istio-proxy": "Istio's sidecar",
    # knative/serving pkg/reconciler/revision/resources/constants.go QueueContainerName;
    # kserve/kserve pkg/constants/constants.go QueueProxyContainerName.
    "queue-proxy": "Knative's queue proxy",
    # kserve/kserve pkg/constants/constants.go AgentContainerName (logger, batcher).
    "agent": "KServe's agent",
    # linkerd/linkerd2 pkg/k8s/labels.go ProxyContainerName.
    "linkerd-proxy": "Linkerd's proxy",
    # hashicorp/vault-k8s agent-inject/agent/container_sidecar.go: the injected sidecar.
    "vault-agent": "Vault's agent",
    # GoogleCloudPlatform/cloud-sql-proxy examples/k8s-sidecar: the sidecar's name there.
    "cloud-sql-proxy": "Cloud SQL Auth Proxy",
    # brancz/kube-rbac-proxy, as kubebuilder's scaffold named the sidecar
    # (config/default/manager_auth_proxy_patch.yaml, until kubernetes-sigs/kubebuilder#3899
    # dropped it in 2024; operators scaffolded before keep it).
    "kube-rbac-proxy": "kube-rbac-proxy",
    # oauth2-proxy/oauth2-proxy: the usual sidecar name (no injector fixes it).
    "oauth2-proxy": "oauth2-proxy",
    # ray-project/kuberay ray-operator/controllers/ray/common/pod.go AutoscalerContainerName.
    "autoscaler": "KubeRay's autoscaler sidecar",
    # Log shippers' usual sidecar names (their projects' and charts' names).
    "fluent-bit": "a Fluent Bit log shipper",
    "fluentd": "a Fluentd log shipper",
}

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

# -- GPU shares in quota (docs/quotas.md) ------------------------------------------------------
# The extended resource a policy with ``quota.shareResource`` puts on every pod it admits:
# thousandths of one GPU, requests equal to limits (extended resources are whole numbers and
# never overcommitted), so a plain ResourceQuota (``requests.gpushare.io/milligpu``) and a
# Kueue ClusterQueue count GPU share whatever the scheme's own units. ``gpushare
# share-capacity`` advertises MILLI_GPUS_PER_GPU per GPU on each node for the scheduler.
SHARE_RESOURCE = f"{API_GROUP}/milligpu"
MILLI_GPUS_PER_GPU = 1000
# Showback: labels a cost tool can group pods by (the applied record has the same facts).
SHARE_LABEL = f"{API_GROUP}/milligpu"
POOL_LABEL = f"{API_GROUP}/pool"
GPU_MODEL_LABEL = f"{API_GROUP}/gpu-model"
GPU_MEMORY_LABEL = f"{API_GROUP}/gpu-memory-mib"
# On each ResourceQuota, ClusterQueue and LocalQueue emitted from a policy's quota section:
# "policy <name> in <file>", so an admin finds where the numbers live.
DECLARED_BY_ANNOTATION = f"{API_GROUP}/declared-by"

# -- Kubernetes --------------------------------------------------------------------------------
# The kubelet marks the API copy of a static pod with this annotation; admission cannot
# change such mirror pods (the kubelet recreates them from the file), so they are skipped.
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
# The pods of a LeaderWorkerSet group carry the group's size (its pods, leader included):
# sigs.k8s.io/lws api/leaderworkerset/v1/leaderworkerset_types.go SizeAnnotationKey, set on
# the leader and worker pod templates (pkg/controllers/leaderworkerset_controller.go,
# pod_controller.go) and read by the LWS pod webhook into LWS_GROUP_SIZE.
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
# KubeRay puts it on every pod of a RayCluster (head or worker): such a pod's inference
# server may run on the whole cluster's GPUs (ray-operator controllers/ray/common/pod.go).
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
LWS_GROUP_SIZE_VAR = "LWS_GROUP_SIZE"
# The control plane's own namespace: never touched, whatever the policies say.
ALWAYS_EXCLUDED_NAMESPACES: tuple[str, ...] = ("kube-system",)
# Namespaces excluded when the policies' GpuSharingSettings document names none; the one
# setting that feeds the server, policy selection and the generated webhook configurations.
DEFAULT_EXCLUDED_NAMESPACES: tuple[str, ...] = (
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "gpushare-system",
    # gpushare's MPS daemon and node agent (deploy/mps-daemon, deploy/node-agent): they reach
    # every GPU of their node through NVIDIA_VISIBLE_DEVICES, which policies refuse elsewhere.
    "gpushare-mps",
    "gpushare-node",
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
# How many physical GPUs the node has (GFD, internal/lm/resource.go: the full GPU count).
GFD_COUNT_LABEL = "nvidia.com/gpu.count"
# GKE's node label naming the GPU model of a node pool ("nvidia-l4", "nvidia-tesla-t4"...),
# the nodeSelector GKE's "Deploy GPU workloads in Autopilot" and "Run GPUs in Standard node
# pools" pages use.
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
# Node labels whose value names a GPU model: a value a pool declares gpuMemory for tells the
# memory of a pod's GPU where the pod selects that value.
GPU_MODEL_LABELS: tuple[str, ...] = (GFD_PRODUCT_LABEL, GKE_ACCELERATOR_LABEL)
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

# -- Kueue ---------------------------------------------------------------------------------------
# A workload Kueue manages names its LocalQueue in this label (sigs.k8s.io/kueue
# pkg/controller/constants QueueLabel); Kueue computes its demand from the pod templates when
# it creates the Workload, before any pod exists.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

# -- CUDA MPS ---------------------------------------------------------------------------------
MPS_THREAD_PERCENTAGE_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_MEMORY_LIMIT_VAR = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_LIMIT_VARS: tuple[str, ...] = (MPS_THREAD_PERCENTAGE_VAR, MPS_MEMORY_LIMIT_VAR)
# Where MPS clients find the control daemon's pipes.
MPS_PIPE_DIRECTORY_VAR = "CUDA_MPS_PIPE_DIRECTORY"

# -- Driver-enforced GPU memory (docs/enforcement.md) ------------------------------------------
# Read from the container's OCI spec by nvidia-container-toolkit's ``apply-cuda-memory-limits``
# CDI hook, which has the driver cap the container's cgroup: whole MiB, decimal, singular
# names (docs/enforcement.md cites the toolkit's source).
DRIVER_MEMORY_REQUEST_VAR = "NVIDIA_GPU_MEMORY_REQUEST"
DRIVER_MEMORY_LIMIT_VAR = "NVIDIA_GPU_MEMORY_LIMIT"
DRIVER_LIMIT_VARS: tuple[str, ...] = (DRIVER_MEMORY_REQUEST_VAR, DRIVER_MEMORY_LIMIT_VAR)
# Every variable whose value is a limit gpushare sets: in the GPU container always gpushare's.
LIMIT_VARS: tuple[str, ...] = (*DRIVER_LIMIT_VARS, *MPS_LIMIT_VARS)
# Device selection by env: the container runtime honours NVIDIA_VISIBLE_DEVICES where the
# device plugin passes devices that way (and an unprivileged container may set it unless the
# toolkit refuses it); CUDA_VISIBLE_DEVICES renumbers what CUDA sees. Set by hand they let a
# container reach GPUs the device plugin did not give it, or a different one than the
# limits were written for (policy ``enforcement.deviceVariables``).
DEVICE_VARS: tuple[str, ...] = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
# NVIDIA_VISIBLE_DEVICES values that expose no GPU (the toolkit: "void", "none", empty).
NO_DEVICE_VALUES: tuple[str, ...] = ("void", "none", "")
# Node label the node agent keeps on each GPU node: "true" while the node enforces the
# driver memory limit (driver, cgroup v2, the toolkit's hook in the device plugin's CDI
# spec), "false" otherwise; the reason it does not is in the annotation beside it.
DRIVER_LIMIT_LABEL = f"{API_GROUP}/driver-memory-limit"
DRIVER_LIMIT_REASON_ANNOTATION = f"{API_GROUP}/driver-memory-limit-reason"
# Beside them, what the node agent found, as JSON: driver version, cgroup hierarchy, the hook
# per GPU in the device plugin's CDI spec, the CDI kinds present, MPS readiness.
DRIVER_LIMIT_FACTS_ANNOTATION = f"{API_GROUP}/driver-memory-limit-facts"
