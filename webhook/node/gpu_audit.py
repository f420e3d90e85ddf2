"""The audit of what really runs on this node's GPUs: every process, whose it is, and what
is wrong with it. Pure: NVML's processes, their owners (``process_cgroups``) and the node's
pods (``pod_api``) in, a report out.

Findings, per process:

- ``uncapped``: a process of a pod gpushare gave a share, with nothing that holds its
  memory: no driver limit the node enforces (``NVIDIA_GPU_MEMORY_LIMIT`` on a node labelled
  ``gpushare.io/driver-memory-limit=true``), and not an MPS client (an MPS client is held to
  the daemon's default pinned limit at least, and to ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
  where set; a process that set the variable but never reached the daemon runs without it);
- ``over-share``: the memory its container uses on that GPU (its processes together: the
  driver limit is per cgroup) is above the least of its limits and its share of the GPU;
- ``unattributed``: a process in no pod of this node, on a shared GPU (one where a pod with
  a share runs, or any GPU of a node whose device plugin shares them).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from webhook.node.nvml import GpuDevice, GpuProcess
from webhook.node.pod_api import NodePod
from webhook.node.pod_limits import MIB, ContainerLimits, container_limits, gpu_container, has_share
from webhook.node.process_cgroups import ProcessOwner

UNCAPPED = "uncapped"
OVER_SHARE = "over-share"
UNATTRIBUTED = "unattributed"


@dataclass(frozen=True)
class AuditedProcess:
    """One process on one GPU, attributed as far as it can be."""

    gpu: GpuDevice
    process: GpuProcess
    pod: NodePod | None
    container: str | None
    limits: ContainerLimits | None


@dataclass(frozen=True)
class Finding:
    """Something wrong with one process; ``message`` is a full sentence."""

    kind: str
    audited: AuditedProcess
    message: str


@dataclass(frozen=True)
class AuditReport:
    processes: tuple[AuditedProcess, ...]
    findings: tuple[Finding, ...]

    def count(self, kind: str) -> int:
        return sum(1 for finding in self.findings if finding.kind == kind)


def audit(
    gpus: Sequence[GpuDevice],
    processes: Mapping[int, Sequence[GpuProcess]],
    owners: Mapping[int, ProcessOwner | None],
    pods: Sequence[NodePod],
    *,
    driver_limit_enforced: bool,
    node_shares_gpus: bool,
) -> AuditReport:
    """Attribute every process, then judge each one."""
    by_uid = {pod.uid: pod for pod in pods}
    audited = tuple(
        _attribute(gpu, process, owners.get(process.pid), by_uid)
        for gpu in gpus
        for process in processes.get(gpu.index, ())
    )
    shared = {a.gpu.index for a in audited if a.pod is not None and has_share(a.pod)}
    used = _container_use(audited)
    findings: list[Finding] = []
    for item in audited:
        if item.pod is None:
            if node_shares_gpus or item.gpu.index in shared:
                findings.append(_unattributed(item, owners.get(item.process.pid)))
            continue
        if not has_share(item.pod):
            continue
        if not _capped(item, driver_limit_enforced):
            findings.append(Finding(UNCAPPED, item, _uncapped_message(item, driver_limit_enforced)))
        over = _over_share(item, used[_container_key(item)])
        if over is not None:
            findings.append(over)
    return AuditReport(audited, tuple(findings))


def _attribute(
    gpu: GpuDevice,
    process: GpuProcess,
    owner: ProcessOwner | None,
    pods: Mapping[str, NodePod],
) -> AuditedProcess:
    pod = pods.get(owner.pod_uid) if owner is not None and owner.pod_uid else None
    if pod is None:
        return AuditedProcess(gpu, process, None, None, None)
    container = gpu_container(pod, owner.container_id if owner else None)
    limits = container_limits(pod, container, gpu.memory_mib * MIB)
    return AuditedProcess(gpu, process, pod, container.name if container else None, limits)


def _container_key(item: AuditedProcess) -> tuple[int, str, str | None]:
    return item.gpu.index, item.pod.uid if item.pod else "", item.container


def _container_use(audited: Sequence[AuditedProcess]) -> dict[tuple[int, str, str | None], int]:
    """Bytes each container uses on each GPU, its processes together."""
    used: dict[tuple[int, str, str | None], int] = defaultdict(int)
    for item in audited:
        used[_container_key(item)] += item.process.used_bytes or 0
    return used


def _capped(item: AuditedProcess, driver_limit_enforced: bool) -> bool:
    limits = item.limits
    by_driver = driver_limit_enforced and limits is not None and limits.driver_bytes is not None
    return by_driver or item.process.mps_client


def _where(item: AuditedProcess) -> str:
    pod = item.pod
    gpu = f"on GPU {item.gpu.index} ({item.gpu.uuid})"
    if pod is None:
        return f"Process {item.process.pid} {gpu}"
    container = f", container {item.container}" if item.container else ""
    return f"Process {item.process.pid} (pod {pod.namespace}/{pod.name}{container}) {gpu}"


def _uncapped_message(item: AuditedProcess, driver_limit_enforced: bool) -> str:
    limits = item.limits
    has_driver = limits is not None and limits.driver_bytes is not None
    has_mps = limits is not None and limits.mps_bytes is not None
    if has_driver and not driver_limit_enforced:
        why = (
            "has NVIDIA_GPU_MEMORY_LIMIT, but this node does not enforce the driver limit "
            "(see its gpushare.io/driver-memory-limit-reason annotation)"
        )
    elif has_mps:
        why = (
            "has CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, but is not an MPS client, so nothing applies it"
        )
    else:
        why = "has no GPU memory limit at all"
    return (
        f"{_where(item)} {why}: it can take the whole GPU from the pods sharing it. Have the "
        "policy require the driver limit (enforcement.driverMemoryLimit: require) or run "
        "the pod where MPS serves its GPU."
    )


def _over_share(item: AuditedProcess, used: int) -> Finding | None:
    bound = item.limits.tightest_bytes if item.limits else None
    if bound is None or used <= bound:
        return None
    message = (
        f"{_where(item)} belongs to a container that uses {used // MIB} MiB of the GPU, "
        f"more than the {bound // MIB} MiB its limit and share allow: its limit is not "
        "enforced here, or the container escapes it."
    )
    return Finding(OVER_SHARE, item, message)


def _unattributed(item: AuditedProcess, owner: ProcessOwner | None) -> Finding:
    if owner is None:
        whose = "whose cgroup could not be read (gone, or no hostPID)"
    elif owner.pod_uid is None:
        whose = f"in no pod (cgroup {owner.cgroup or '/'})"
    else:
        whose = f"of pod UID {owner.pod_uid}, which is not bound to this node"
    used = item.process.used_bytes
    amount = f"{used // MIB} MiB" if used is not None else "an unknown amount of memory"
    return Finding(
        UNATTRIBUTED,
        item,
        f"{_where(item)} is {whose} and uses {amount} of a shared GPU: stop it, or run "
        "it as a pod that asks for its share.",
    )
