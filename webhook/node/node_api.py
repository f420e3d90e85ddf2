"""This node's labels and annotations, read and patched through the Kubernetes API.

``NodeApi`` is the interface the supervisor needs: read the node's labels, and patch labels
and annotations (``None`` removes a key). ``KubernetesNodeApi`` (kube_node_api.py, apart
because it needs the Kubernetes client, the optional extra ``gpushare[cluster]``) implements
it with a JSON merge patch (RFC 7386) of ``metadata`` only: no read-modify-write, so it
cannot overwrite what other controllers (GPU Feature Discovery, the GPU Operator) write to the
same node between our read and our write, and a ``null`` value deletes a key.
RBAC: ``get`` and ``patch`` on ``nodes``, nothing else (deploy/mps-daemon/rbac.yaml).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

MERGE_PATCH = "application/merge-patch+json"


class NodeApi(Protocol):
    """Read and patch one Node's metadata."""

    @property
    def node_name(self) -> str: ...

    def read_labels(self) -> Mapping[str, str]:
        """The node's labels; ``errors.NodeApiError`` when the API cannot be read."""

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
