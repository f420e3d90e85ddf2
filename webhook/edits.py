"""Pod edits: the few exact changes a plan makes, as a tree laid over the original pod.

The planner records *what* should hold (an entry set, an item appended, a list item
replaced); ``patch`` turns the tree into RFC 6902 operations against the original and
``render`` into the mutated pod. Both walk only the touched parts, never the whole pod.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Key = str | int
Path = tuple[Key, ...]


@dataclass(frozen=True)
class SetValue:
    """The value at this key must equal ``value`` (added, or replaced when different)."""

    value: Any


@dataclass
class ListEdits:
    """Items replaced at existing indexes, then items appended at the end."""

    replace: dict[int, Any] = field(default_factory=dict)
    append: list[Any] = field(default_factory=list)


class Tree(dict[Key, "Tree | SetValue | ListEdits"]):
    """A mapping from keys (dict keys or list indexes) to edits below them."""


class PodEdits:
    """Builder for the edit tree. Paths are tuples of keys from the pod's root."""

    def __init__(self) -> None:
        self.root = Tree()
        # Subtrees by path: plans set many entries under the same few parents.
        self._trees: dict[Path, Tree] = {(): self.root}

    def _tree_at(self, path: Path) -> Tree:
        tree = self._trees.get(path)
        if tree is not None:
            return tree
        parent = self._tree_at(path[:-1])
        child = parent.get(path[-1])
        if child is None:
            child = parent[path[-1]] = Tree()
        if not isinstance(child, Tree):
            raise ValueError(f"conflicting edits at {path!r}")
        self._trees[path] = child
        return child

    def set(self, path: Path, value: Any) -> None:
        *parents, key = path
        self._tree_at(tuple(parents))[key] = SetValue(value)

    def _list_at(self, path: Path) -> ListEdits:
        *parents, key = path
        tree = self._tree_at(tuple(parents))
        edits = tree.get(key)
        if edits is None:
            edits = ListEdits()
            tree[key] = edits
        if not isinstance(edits, ListEdits):
            raise ValueError(f"conflicting edits at {path!r}")
        return edits

    def append(self, path: Path, item: Any) -> None:
        self._list_at(path).append.append(item)

    def replace_item(self, path: Path, index: int, item: Any) -> None:
        self._list_at(path).replace[index] = item

    def is_empty(self) -> bool:
        return not self.root
