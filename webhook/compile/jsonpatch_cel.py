"""JSONPatch ops (RFC 6902) written as CEL for MutatingAdmissionPolicies: paths, values,
and the ops that create a missing parent map or list (``add`` needs the parent to exist)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.compile.pod_cel import s


def escape(key: str) -> str:
    """A map key as a JSON Pointer segment (RFC 6901: ``~`` then ``/``)."""
    return key.replace("~", "~0").replace("/", "~1")


def op(kind: str, path: str, value: str | None = None) -> str:
    if value is None:
        return f"JSONPatch{{op: {s(kind)}, path: {path}}}"
    return f"JSONPatch{{op: {s(kind)}, path: {path}, value: {value}}}"


def literal(value: Any) -> str:
    """A JSON value as CEL (maps, lists, strings, ints, bools)."""
    if isinstance(value, Mapping):
        # CEL map literals are homogeneous: values of mixed types go in as dyn().
        mixed = len({type(v) for v in value.values()}) > 1
        items = [(s(str(k)), literal(v)) for k, v in value.items()]
        return "{" + ", ".join(f"{k}: dyn({v})" if mixed else f"{k}: {v}" for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return s(str(value))


def add_to_map(parent: str, present: str, key: str, value: str) -> str:
    """Ops setting ``parent/key`` (created with the key when ``present`` is false)."""
    return (
        f"({present} ? [{op('add', s(parent + '/' + escape(key)), value)}] : "
        f"[{op('add', s(parent), '{' + s(key) + ': ' + value + '}')}])"
    )


def add_items(parent: str, present: str, items: str) -> str:
    """Ops appending the CEL list ``items`` to the list at ``parent`` (which may be absent)."""
    item_path = parent + " + '/-'"
    return (
        f"({present} ? {items}.map(i, {op('add', item_path, 'i')}) : "
        f"{items}.size() > 0 ? [{op('add', parent, items)}] : [])"
    )
