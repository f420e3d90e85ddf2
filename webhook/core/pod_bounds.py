"""How much of a pod the core will work through: counts, checked before it decides.

The apiserver caps a request at 3 MiB, but within that a pod can hold 800,000 one-character
args, and deciding on it took a worker from 38 to 233 MiB (decoding peaked at 81 MiB, the
decision at 158 MiB). No real pod comes near these bounds (the largest in the workload
corpus has a few dozen env variables), so a pod over one is refused with what to change,
and the work per review stays small. Checked after ``pod_shape`` has vouched for the types.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_CONTAINERS = 64  # containers, initContainers and ephemeralContainers together
MAX_ITEMS_PER_CONTAINER = {"env": 4096, "envFrom": 256, "volumeMounts": 1024}
MAX_ARGUMENTS_PER_CONTAINER = 4096  # command and args together
MAX_POD_ITEMS = {"volumes": 1024, "tolerations": 512, "resourceClaims": 128}
MAX_METADATA_ENTRIES = 1024  # labels, annotations each

CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def pod_size_problem(pod: Mapping[str, Any], root: str = "request.object") -> str | None:
    """The first count over its bound, as a sentence that says what to change; None if none."""
    metadata = pod.get("metadata") or {}
    for key in ("labels", "annotations"):
        entries = metadata.get(key) or {}
        if len(entries) > MAX_METADATA_ENTRIES:
            return _over(f"{root}.metadata.{key}", len(entries), MAX_METADATA_ENTRIES, "entries")
    spec = pod.get("spec") or {}
    containers = [c for key in CONTAINER_LISTS for c in spec.get(key) or ()]
    if len(containers) > MAX_CONTAINERS:
        return _over(f"{root}.spec (all containers)", len(containers), MAX_CONTAINERS, "containers")
    for key, limit in MAX_POD_ITEMS.items():
        items = spec.get(key) or ()
        if len(items) > limit:
            return _over(f"{root}.spec.{key}", len(items), limit, "items")
    for key in CONTAINER_LISTS:
        for index, container in enumerate(spec.get(key) or ()):
            found = _container_problem(container, f"{root}.spec.{key}[{index}]")
            if found is not None:
                return found
    return None


def _container_problem(container: Mapping[str, Any], where: str) -> str | None:
    for key, limit in MAX_ITEMS_PER_CONTAINER.items():
        items = container.get(key) or ()
        if len(items) > limit:
            return _over(f"{where}.{key}", len(items), limit, "items")
    arguments = len(container.get("command") or ()) + len(container.get("args") or ())
    if arguments > MAX_ARGUMENTS_PER_CONTAINER:
        return (
            f"{where} has {arguments} command and args items; gpushare reads at most "
            f"{MAX_ARGUMENTS_PER_CONTAINER} per container. Pass long argument lists in a file "
            "(a ConfigMap mounted as a volume) instead."
        )
    return None


def _over(where: str, count: int, limit: int, what: str) -> str:
    return (
        f"{where} has {count} {what}; gpushare reads at most {limit}, which bounds the work "
        "and memory one review may take. Split the pod, or move the data into a ConfigMap."
    )
