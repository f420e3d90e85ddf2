"""Pod edits: the few exact changes a plan makes, as a tree laid over the original pod.

The planner records *what* should hold (an entry set, an item appended, a list item
replaced); ``patch`` turns the tree into RFC 6902 operations against the original and
``render`` into the mutated pod. Both walk only the touched parts, never the whole pod.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

Key = str | int
Path = tuple[Key, ...]

# Slotted mutable dataclasses, not frozen ones: a plan builds several per admission, on the
# hot path, and frozen dataclasses are slower to build.


@dataclass(slots=True)
class SetValue:
    """The value at this key must equal ``value`` (added, or replaced when different)."""

    value: Any


@dataclass(slots=True)
class ListEdits:
    """Items replaced at existing indexes, then items appended at the end."""

    replace: dict[int, Any] = field(default_factory=dict)
    append: list[Any] = field(default_factory=list)


# A mapping from keys (dict keys or list indexes) to edits below them: plain dicts, so the
# walks in ``patch`` and ``render`` tell edits from subtrees by their type.
Tree: TypeAlias = dict[Key, "Tree | SetValue | ListEdits"]


class PodEdits:
    """Builder for the edit tree. Paths are tuples of keys from the pod's root."""

    __slots__ = ("root",)

    def __init__(self) -> None:
        self.root: Tree = {}

    def _tree_at(self, parents: Sequence[Key]) -> Tree:
        tree = self.root
        for key in parents:
            child = tree.get(key)
            if child is None:
                child = tree[key] = {}
            elif type(child) is not dict:
                raise ValueError(f"conflicting edits at {tuple(parents)!r}")
            tree = child
        return tree

    def set(self, path: Path, value: Any) -> None:
        self._tree_at(path[:-1])[path[-1]] = SetValue(value)

    def _list_at(self, path: Path) -> ListEdits:
        tree = self._tree_at(path[:-1])
        key = path[-1]
        edits = tree.get(key)
        if edits is None:
            edits = tree[key] = ListEdits()
        elif type(edits) is not ListEdits:
            raise ValueError(f"conflicting edits at {path!r}")
        return edits

    def append(self, path: Path, item: Any) -> None:
        self._list_at(path).append.append(item)

    def replace_item(self, path: Path, index: int, item: Any) -> None:
        self._list_at(path).replace[index] = item

    def is_empty(self) -> bool:
        return not self.root
