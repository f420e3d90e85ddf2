"""Workloads from a live cluster: its pods, read through the ``kubernetes`` client, its
ResourceQuotas on GPU shares (``quota_input``) and its nodes (which pools have one that
enforces the driver memory limit: ``enforcement``).

Bounded: pages of 500 pods (``limit`` and ``continue``, as kubectl pages), a connect and a
read timeout on every call, at most 200,000 pods (10,000 ResourceQuotas, 50,000 nodes) and
an overall deadline per list. Only pods that hold or wait for a GPU now count: Pending and Running
ones, not Succeeded or Failed. A quota's ``used`` counts those same pods, so what they hold
now (their ``gpushare.io/milligpu`` requests) is the plan's to re-plan: ``held_now``. A user
who may list pods but not ResourceQuotas (or nodes) gets the plan without the quota check
(or the enforcing nodes), and a note.

The pods are mutated already, and the point is to ask what they would take under each
scheme, so each is turned back into what its author wrote: what gpushare recorded
(``gpushare.io/applied``) and every known GPU resource (``KNOWN_GPU_RESOURCES``, the
policies' own names, and the share resource, which a policy without ``quota.shareResource``
would refuse as a direct request) go, and the binding (``nodeName``) and status too; the
annotations stay, so the core reads the same request. Pods of one controller with the same
template count as one workload of that many pods.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from webhook.constants import APPLIED_ANNOTATION, KNOWN_GPU_RESOURCES, SHARE_RESOURCE
from webhook.errors import GpushareError
from webhook.plan.quota_input import pod_share, quotas_of, with_held_now
from webhook.plan.workload import PlanInput, Workload

PAGE_SIZE = 500
MAX_PODS = 200_000
MAX_QUOTAS = 10_000
# Kubernetes' own scalability limit is 5,000 nodes per cluster.
MAX_NODES = 50_000
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
DEADLINE_S = 300.0
ACTIVE_PHASES = {"Pending", "Running", None}


class ClusterError(GpushareError):
    """The cluster could not be read: what failed and what to check."""


def _clean_container(container: Mapping[str, Any], gpu_resources: frozenset[str]) -> Any:
    if not isinstance(container, dict):
        return container
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return container
    cleaned = {
        section: {k: v for k, v in values.items() if k not in gpu_resources}
        if isinstance(values, dict)
        else values
        for section, values in resources.items()
    }
    return {**container, "resources": cleaned}


def authored_pod(pod: Mapping[str, Any], gpu_resources: frozenset[str]) -> dict[str, Any]:
    """The pod as its author wrote it, as far as the GPU goes (see the module docstring)."""
    metadata = dict(pod.get("metadata") or {})
    annotations = dict(metadata.get("annotations") or {})
    annotations.pop(APPLIED_ANNOTATION, None)
    metadata["annotations"] = annotations
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"):
        metadata.pop(key, None)
    spec = dict(pod.get("spec") or {})
    spec.pop("nodeName", None)
    for section in ("containers", "initContainers"):
        if isinstance(spec.get(section), list):
            spec[section] = [_clean_container(c, gpu_resources) for c in spec[section]]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _owner(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    for reference in metadata.get("ownerReferences") or ():
        if isinstance(reference, dict) and reference.get("controller"):
            return f"{reference.get('kind')}/{metadata.get('namespace')}/{reference.get('name')}"
    return f"Pod/{metadata.get('namespace')}/{metadata.get('name')}"


def group_pods(pods: Iterable[Mapping[str, Any]], gpu_resources: frozenset[str]) -> list[Workload]:
    """Active pods as workloads: one per controller and template, counted."""
    gpu_resources = gpu_resources | {SHARE_RESOURCE}
    workloads: dict[tuple[str, bytes], Workload] = {}
    for pod in pods:
        if (pod.get("status") or {}).get("phase") not in ACTIVE_PHASES:
            continue
        authored = authored_pod(pod, gpu_resources)
        namespace = str(authored["metadata"].get("namespace") or "default")
        owner = _owner(pod)
        single = Workload(owner, namespace, authored, 1, "cluster")
        key = (owner, single.same_pods_key)
        known = workloads.get(key)
        workloads[key] = single if known is None else _more(known)
    return list(workloads.values())


def _more(workload: Workload) -> Workload:
    return Workload(
        workload.name, workload.namespace, workload.document, workload.count + 1, workload.source
    )


def list_pods(api: Any, namespace: str | None, label_selector: str | None) -> list[Any]:
    """Every pod (of ``namespace``, or all), page by page, within the bounds."""
    from kubernetes import client as k8s  # the cluster input alone needs the client

    # Untyped here: with _preload_content=False the calls return the raw response.
    core: Any = k8s.CoreV1Api(api)
    return _list_all(
        lambda **options: (
            core.list_namespaced_pod(namespace, **options)
            if namespace
            else core.list_pod_for_all_namespaces(**options)
        ),
        label_selector,
        "pods",
        MAX_PODS,
    )


def list_resource_quotas(api: Any, namespace: str | None) -> list[Any]:
    """Every ResourceQuota (of ``namespace``, or all), page by page, within the bounds."""
    from kubernetes import client as k8s

    core: Any = k8s.CoreV1Api(api)
    return _list_all(
        lambda **options: (
            core.list_namespaced_resource_quota(namespace, **options)
            if namespace
            else core.list_resource_quota_for_all_namespaces(**options)
        ),
        None,
        "ResourceQuotas",
        MAX_QUOTAS,
    )


def list_nodes(api: Any) -> list[Any]:
    """Every node, page by page, within the bounds."""
    from kubernetes import client as k8s

    core: Any = k8s.CoreV1Api(api)
    return _list_all(core.list_node, None, "nodes", MAX_NODES)


def _list_all(
    call: Callable[..., Any], label_selector: str | None, noun: str, most: int
) -> list[Any]:
    items: list[Any] = []
    token: str | None = None
    started = time.monotonic()
    while True:
        options: dict[str, Any] = {
            "limit": PAGE_SIZE,
            "_request_timeout": (CONNECT_TIMEOUT_S, READ_TIMEOUT_S),
            "_preload_content": False,
        }
        if token:
            options["_continue"] = token
        if label_selector:
            options["label_selector"] = label_selector
        page = json.loads(call(**options).data)
        items += page.get("items") or []
        if len(items) > most:
            raise ClusterError(
                f"the cluster has more than {most:,} {noun}; narrow it with -n or -l"
            )
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items
        if time.monotonic() - started > DEADLINE_S:
            raise ClusterError(
                f"listing {noun} took over {DEADLINE_S:.0f}s; narrow it with -n or -l"
            )


def held_now(pods: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """What the active pods hold of their namespaces' share quotas now, per namespace."""
    held: dict[str, int] = {}
    for pod in pods:
        if (pod.get("status") or {}).get("phase") not in ACTIVE_PHASES:
            continue
        share = pod_share(pod)
        if share:
            namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
            held[namespace] = held.get(namespace, 0) + share
    return held


def read_cluster(
    kubeconfig: str | None,
    context: str | None,
    namespace: str | None,
    label_selector: str | None,
    gpu_resources: frozenset[str],
) -> PlanInput:
    """The cluster's active pods as workloads, and its ResourceQuotas on GPU shares;
    ``ClusterError`` says what failed."""
    from kubernetes import config
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        load: Any = config.new_client_from_config  # untyped in the client
        api = load(config_file=kubeconfig, context=context)
    except (config.ConfigException, OSError, TypeError, ValueError) as error:
        raise ClusterError(
            f"cannot load the kubeconfig {kubeconfig or '(default)'}: {error}"
        ) from error
    notes: list[str] = []
    try:
        with api:
            pods = list_pods(api, namespace, label_selector)
            try:
                quotas = list_resource_quotas(api, namespace)
            except ApiException as error:
                quotas = []
                notes.append(
                    f"listing ResourceQuotas failed ({error.status} {error.reason}): no quota "
                    "on GPU shares is checked; let the kubeconfig's user list resourcequotas"
                )
            try:
                nodes: tuple[Any, ...] | None = tuple(list_nodes(api))
            except ApiException as error:
                nodes = None
                notes.append(
                    f"listing nodes failed ({error.status} {error.reason}): which pools have "
                    "a node enforcing the driver memory limit is not checked; let the "
                    "kubeconfig's user list nodes, or pass --nodes FILE"
                )
    except ApiException as error:
        raise ClusterError(
            f"listing pods failed: {error.status} {error.reason}; check the kubeconfig's "
            "user may list pods"
        ) from error
    except (HTTPError, OSError) as error:
        raise ClusterError(f"cannot reach the cluster: {error}") from error
    found = quotas_of((quota, "cluster") for quota in quotas)
    return PlanInput(
        group_pods(pods, gpu_resources | KNOWN_GPU_RESOURCES),
        with_held_now(found, held_now(pods)),
        tuple(notes),
        nodes,
    )
