"""This node's labels and annotations, read and patched through the Kubernetes API.

``NodeApi`` is the interface the supervisor needs: read the node's labels, and patch labels
and annotations (``None`` removes a key). ``KubernetesNodeApi`` implements it with the
kubernetes client and a JSON merge patch (RFC 7386) of ``metadata`` only: no read-modify-write,
so it cannot overwrite what other controllers (GPU Feature Discovery, the GPU Operator) write
to the same node between our read and our write, and a ``null`` value deletes a key.
RBAC: ``get`` and ``patch`` on ``nodes``, nothing else (deploy/mps-daemon/rbac.yaml).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from webhook.node.errors import NodeApiError

MERGE_PATCH = "application/merge-patch+json"


class NodeApi(Protocol):
    """Read and patch one Node's metadata."""

    @property
    def node_name(self) -> str: ...

    def read_labels(self) -> Mapping[str, str]:
        """The node's labels; NodeApiError when the API cannot be read."""

    def patch_metadata(
        self,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> None:
        """Set (value) or remove (None) labels and annotations; NodeApiError on failure."""


def merge_patch_body(
    labels: Mapping[str, str | None] | None, annotations: Mapping[str, str | None] | None
) -> dict[str, Any]:
    """The merge-patch document: only the keys given, ``null`` for the ones to remove."""
    metadata: dict[str, Any] = {}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"metadata": metadata}


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
        try:
            if kubeconfig is not None:
                api_client = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
                    config_file=str(kubeconfig), persist_config=False
                )
            else:
                k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
                api_client = k8s.ApiClient()
        except (k8s_config.ConfigException, OSError) as exc:
            where = str(kubeconfig) if kubeconfig else "the in-cluster service account"
            raise NodeApiError(
                f"Cannot configure a Kubernetes client from {where}: {exc}. Run inside the "
                "DaemonSet (with its ServiceAccount) or pass --kubeconfig."
            ) from exc
        return cls(api_client, node_name, timeout_s=timeout_s)

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


def _describe(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        hint = ""
        if exc.status == 403:
            hint = " (the ServiceAccount needs get and patch on nodes: deploy/mps-daemon)"
        return f"HTTP {exc.status} {exc.reason}{hint}"
    return f"{type(exc).__name__}: {exc}"
