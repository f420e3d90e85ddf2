"""Inference servers whose parallelism spans a whole Ray cluster, checked against it.

A vLLM or SGLang server started on a KubeRay cluster (``vllm serve ... -tp 4`` on the head,
with Ray as its executor) runs its workers on the cluster's GPUs, not only its own pod's:
one pod of such a cluster cannot be judged alone, so planning only warns for a pod that
carries KubeRay's ``ray.io/node-type`` label (``server_parallelism``). Where the whole
cluster is written (a RayCluster, RayJob or RayService: kinds whose table entry says
``gpusAcrossTemplates``), its GPUs are counted over every template, pods x GPUs each, and a
server that needs more than the whole cluster has is refused there, with the count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.constants import WHOLE_GPU_RESOURCE
from webhook.core.draft import as_mapping
from webhook.core.planning import UNPROCESSABLE, Denied, Planned
from webhook.core.server_parallelism import check_server_gpus
from webhook.core.verdict import Verdict
from webhook.core.workload_kinds import TemplateAt, WorkloadKind, pod_count
from webhook.core.workload_pods import owner_name, template_pod


def pod_gpus(decision: Any, pod: Mapping[str, Any]) -> int:
    """The GPUs one pod of a template gets: whole GPUs, the devices a share is on, or
    (left untouched) the ``nvidia.com/gpu`` its containers ask for by hand."""
    if isinstance(decision, Planned):
        record = decision.record
        if isinstance(record.get("gpus"), int):
            return int(record["gpus"])
        resources = as_mapping(record.get("resources"))
        if isinstance(resources.get(WHOLE_GPU_RESOURCE), int):
            return int(resources[WHOLE_GPU_RESOURCE])
        devices = record.get("devices")
        return devices if isinstance(devices, int) and devices > 0 else 1
    asked = 0
    for container in as_mapping(pod.get("spec")).get("containers") or ():
        limits = as_mapping(as_mapping(as_mapping(container).get("resources")).get("limits"))
        value = limits.get(WHOLE_GPU_RESOURCE)
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            asked += int(value)
    return asked


def cluster_gpus(
    document: Mapping[str, Any],
    found: Sequence[tuple[TemplateAt, Any, Mapping[str, Any] | None]],
) -> int:
    """Every GPU the workload's pods get at once: over its templates (each with its
    decision and the pod it makes), pods x GPUs each."""
    total = 0
    for at, decision, pod in found:
        if pod is None:
            continue
        try:
            count = pod_count(document, at, at.where)
        except ValueError:
            count = 1
        total += count * pod_gpus(decision, pod)
    return total


def short_of_cluster(
    document: Mapping[str, Any],
    kind: WorkloadKind,
    found: Sequence[tuple[TemplateAt, Verdict]],
    namespace: str,
) -> dict[int, Verdict]:
    """The templates (by index in ``found``) whose server needs more GPUs than the whole
    cluster gets, each with its denial."""
    if not kind.gpus_across_templates:
        return {}
    pods = [template_pod(document, kind, at, namespace) for at, _ in found]
    total = cluster_gpus(
        document, [(at, v.decision, pod) for (at, v), pod in zip(found, pods, strict=True)]
    )
    refused: dict[int, Verdict] = {}
    for index, ((_, verdict), pod) in enumerate(zip(found, pods, strict=True)):
        decision = verdict.decision
        if not isinstance(decision, Planned):
            continue
        container = _named(pod, str(decision.record.get("container", "")))
        server = check_server_gpus(container, 1) if container else None
        if server is None or server.unknown or server.needs <= total:
            continue
        settings = " x ".join(str(s) for s in server.settings)
        reason = (
            f"container {decision.record.get('container')!r}: {server.how} with {settings} "
            f"needs {server.needs} GPUs, but all the pods of {kind.kind} "
            f"{owner_name(document)!r} get {total} in all: give its worker groups the GPUs, "
            "or lower the server's parallelism"
        )
        denial = Denied((reason,), decision.policy.name, UNPROCESSABLE)
        refused[index] = Verdict(
            False, reasons=denial.reasons, code=UNPROCESSABLE, policy=denial.policy, decision=denial
        )
    return refused


def _named(pod: Mapping[str, Any] | None, name: str) -> Mapping[str, Any] | None:
    for container in as_mapping(as_mapping(pod).get("spec")).get("containers") or ():
        if as_mapping(container).get("name") == name:
            return as_mapping(container)
    return None
