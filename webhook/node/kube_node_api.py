"""``NodeApi`` (node_api.py) over the Kubernetes client, for the node the launcher runs on,
and the client itself from a kubeconfig or the pod's ServiceAccount (``connect_client``, also
the node agent's).

Apart from node_api.py because the client is an optional extra (``gpushare[cluster]``): the
launcher imports this module only when it starts, so the rest of ``webhook.node`` (the
device plugin configs) works without the client.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from webhook.node.errors import NodeApiError
from webhook.node.node_api import MERGE_PATCH, merge_patch_body


class KubernetesNodeApi:
    """``NodeApi`` over the kubernetes client, for the node named ``node_name``."""

    def __init__(
        self, api_client: k8s.ApiClient, node_name: str, *, timeout_s: float = 10.0
    ) -> None:
        self._core = k8s.CoreV1Api(api_client)
        self._node_name = node_name
        self._timeout_s = timeout_s

    @property
    def node_name(self) -> str:
        return self._node_name

    @classmethod
    def connect(
        cls, node_name: str, kubeconfig: Path | None, *, timeout_s: float = 10.0
    ) -> KubernetesNodeApi:
        """In-cluster config (the DaemonSet's ServiceAccount) unless a kubeconfig is given."""
        return cls(connect_client(kubeconfig), node_name, timeout_s=timeout_s)

    def read_labels(self) -> Mapping[str, str]:
        try:
            node = self._core.read_node(self._node_name, _request_timeout=self._timeout_s)
        except (ApiException, HTTPError) as exc:
            raise NodeApiError(f"Cannot read node {self._node_name}: {_describe(exc)}.") from exc
        metadata = node.metadata
        return dict((metadata.labels if metadata else None) or {})

    def patch_metadata(
        self,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> None:
        body = merge_patch_body(labels, annotations)
        if not body["metadata"]:
            return
        try:
            # The client picks application/json-patch+json for PATCH unless told otherwise
            # (kubernetes-client 37, CoreV1Api._patch_node_serialize), which would reject a
            # merge document; hence the explicit content type.
            self._core.patch_node(
                self._node_name,
                body,
                _content_type=MERGE_PATCH,
                _request_timeout=self._timeout_s,
            )
        except (ApiException, HTTPError) as exc:
            raise NodeApiError(f"Cannot patch node {self._node_name}: {_describe(exc)}.") from exc


def connect_client(kubeconfig: Path | None) -> k8s.ApiClient:
    """A client from ``kubeconfig``, or from the pod's ServiceAccount when None."""
    try:
        if kubeconfig is not None:
            return k8s_config.new_client_from_config(  # type: ignore[no-untyped-call,no-any-return]
                config_file=str(kubeconfig), persist_config=False
            )
        k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
        return k8s.ApiClient()
    except (k8s_config.ConfigException, OSError) as exc:
        where = str(kubeconfig) if kubeconfig else "the in-cluster service account"
        raise NodeApiError(
            f"Cannot configure a Kubernetes client from {where}: {exc}. Run inside the "
            "DaemonSet (with its ServiceAccount) or pass --kubeconfig."
        ) from exc


def _describe(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        hint = ""
        if exc.status == 403:
            hint = " (the ServiceAccount needs get and patch on nodes: deploy/mps-daemon)"
        return f"HTTP {exc.status} {exc.reason}{hint}"
    return f"{type(exc).__name__}: {exc}"
