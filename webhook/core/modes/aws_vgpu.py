"""AWS virtual-gpu-device-plugin: each GPU is ``vgpusPerGpu`` vGPUs (``--vgpu``, 10 by
default, at most 48 MPS clients: main.go) advertised as ``k8s.amazonaws.com/vgpu``
(pkg/gpu/nvidia/server.go), on nodes labelled ``k8s.amazonaws.com/accelerator=vgpu``.

One MPS daemon per node runs as the plugin's sidecar with a daemon-wide
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (10 in manifests/device-plugin.yml), so every client
gets that much compute whatever its vGPU count, and the plugin limits no memory. Pods need
``hostIPC: true`` and the daemon's pipe directory ``/tmp/nvidia-mps`` mounted (README), and
more than one vGPU per pod only works on single-GPU nodes (README, "Limitations").

A fraction becomes ceil(f x N) vGPUs; one finer than a vGPU is refused (the scheme cannot
express it). gpushare adds an MPS client memory limit where the policy declares gpuMemory
(client limits only tighten the daemon's: CUDA MPS docs), and framework env.
"""

from __future__ import annotations

from webhook.constants import (
    FRACTION_ANNOTATION,
    MPS_PIPE_DIRECTORY_VAR,
    MPS_THREAD_PERCENTAGE_VAR,
)
from webhook.core.modes.base import EnvSetting, ModeChanges, ModeProfile, frozen_record
from webhook.core.modes.client_limits import mps_limits
from webhook.core.modes.scheme_share import (
    EPSILON,
    SchemeMode,
    asked,
    read_share,
    scheme_placement,
    settings,
    units_up,
)
from webhook.core.placement import Placement, format_fraction
from webhook.core.policy.model import Mode, Policy
from webhook.core.request import GpuRequest

PIPE_VOLUME = "aws-vgpu-mps"


class AwsVirtualGpu(SchemeMode):
    mode = Mode.AWS_VGPU

    def place(self, policy: Policy, request: GpuRequest) -> Placement | list[str]:
        problems = self.device_problem(policy, request)
        if problems:
            return problems
        vgpu = settings(policy).aws_vgpu
        count = vgpu.vgpus_per_gpu
        share = read_share(policy, request)
        if isinstance(share, list):
            return share
        if share.fraction is None:
            return [
                f"{asked(request)} cannot be counted in vGPUs: policy {policy.name!r} "
                f"declares no gpuMemory (the memory of one GPU): ask with {FRACTION_ANNOTATION}, "
                "or set gpuMemory in the policy."
            ]
        if share.fraction + EPSILON < 1 / count:
            return [
                f"{asked(request)} is finer than one vGPU, 1/{count} of a GPU "
                f"(awsVgpu.vgpusPerGpu {count} of policy {policy.name!r}), which is the "
                f"smallest share the AWS plugin can give: ask for at least "
                f"{format_fraction(1 / count)}."
            ]
        vgpus = units_up(share.fraction * count, 1)
        if vgpus > 1 and not vgpu.single_gpu_nodes:
            return [
                f"{asked(request)} needs {vgpus} vGPUs, and the AWS plugin gives more than "
                "one vGPU to a pod only on nodes with one GPU (it may take them from "
                f"different GPUs): ask for at most {format_fraction(1 / count)}, or set "
                f"awsVgpu.singleGpuNodes: true in policy {policy.name!r} if every node has "
                "one GPU."
            ]
        note = (
            f"{vgpus} of {count} vGPUs per GPU = {format_fraction(vgpus / count)} of a GPU "
            f">= {format_fraction(share.fraction)} asked (ceil(f x {count}))"
        )
        return scheme_placement(policy, share, vgpus, count, note)

    def changes(self, policy: Policy, placement: Placement) -> ModeChanges:
        vgpu = settings(policy).aws_vgpu
        resources = ((vgpu.resource_name, placement.slots),)
        # Client limits: memory where gpuMemory is known; a thread percentage only where it
        # is below the daemon's (it can only tighten it).
        env = [
            limit
            for limit in mps_limits(policy, placement)
            if limit.name != MPS_THREAD_PERCENTAGE_VAR or int(limit.value) < vgpu.thread_percentage
        ]
        env.append(
            EnvSetting(
                MPS_PIPE_DIRECTORY_VAR,
                vgpu.pipe_directory,
                enforced=True,
                derivation=f"policy {policy.name!r} awsVgpu.pipeDirectory",
            )
        )
        warnings: tuple[str, ...] = ()
        if placement.slots > 1:
            warnings = (
                f"{placement.slots} vGPUs count for scheduling only: the AWS plugin's MPS "
                f"daemon gives every process {vgpu.thread_percentage}% of the SMs "
                "(awsVgpu.threadPercentage), whatever its vGPU count",
            )
        return ModeChanges(
            resources=resources,
            node_selector=vgpu.node_selector,
            env=tuple(env),
            volumes=(
                {
                    "name": PIPE_VOLUME,
                    "hostPath": {"path": vgpu.pipe_directory},
                },
            ),
            volume_mounts=({"name": PIPE_VOLUME, "mountPath": vgpu.pipe_directory},),
            host_ipc=True,
            record=frozen_record({"resources": dict(resources)}),
            explanation=(
                "hostIPC, the pipe directory mount: the AWS plugin's MPS daemon "
                "(aws-virtual-gpu-device-plugin README)",
            ),
            warnings=warnings,
        )

    def profile(self, policy: Policy) -> ModeProfile:
        vgpu = settings(policy).aws_vgpu
        memory = (
            "MPS client pinned-memory limit added by gpushare (gpuMemory declared)"
            if settings(policy).gpu_memory_mib is not None and policy.mps.enforce_memory_limit
            else "none (the plugin limits no memory; framework env only)"
        )
        return ModeProfile(
            isolation=f"compute: MPS daemon-wide {vgpu.thread_percentage}% per process; "
            f"memory: {memory}",
            node_requirements="aws-virtual-gpu-device-plugin DaemonSet "
            f"(--vgpu={vgpu.vgpus_per_gpu}) with its MPS sidecar, GPUs in EXCLUSIVE_PROCESS, "
            f"nodes labelled {', '.join(f'{k}={v}' for k, v in vgpu.node_selector.items())}; "
            "not beside the NVIDIA device plugin; pods get hostIPC",
        )
