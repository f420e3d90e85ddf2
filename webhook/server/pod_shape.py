"""The JSON types of the pod fields the core reads, checked before the core sees a pod.

A real apiserver only sends pods its Go types could decode, so a pod with ``metadata:
true`` or ``env: "x"`` comes from a hand-made or corrupted request; ``admission`` answers it
400 naming the first such field. Only fields the core reads are checked, and only their JSON
type; ``null`` counts as absent, as it does for the apiserver. Written out by hand rather
than as a JSON Schema: it runs on every admission (~10 us for a three-container pod), where
a generic validator costs more than the rest of the transport.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

QUANTITY_TYPES = (str, int, float)
CONTAINER_LISTS = ("containers", "initContainers")


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    names = {dict: "an object", list: "an array", str: "a string"}
    return next((name for kind, name in names.items() if isinstance(value, kind)), "null")


def _not(kind: str, where: str, value: Any) -> str:
    return f"{where} must be {kind}, not {_type_name(value)}."


def _string_map_problem(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if type(value) is not dict:
        return _not("an object", where, value)
    for key, item in value.items():
        if type(item) is not str:
            return _not("a string", f"{where}[{key!r}]", item)
    return None


def _objects_problem(value: Any, where: str) -> str | None:
    """An array whose items are objects (or null: absent)."""
    if value is None:
        return None
    if type(value) is not list:
        return _not("an array", where, value)
    for index, item in enumerate(value):
        if type(item) is not dict:
            return _not("an object", f"{where}[{index}]", item)
    return None


def _container_problem(container: dict[str, Any], where: str) -> str | None:
    for key in ("name", "image"):
        value = container.get(key)
        if value is not None and type(value) is not str:
            return _not("a string", f"{where}.{key}", value)
    env = container.get("env")
    problem = _objects_problem(env, f"{where}.env")
    if problem:
        return problem
    for index, variable in enumerate(env or ()):
        for key in ("name", "value"):
            value = variable.get(key)
            if value is not None and type(value) is not str:
                return _not("a string", f"{where}.env[{index}].{key}", value)
        value_from = variable.get("valueFrom")
        if value_from is not None and type(value_from) is not dict:
            return _not("an object", f"{where}.env[{index}].valueFrom", value_from)
    for key in ("envFrom", "volumeMounts"):
        problem = _objects_problem(container.get(key), f"{where}.{key}")
        if problem:
            return problem
    resources = container.get("resources")
    if resources is None:
        return None
    if type(resources) is not dict:
        return _not("an object", f"{where}.resources", resources)
    for section in ("limits", "requests"):
        quantities = resources.get(section)
        if quantities is None:
            continue
        if type(quantities) is not dict:
            return _not("an object", f"{where}.resources.{section}", quantities)
        for name, quantity in quantities.items():
            if type(quantity) not in QUANTITY_TYPES:
                return _not("a quantity string", f"{where}.resources.{section}[{name!r}]", quantity)
    return None


def pod_shape_problem(pod: Mapping[str, Any]) -> str | None:
    """The first field whose JSON type the core cannot use, as a sentence; None if none."""
    where = "request.object"
    metadata = pod.get("metadata")
    if metadata is not None:
        if type(metadata) is not dict:
            return _not("an object", f"{where}.metadata", metadata)
        for key in ("name", "generateName", "namespace"):
            value = metadata.get(key)
            if value is not None and type(value) is not str:
                return _not("a string", f"{where}.metadata.{key}", value)
        for key in ("labels", "annotations"):
            problem = _string_map_problem(metadata.get(key), f"{where}.metadata.{key}")
            if problem:
                return problem
    spec = pod.get("spec")
    if spec is None:
        return None
    if type(spec) is not dict:
        return _not("an object", f"{where}.spec", spec)
    for key in CONTAINER_LISTS:
        containers = spec.get(key)
        problem = _objects_problem(containers, f"{where}.spec.{key}")
        if problem:
            return problem
        for index, container in enumerate(containers or ()):
            problem = _container_problem(container, f"{where}.spec.{key}[{index}]")
            if problem:
                return problem
    problem = _string_map_problem(spec.get("nodeSelector"), f"{where}.spec.nodeSelector")
    if problem:
        return problem
    for key in ("tolerations", "volumes"):
        problem = _objects_problem(spec.get(key), f"{where}.spec.{key}")
        if problem:
            return problem
    host_ipc = spec.get("hostIPC")
    if host_ipc is not None and type(host_ipc) is not bool:
        return _not("a boolean", f"{where}.spec.hostIPC", host_ipc)
    return None
