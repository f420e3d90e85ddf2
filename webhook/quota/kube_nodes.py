"""``NodeApi`` over the kubernetes client's public API: CoreV1Api and watch.Watch.

Every call has a timeout, the list is paged and bounded, a watch is closed by the server
after ``timeout_s`` (and by the client a little later, if the server does not) and asks for
bookmarks, so the resourceVersion it resumes from stays recent.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from webhook.constants import SHARE_RESOURCE
from webhook.quota.share_capacity import NodeApiError, NodeEvent, NodeShare, WatchExpiredError

# Bounds: a page of the node list (a Node is tens of KB of JSON: images, conditions) and the
# pages of one list (20,000 nodes, four times what Kubernetes supports).
PAGE_SIZE = 100
MAX_PAGES = 200
HTTP_GONE = 410
MERGE_PATCH = "application/merge-patch+json"


def node_share(node: Any) -> NodeShare:
    """A ``V1Node`` as the controller reads it."""
    metadata = node.metadata
    status = node.status
    capacity = (status.capacity if status else None) or {}
    allocatable = (status.allocatable if status else None) or {}
    return NodeShare(
        name=metadata.name,
        labels=dict(metadata.labels or {}),
        capacity=capacity.get(SHARE_RESOURCE),
        allocatable=allocatable.get(SHARE_RESOURCE),
    )


def _error(what: str, exc: Exception) -> NodeApiError:
    if isinstance(exc, ApiException):
        status = exc.status if isinstance(exc.status, int) else None
        kind = WatchExpiredError if status == HTTP_GONE else NodeApiError
        return kind(f"{what}: HTTP {exc.status}: {exc.reason}", status)
    return NodeApiError(f"{what}: {type(exc).__name__}: {exc}")


class KubeNodeApi:
    """The controller's calls on a kubernetes ``ApiClient`` (kubeconfig or in-cluster)."""

    def __init__(self, api_client: k8s.ApiClient, *, timeout_s: float = 15.0) -> None:
        self._api = api_client
        self._core = k8s.CoreV1Api(api_client)
        self._timeout_s = timeout_s

    def list_nodes(self) -> tuple[list[NodeShare], str]:
        nodes: list[NodeShare] = []
        token = ""
        for _ in range(MAX_PAGES):
            try:
                page = self._core.list_node(
                    limit=PAGE_SIZE, _continue=token or None, _request_timeout=self._timeout_s
                )
            except (ApiException, HTTPError, OSError) as exc:
                raise _error("list nodes", exc) from exc
            nodes += [node_share(node) for node in page.items or []]
            # The list's metadata as JSON: its "continue" token and resourceVersion.
            metadata = self._as_json(page.metadata)
            token = str(metadata.get("continue") or "")
            if not token:
                return nodes, str(metadata.get("resourceVersion") or "")
        raise NodeApiError(f"list nodes: more than {PAGE_SIZE * MAX_PAGES} nodes")

    def _as_json(self, model: Any) -> dict[str, Any]:
        """A client model as the API's JSON (camelCase keys)."""
        value = self._api.sanitize_for_serialization(model)  # type: ignore[no-untyped-call]
        return value if isinstance(value, dict) else {}

    def watch_nodes(self, resource_version: str, timeout_s: int) -> Iterator[NodeEvent]:
        watcher = k8s_watch.Watch()  # type: ignore[no-untyped-call]
        try:
            for event in watcher.stream(  # type: ignore[no-untyped-call]
                self._core.list_node,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_s,
                _request_timeout=timeout_s + self._timeout_s,
            ):
                kind = str(event["type"])
                raw = event.get("raw_object") or {}
                version = str((raw.get("metadata") or {}).get("resourceVersion") or "")
                node = None if kind == "BOOKMARK" else node_share(event["object"])
                yield NodeEvent(kind, node, version)
        except (ApiException, HTTPError, OSError) as exc:
            raise _error("watch nodes", exc) from exc
        finally:
            watcher.stop()  # type: ignore[no-untyped-call]

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> None:
        try:
            self._core.patch_node_status(
                name, dict(patch), _content_type=MERGE_PATCH, _request_timeout=self._timeout_s
            )
        except (ApiException, HTTPError, OSError) as exc:
            raise _error(f"patch node {name} status", exc) from exc
