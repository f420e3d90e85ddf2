"""``KubernetesPodApi`` without a cluster: the CoreV1Api under it replaced by a recorder.

What it asks the apiserver (every pod bound to this node, by field selector, in bounded pages
followed to the end), how it reads the answer, the Event it creates, and how refusals come
back. tests/e2e/test_node_agent_cluster.py runs it against a real apiserver.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from agent_fakes import pod_json
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from webhook.node.errors import PodApiError
from webhook.node.kube_pod_api import MAX_PAGES, PAGE_SIZE, KubernetesPodApi
from webhook.node.pod_api import node_pod


@dataclass
class Response:
    data: bytes


@dataclass
class RecordingCore:
    """The two CoreV1Api calls the pod API makes; pages served in order."""

    pages: list[Any] = field(default_factory=list)
    lists: list[dict[str, Any]] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    error: Exception | None = None

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Response:
        self.lists.append(kwargs)
        if self.error is not None:
            raise self.error
        page = self.pages.pop(0)
        return Response(page if isinstance(page, bytes) else json.dumps(page).encode())

    def create_namespaced_event(self, namespace: str, body: Any, **kwargs: Any) -> None:
        if self.error is not None:
            raise self.error
        self.events.append((namespace, body, kwargs))


@pytest.fixture
def core(monkeypatch: pytest.MonkeyPatch) -> RecordingCore:
    recorder = RecordingCore()
    monkeypatch.setattr(k8s, "CoreV1Api", lambda client: recorder)  # kube_pod_api's k8s
    return recorder


@pytest.fixture
def api(core: RecordingCore) -> Iterator[KubernetesPodApi]:
    client = k8s.ApiClient()
    try:
        yield KubernetesPodApi(client, "gpu-node-1", timeout_s=4.0)
    finally:
        client.close()


def page(*pods: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    metadata = {"continue": token} if token is not None else {}
    return {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": list(pods)}


def test_the_list_asks_for_this_nodes_pods_in_pages_and_follows_them_to_the_end(
    api: KubernetesPodApi, core: RecordingCore
) -> None:
    core.pages = [
        page(pod_json("a", 1), pod_json("b", 2), token="page-2"),
        page({"metadata": {"name": "no-uid"}}, pod_json("c", 3), token="page-3"),
        page(token=""),  # the last page: an empty token ends it
    ]
    pods = api.list_pods()
    assert [p.name for p in pods] == ["a", "b", "c"]  # what is not a pod is left out
    assert pods[0].containers[0].container_id == f"{1:064x}"
    assert [call["_continue"] for call in core.lists] == [None, "page-2", "page-3"]
    for call in core.lists:
        assert call["field_selector"] == "spec.nodeName=gpu-node-1"
        assert call["limit"] == PAGE_SIZE
        assert call["_preload_content"] is False
        assert call["_request_timeout"] == 4.0


def test_a_server_that_never_ends_the_list_is_an_error_not_a_hang(
    api: KubernetesPodApi, core: RecordingCore
) -> None:
    core.pages = [page(pod_json("a", 1), token="again") for _ in range(MAX_PAGES + 5)]
    with pytest.raises(PodApiError, match=f"still had more after {MAX_PAGES} pages"):
        api.list_pods()
    assert len(core.lists) == MAX_PAGES


def test_a_page_without_metadata_or_items_is_the_last(
    api: KubernetesPodApi, core: RecordingCore
) -> None:
    core.pages = [{"kind": "PodList"}]
    assert api.list_pods() == []
    core.pages = [["not", "a", "list object"]]
    assert api.list_pods() == []
    assert len(core.lists) == 2


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            ApiException(status=403, reason="Forbidden"),
            "Cannot list the pods of node gpu-node-1: HTTP 403 Forbidden (the ServiceAccount "
            "needs list pods: deploy/node-agent/rbac.yaml).",
        ),
        (
            ApiException(status=500, reason="Internal Server Error"),
            "Cannot list the pods of node gpu-node-1: HTTP 500 Internal Server Error.",
        ),
        (
            ProtocolError("connection reset"),
            "Cannot list the pods of node gpu-node-1: ProtocolError: connection reset.",
        ),
    ],
)
def test_a_failed_list_is_one_pod_api_error(
    api: KubernetesPodApi, core: RecordingCore, error: Exception, said: str
) -> None:
    core.error = error
    with pytest.raises(PodApiError) as raised:
        api.list_pods()
    assert str(raised.value) == said


def test_an_answer_that_is_not_json_is_a_pod_api_error(
    api: KubernetesPodApi, core: RecordingCore
) -> None:
    core.pages = [b"<html>proxy error</html>"]
    with pytest.raises(PodApiError, match="Cannot list the pods of node gpu-node-1: "):
        api.list_pods()


def test_the_warning_is_a_core_v1_event_on_the_pod_from_this_node(
    api: KubernetesPodApi, core: RecordingCore
) -> None:
    pod = node_pod(pod_json("planted", 2))
    assert pod is not None
    api.warn(pod, "GpuMemoryUncapped", "Process 102 has no GPU memory limit at all.")
    ((namespace, body, kwargs),) = core.events
    assert namespace == "ml" and kwargs == {"_request_timeout": 4.0}
    assert body["metadata"] == {"generateName": "planted.", "namespace": "ml"}
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "planted",
        "namespace": "ml",
        "uid": pod.uid,
    }
    assert (body["type"], body["reason"], body["count"]) == ("Warning", "GpuMemoryUncapped", 1)
    assert body["message"] == "Process 102 has no GPU memory limit at all."
    assert body["source"] == {"component": "gpushare-node-agent", "host": "gpu-node-1"}
    assert (body["reportingComponent"], body["reportingInstance"]) == (
        "gpushare-node-agent",
        "gpu-node-1",
    )
    assert body["firstTimestamp"] == body["lastTimestamp"]
    assert body["firstTimestamp"].endswith("Z")


def test_a_refused_event_is_a_pod_api_error_naming_the_verb(
    api: KubernetesPodApi, core: RecordingCore
) -> None:
    pod = node_pod(pod_json("planted", 2))
    assert pod is not None
    core.error = ApiException(status=403, reason="Forbidden")
    with pytest.raises(PodApiError) as raised:
        api.warn(pod, "GpuMemoryOverShare", "over")
    assert str(raised.value) == (
        "Cannot raise event GpuMemoryOverShare on pod ml/planted: HTTP 403 Forbidden (the "
        "ServiceAccount needs create events: deploy/node-agent/rbac.yaml)."
    )
