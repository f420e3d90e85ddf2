"""RFC 6902 JSON Patch from an edit tree: only the touched paths, exactly.

``add`` on an existing object member replaces it (RFC 6902 section 4.1), so set-entry edits
need no test of existence; a missing parent is added whole, since ``add`` below a missing
parent is an error that the apiserver reports as a 500 even under failurePolicy Ignore.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.edits import ListEdits, PodEdits, SetValue, Tree

JsonPatch = list[dict[str, Any]]


def escape_pointer_token(token: str | int) -> str:
    """JSON Pointer (RFC 6901) escaping: "~" → "~0", "/" → "~1" (nvidia.com~1gpu.shared)."""
    text = str(token)
    if "~" in text or "/" in text:
        return text.replace("~", "~0").replace("/", "~1")
    return text


def materialize(node: Tree | SetValue | ListEdits) -> Any:
    """The plain value of an edit subtree, for a parent that does not exist yet."""
    if isinstance(node, SetValue):
        return node.value
    if isinstance(node, ListEdits):
        return list(node.append)
    return {key: materialize(child) for key, child in node.items()}


def _walk(original: Any, tree: Tree, pointer: str, ops: JsonPatch) -> None:
    # Hot path: plain type checks; pods come from JSON, so objects are dicts, arrays lists.
    is_dict = type(original) is dict
    for key, node in tree.items():
        if type(key) is str and "/" not in key and "~" not in key:
            path = pointer + "/" + key
        else:
            path = pointer + "/" + escape_pointer_token(key)
        if is_dict:
            current = original.get(key)
        elif type(original) is list and type(key) is int and 0 <= key < len(original):
            current = original[key]
        else:
            current = None
        if type(node) is SetValue:
            if current is None or current != node.value:
                ops.append({"op": "add", "path": path, "value": node.value})
        elif current is None:
            ops.append({"op": "add", "path": path, "value": materialize(node)})
        elif type(node) is ListEdits:
            for index, item in sorted(node.replace.items()):
                if current[index] != item:
                    ops.append({"op": "replace", "path": f"{path}/{index}", "value": item})
            for item in node.append:
                ops.append({"op": "add", "path": path + "/-", "value": item})
        else:
            _walk(current, node, path, ops)  # type: ignore[arg-type]


def build_patch(original: Mapping[str, Any], edits: PodEdits) -> JsonPatch:
    """The smallest patch this module can express that turns ``original`` into the plan."""
    ops: JsonPatch = []
    # The walk checks for plain dicts (pods decoded from JSON); copy only other mappings.
    root = original if type(original) is dict else dict(original)
    _walk(root, edits.root, "", ops)
    return ops
