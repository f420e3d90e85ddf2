"""The JSON types of the pod fields the core reads, checked before the core sees a pod.

A real apiserver only sends pods its Go types could decode, so a pod with ``metadata:
true`` or ``env: "x"`` comes from a hand-made or corrupted request or manifest: the server
answers it 400 and ``gpushare mutate`` refuses it, each naming the first such field. Only
fields the core reads are checked, and only their JSON type; ``null`` counts as absent, as
it does for the apiserver. Written out by hand rather than as a JSON Schema: it runs on
every admission, where a generic validator costs more than the rest of the transport.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

QUANTITY_TYPES = (str, int, float)


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    names = {dict: "an object", list: "an array", str: "a string"}
    return next((name for kind, name in names.items() if isinstance(value, kind)), "null")


def _not(kind: str, where: str, value: Any) -> str:
    return f"{where} must be {kind}, not {_type_name(value)}."


# The checks run on every admission, so they are written for the common case, a well-typed
# pod: a type test per field, plain loops, few calls. Where a problem is found they return
# its path (keys; ints for array items; 1-tuples for map keys), the JSON type expected and
# the value found, and only then is the sentence put together.
Step = str | int | tuple[str]
Problem = tuple[tuple[Step, ...], str, Any]

OBJECT, ARRAY, STRING = "an object", "an array", "a string"


def _at(items: list[Any], item: Any) -> int:
    """The index of ``item`` (this very object) in ``items``."""
    return next(index for index, candidate in enumerate(items) if candidate is item)


def _string_map(value: Any) -> Problem | None:
    if type(value) is not dict:
        return (), OBJECT, value
    for key, item in value.items():
        if type(item) is not str:
            return ((key,),), STRING, item
    return None


def _objects(value: Any) -> Problem | None:
    """An array whose items are objects."""
    if type(value) is not list:
        return (), ARRAY, value
    for item in value:
        if type(item) is not dict:
            return (_at(value, item),), OBJECT, item
    return None


def _strings(value: Any) -> Problem | None:
    """An array whose items are strings (a container's command and args)."""
    if type(value) is not list:
        return (), ARRAY, value
    for index, item in enumerate(value):
        if type(item) is not str:
            return (index,), STRING, item
    return None


def _env(env: Any) -> Problem | None:
    if type(env) is not list:
        return (), ARRAY, env
    for variable in env:
        if type(variable) is not dict:
            return (_at(env, variable),), OBJECT, variable
        get = variable.get
        name, value, value_from = get("name"), get("value"), get("valueFrom")
        if name is not None and type(name) is not str:
            return (_at(env, variable), "name"), STRING, name
        if value is not None and type(value) is not str:
            return (_at(env, variable), "value"), STRING, value
        if value_from is not None and type(value_from) is not dict:
            return (_at(env, variable), "valueFrom"), OBJECT, value_from
    return None


def _resources(resources: Any) -> Problem | None:
    if type(resources) is not dict:
        return (), OBJECT, resources
    for section in ("limits", "requests"):
        quantities = resources.get(section)
        if quantities is None:
            continue
        if type(quantities) is not dict:
            return (section,), OBJECT, quantities
        for name, quantity in quantities.items():
            if type(quantity) not in QUANTITY_TYPES:
                return (section, (name,)), "a quantity string", quantity
    claims = resources.get("claims")
    if claims is not None and (found := _objects(claims)) is not None:
        return ("claims", *found[0]), found[1], found[2]
    return None


def _container(container: dict[str, Any]) -> Problem | None:
    get = container.get
    name, image, env = get("name"), get("image"), get("env")
    env_from, mounts, resources = get("envFrom"), get("volumeMounts"), get("resources")
    command, args = get("command"), get("args")
    if name is not None and type(name) is not str:
        return ("name",), STRING, name
    if image is not None and type(image) is not str:
        return ("image",), STRING, image
    found = None
    if env is not None and (found := _env(env)) is not None:
        key = "env"
    elif env_from is not None and (found := _objects(env_from)) is not None:
        key = "envFrom"
    elif mounts is not None and (found := _objects(mounts)) is not None:
        key = "volumeMounts"
    elif resources is not None and (found := _resources(resources)) is not None:
        key = "resources"
    elif command is not None and (found := _strings(command)) is not None:
        key = "command"
    elif args is not None and (found := _strings(args)) is not None:
        key = "args"
    else:
        return None
    return (key, *found[0]), found[1], found[2]


def _containers(containers: Any) -> Problem | None:
    if type(containers) is not list:
        return (), ARRAY, containers
    for container in containers:
        if type(container) is not dict:
            return (_at(containers, container),), OBJECT, container
        found = _container(container)
        if found is not None:
            return (_at(containers, container), *found[0]), found[1], found[2]
    return None


def _metadata(metadata: Any) -> Problem | None:
    if type(metadata) is not dict:
        return (), OBJECT, metadata
    get = metadata.get
    for key in ("name", "generateName", "namespace"):
        value = get(key)
        if value is not None and type(value) is not str:
            return (key,), STRING, value
    for key in ("labels", "annotations"):
        value = get(key)
        if value is not None:
            found = _string_map(value)
            if found is not None:
                return (key, *found[0]), found[1], found[2]
    return None


def _spec(spec: Any) -> Problem | None:
    if type(spec) is not dict:
        return (), OBJECT, spec
    get = spec.get
    containers, init_containers = get("containers"), get("initContainers")
    node_selector, tolerations, volumes = get("nodeSelector"), get("tolerations"), get("volumes")
    host_ipc, claims = get("hostIPC"), get("resourceClaims")
    found = None
    if containers is not None and (found := _containers(containers)) is not None:
        key = "containers"
    elif init_containers is not None and (found := _containers(init_containers)) is not None:
        key = "initContainers"
    elif node_selector is not None and (found := _string_map(node_selector)) is not None:
        key = "nodeSelector"
    elif tolerations is not None and (found := _objects(tolerations)) is not None:
        key = "tolerations"
    elif volumes is not None and (found := _objects(volumes)) is not None:
        key = "volumes"
    elif claims is not None and (found := _objects(claims)) is not None:
        key = "resourceClaims"
    elif host_ipc is not None and type(host_ipc) is not bool:
        return ("hostIPC",), "a boolean", host_ipc
    else:
        return None
    return (key, *found[0]), found[1], found[2]


def _path(steps: tuple[Step, ...], root: str) -> str:
    parts = [root]
    for step in steps:
        if isinstance(step, int):
            parts.append(f"[{step}]")
        elif isinstance(step, tuple):
            parts.append(f"[{step[0]!r}]")
        else:
            parts.append(f".{step}")
    return "".join(parts)


def pod_shape_problem(pod: Mapping[str, Any], root: str = "request.object") -> str | None:
    """The first field whose JSON type the core cannot use, as a sentence; None if none.

    ``root`` names where the pod sits (a workload's template: ``request.object.spec.template``).
    """
    metadata, spec = pod.get("metadata"), pod.get("spec")
    if metadata is not None and (found := _metadata(metadata)) is not None:
        key = "metadata"
    elif spec is not None and (found := _spec(spec)) is not None:
        key = "spec"
    else:
        return None
    steps, kind, value = found
    return _not(kind, _path((key, *steps), root), value)
