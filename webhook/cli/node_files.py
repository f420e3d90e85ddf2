"""``--nodes FILE``: a cluster's Node objects for the commands that say which pools have a
node enforcing the driver memory limit (``policy check``, ``plan``).

Read with the bounded manifest reader (``webhook.manifest``): what ``kubectl get nodes -o
yaml`` prints (a v1 ``List``), a ``NodeList`` from the API, or Node documents one after
another, YAML or JSON, ``-`` for stdin. Anything else in the file is refused, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.errors import ManifestError
from webhook.manifest import Document, read_manifests

HOW = "give the nodes as `kubectl get nodes -o yaml` prints them"


def _nodes_of(document: Document) -> list[Mapping[str, Any]]:
    content = document.content
    kind = content.get("kind") if isinstance(content, dict) else None
    if kind == "Node":
        return [content]
    if kind == "NodeList" and isinstance(content.get("items"), list):
        return [item for item in content["items"] if isinstance(item, dict)]
    what = f"a {kind}" if isinstance(kind, str) and kind else "a document without a kind"
    where = f"item {document.item + 1} of " if document.item is not None else ""
    at = f"{document.source}: line {document.line}"
    raise ManifestError(f"{at}: {where}the document is {what}, not a Node: {HOW}")


def read_nodes(path: str) -> list[Mapping[str, Any]]:
    """The Node objects in ``path``; ``ManifestError`` names what is not one."""
    try:
        documents = read_manifests([path])
    except ManifestError as error:
        raise ManifestError(f"--nodes: {error} ({HOW})") from error
    return [node for document in documents for node in _nodes_of(document)]
