"""The objects that follow from the quotas the policies declare (``quota.namespaces``,
``quota.kueue``; docs/quotas.md), so that the numbers live in one place, the policies:

- per namespace of ``quota.namespaces``: a ResourceQuota ``gpushare-gpu-shares`` whose
  ``spec.hard`` limits ``requests.gpushare.io/milligpu``. Extended resources are limited
  under their ``requests.`` name only ("Quota for extended resources",
  https://kubernetes.io/docs/concepts/policy/resource-quotas/#quota-for-extended-resources);
- per ``quota.kueue``: a ClusterQueue of that name (namespaceSelector: exactly the listed
  namespaces) whose one resource group covers ``gpushare.io/milligpu`` and the section's
  other ``resources``, in the one ResourceFlavor ``gpushare``, and a LocalQueue of the same
  name in each listed namespace. The flavor has no nodeLabels: where a pod's share runs is
  gpushare's to choose, not Kueue's. kueue.x-k8s.io/v1beta2 is the version sigs.k8s.io/kueue
  v0.17.0 serves and stores (config/components/crd/bases/kueue.x-k8s.io_clusterqueues.yaml,
  _localqueues.yaml, _resourceflavors.yaml: v1beta1 is served, deprecated, not stored).

``gpushare webhook-config --quotas`` prints them; the Helm chart's templates/quotas.yaml
renders the same objects from the policies it installs (tests/test_helm_render.py compares).
Each object the policies declare names its policy and file in ``gpushare.io/declared-by``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from webhook.constants import DECLARED_BY_ANNOTATION, SHARE_RESOURCE
from webhook.core import Policy, PolicySet

RESOURCE_QUOTA_NAME = "gpushare-gpu-shares"
# The quota key of an extended resource: only `requests.` keys count its pods (a `limits.` key
# is accepted and counts nothing: k8s.io/kubernetes pkg/quota/v1/evaluator/core/pods.go
# isExtendedResourceNameForQuota).
QUOTA_KEY = f"requests.{SHARE_RESOURCE}"
FLAVOR_NAME = "gpushare"
KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"
# The apiserver labels every Namespace with its own name under this key.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def declared_by(policy: Policy) -> str:
    """The policy and the file it was read from (its name only: the chart's policies are
    files of its ConfigMap, the CLI's wherever --policies points)."""
    return f"policy {policy.name} in {PurePath(policy.source).name}"


def _metadata(
    name: str, labels: Mapping[str, str], policy: Policy | None, namespace: str | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = dict(labels)
    if policy is not None:
        metadata["annotations"] = {DECLARED_BY_ANNOTATION: declared_by(policy)}
    return metadata


def resource_quota(
    policy: Policy, namespace: str, milli_gpus: int, labels: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": _metadata(RESOURCE_QUOTA_NAME, labels, policy, namespace),
        "spec": {"hard": {QUOTA_KEY: str(milli_gpus)}},
    }


def resource_flavor(labels: Mapping[str, str]) -> dict[str, Any]:
    """The one flavor every declared ClusterQueue uses: no nodeLabels, so Kueue injects no
    node selection into the pods."""
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": _metadata(FLAVOR_NAME, labels, None),
        "spec": {},
    }


def kueue_objects(policy: Policy, labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """The ClusterQueue of ``policy.quota.kueue`` and a LocalQueue of the same name in each
    listed namespace (what a job's kueue.x-k8s.io/queue-name label names there); none
    without the section. Kueue's webhook wants each flavor's resources in the order of
    coveredResources (pkg/webhooks/clusterqueue_webhook.go validateFlavorQuotas): both list
    the share first, then the other resources by name."""
    kueue = policy.quota.kueue
    if kueue is None:
        return []
    quotas = {SHARE_RESOURCE: str(kueue.milli_gpus)}
    quotas |= {name: str(kueue.resources[name]) for name in sorted(kueue.resources)}
    # Null would admit no namespace and {} every one: exactly the listed ones.
    selector = {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": list(kueue.namespaces)}
    group = {
        "coveredResources": list(quotas),
        "flavors": [
            {
                "name": FLAVOR_NAME,
                "resources": [{"name": n, "nominalQuota": q} for n, q in quotas.items()],
            }
        ],
    }
    queue = {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "ClusterQueue",
        "metadata": _metadata(kueue.cluster_queue, labels, policy),
        "spec": {"namespaceSelector": {"matchExpressions": [selector]}, "resourceGroups": [group]},
    }
    local = [
        {
            "apiVersion": KUEUE_API_VERSION,
            "kind": "LocalQueue",
            "metadata": _metadata(kueue.cluster_queue, labels, policy, namespace),
            "spec": {"clusterQueue": kueue.cluster_queue},
        }
        for namespace in kueue.namespaces
    ]
    return [queue, *local]


def quota_objects(policies: PolicySet, labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every object the policies' quota sections declare, in the order to apply them: the
    ResourceQuotas (policy by policy, namespaces by name), then, if any policy declares a
    Kueue quota, the ResourceFlavor and each ClusterQueue followed by its LocalQueues (in
    the order listed). Empty when no policy declares any."""
    quotas: list[dict[str, Any]] = []
    queues: list[dict[str, Any]] = []
    for policy in policies.policies:
        declared = policy.quota.namespaces
        quotas += [
            resource_quota(policy, name, declared[name], labels) for name in sorted(declared)
        ]
        queues += kueue_objects(policy, labels)
    return [*quotas, *([resource_flavor(labels)] if queues else []), *queues]
