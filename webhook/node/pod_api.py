"""The pods on this node, as the node agent's audit needs them, and the Events it raises.

``PodApi`` is the interface: list the pods bound to this node, and raise a Warning Event on
one. ``KubernetesPodApi`` (kube_pod_api.py, apart because it needs the Kubernetes client)
implements it with a list filtered by ``spec.nodeName`` and core/v1 Events. RBAC: ``list``
on ``pods``, ``create`` on ``events`` (deploy/node-agent/rbac.yaml).

``node_pod`` reads a Pod's JSON into ``NodePod``: what gpushare gave it (the
``gpushare.io/applied`` record), and per container its runtime ID (from
``status.containerStatuses``) and the literal values of its ``env`` (``valueFrom`` entries
are not the pod's own numbers and are left out).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from webhook.constants import APPLIED_ANNOTATION


@dataclass(frozen=True)
class PodContainer:
    """One container: its name, runtime ID without the ``containerd://`` scheme (None
    before it started), and its literal env."""

    name: str
    container_id: str | None
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodePod:
    """One pod on this node."""

    namespace: str
    name: str
    uid: str
    # The gpushare.io/applied record; None for a pod gpushare did not mutate.
    applied: Mapping[str, Any] | None
    containers: tuple[PodContainer, ...] = ()

    def container(self, name: str | None) -> PodContainer | None:
        return next((c for c in self.containers if c.name == name), None)

    def container_by_id(self, container_id: str | None) -> PodContainer | None:
        if container_id is None:
            return None
        return next((c for c in self.containers if c.container_id == container_id), None)


class PodApi(Protocol):
    """List this node's pods; raise a Warning Event on one."""

    def list_pods(self) -> list[NodePod]:
        """Every pod bound to this node; ``errors.PodApiError`` when the API cannot answer."""

    def warn(self, pod: NodePod, reason: str, message: str) -> None:
        """A Warning Event on ``pod``; PodApiError on failure."""


def node_pod(raw: Mapping[str, Any]) -> NodePod | None:
    """A Pod's JSON as a ``NodePod``; None for what is not a pod (no name or UID)."""
    metadata = _mapping(raw.get("metadata"))
    name, uid = metadata.get("name"), metadata.get("uid")
    if not isinstance(name, str) or not isinstance(uid, str):
        return None
    ids = _container_ids(_mapping(raw.get("status")))
    spec = _mapping(raw.get("spec"))
    containers = tuple(
        PodContainer(str(c["name"]), ids.get(str(c["name"])), _literal_env(c.get("env")))
        for c in _list(spec.get("containers"))
        if isinstance(c, Mapping) and isinstance(c.get("name"), str)
    )
    return NodePod(
        namespace=str(metadata.get("namespace") or "default"),
        name=name,
        uid=uid,
        applied=_applied(_mapping(metadata.get("annotations")).get(APPLIED_ANNOTATION)),
        containers=containers,
    )


def _applied(text: object) -> Mapping[str, Any] | None:
    if not isinstance(text, str):
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _container_ids(status: Mapping[str, Any]) -> dict[str, str]:
    """Container name -> runtime ID ("containerd://<id>" -> "<id>")."""
    ids: dict[str, str] = {}
    for entry in _list(status.get("containerStatuses")):
        if isinstance(entry, Mapping) and isinstance(entry.get("containerID"), str):
            ids[str(entry.get("name"))] = entry["containerID"].rpartition("://")[2]
    return ids


def _literal_env(env: object) -> dict[str, str]:
    return {
        str(item["name"]): str(item["value"])
        for item in _list(env)
        if isinstance(item, Mapping) and "name" in item and isinstance(item.get("value"), str)
    }


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
