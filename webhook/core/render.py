"""The planned pod: the original with an edit tree laid over it, copying only touched parts.

Independent of ``patch`` on purpose: tests check that applying the patch to the original
yields exactly this pod, so each of the two walks checks the other.
"""

from __future__ import annotations

from typing import Any

from webhook.core.edits import ListEdits, PodEdits, SetValue, Tree
from webhook.core.patch import materialize


def _apply(original: Any, node: Tree | SetValue | ListEdits) -> Any:
    if isinstance(node, SetValue):
        return node.value
    if original is None:
        return materialize(node)
    if isinstance(node, ListEdits):
        items = list(original)
        for index, item in node.replace.items():
            items[index] = item
        return items + list(node.append)
    if isinstance(original, list):
        items = list(original)
        for key, child in node.items():
            assert isinstance(key, int)
            items[key] = _apply(items[key], child)
        return items
    result = dict(original)
    for key, child in node.items():
        result[key] = _apply(result.get(key), child)
    return result


def render(original: dict[str, Any], edits: PodEdits) -> dict[str, Any]:
    """A new pod; ``original`` and everything it shares with the result stay unchanged."""
    if edits.is_empty():
        return original
    result = _apply(original, edits.root)
    assert isinstance(result, dict)
    return result
