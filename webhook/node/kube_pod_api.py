"""``PodApi`` (pod_api.py) over the Kubernetes client, for the node the agent runs on.

Apart from pod_api.py because the client is an optional extra (``gpushare[cluster]``): the
agent imports this module only when it starts. The pods come as JSON (``_preload_content``
off: the client's model objects are slower to build and say nothing more), filtered by the
apiserver to ``spec.nodeName=<node>``, so a node's agent reads its own pods only, as the
kubelet does. Events are core/v1 Events (what ``kubectl describe pod`` shows), with this
node as their source host.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from webhook.node.errors import PodApiError
from webhook.node.pod_api import NodePod, node_pod

COMPONENT = "gpushare-node-agent"
# Pods per node: the kubelet's default maxPods is 110; a node with more than this many is
# read in pages.
PAGE_SIZE = 500
# A bound on the pages of one list (10,000 pods, ~90 times the kubelet's default maxPods), so
# a server that kept answering with a continue token cannot hold the agent's round forever.
MAX_PAGES = 20


class KubernetesPodApi:
    """``PodApi`` over the kubernetes client, for the node named ``node_name``."""

    def __init__(
        self, api_client: k8s.ApiClient, node_name: str, *, timeout_s: float = 10.0
    ) -> None:
        # Untyped: with _preload_content=False the list returns the raw response, and the
        # Event goes as a plain dict (the client serialises dicts as they are).
        self._core: Any = k8s.CoreV1Api(api_client)
        self._node_name = node_name
        self._timeout_s = timeout_s

    def list_pods(self) -> list[NodePod]:
        pods: list[NodePod] = []
        token: str | None = None
        for _ in range(MAX_PAGES):
            page = self._page(token)
            pods.extend(p for p in map(node_pod, page.get("items") or []) if p is not None)
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                return pods
        raise PodApiError(
            f"Cannot list the pods of node {self._node_name}: the apiserver still had more "
            f"after {MAX_PAGES} pages of {PAGE_SIZE}; is the field selector honoured?"
        )

    def _page(self, token: str | None) -> dict[str, Any]:
        try:
            response = self._core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self._node_name}",
                limit=PAGE_SIZE,
                _continue=token,
                _preload_content=False,
                _request_timeout=self._timeout_s,
            )
            page = json.loads(response.data)
        except (ApiException, HTTPError, ValueError) as exc:
            raise PodApiError(
                f"Cannot list the pods of node {self._node_name}: {_describe(exc, 'list pods')}."
            ) from exc
        return page if isinstance(page, dict) else {}

    def warn(self, pod: NodePod, reason: str, message: str) -> None:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
            },
            "reason": reason,
            "message": message,
            "type": "Warning",
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": COMPONENT, "host": self._node_name},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._node_name,
        }
        try:
            self._core.create_namespaced_event(
                pod.namespace, body, _request_timeout=self._timeout_s
            )
        except (ApiException, HTTPError) as exc:
            raise PodApiError(
                f"Cannot raise event {reason} on pod {pod.namespace}/{pod.name}: "
                f"{_describe(exc, 'create events')}."
            ) from exc


def _describe(exc: Exception, verb: str) -> str:
    if isinstance(exc, ApiException):
        hint = ""
        if exc.status == 403:
            hint = f" (the ServiceAccount needs {verb}: deploy/node-agent/rbac.yaml)"
        return f"HTTP {exc.status} {exc.reason}{hint}"
    # Without its own final stop: the callers end the sentence.
    return f"{type(exc).__name__}: {str(exc).rstrip('.')}"
