"""YAML for policy files, read with bounds: no aliases, bounded depth, no duplicate keys.

A policy file is written by people and read by every webhook worker, so what it may hold is
bounded before anything is built from it: an alias bomb (a few hundred bytes of ``&a [*b,
*b, ...]`` that expands to gigabytes when printed or validated), nesting hundreds of levels
deep, and integers of thousands of digits are refused with a ``yaml.MarkedYAMLError`` that
names the line, like any other YAML error. A duplicate key, which YAML would resolve
silently by keeping the last value, is refused too.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode

# Policies nest a handful of levels (spec.pools[0].nodeSelector); 32 leaves room for any
# reasonable document and refuses pathological ones long before the recursion limit.
MAX_DEPTH = 32
# Longer than any count, memory size in bytes or priority a policy needs.
MAX_INTEGER_DIGITS = 18


class PolicyYamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with the bounds of this module."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise ComposerError(
                None,
                None,
                "uses a YAML alias (*name), which policy files may not: write the value out",
                event.start_mark,
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ComposerError(
                    None,
                    None,
                    f"nests deeper than {MAX_DEPTH} levels",
                    self.peek_event().start_mark,  # type: ignore[no-untyped-call]
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConstructorError(
                    None,
                    None,
                    f"has the key {key!r} twice in one mapping; keep one",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        digits = str(node.value).lstrip("+-").replace("_", "")
        if len(digits) > MAX_INTEGER_DIGITS:
            raise ConstructorError(
                None,
                None,
                f"holds a number of {len(digits)} digits; numbers in policies have at most "
                f"{MAX_INTEGER_DIGITS}",
                node.start_mark,
            )
        return super().construct_yaml_int(node)


PolicyYamlLoader.add_constructor(
    "tag:yaml.org,2002:int",
    PolicyYamlLoader.construct_yaml_int,
)


def compose_documents(text: str) -> list[Node]:
    return list(yaml.compose_all(text, Loader=PolicyYamlLoader))


def load_documents(text: str) -> list[Any]:
    return list(yaml.load_all(text, Loader=PolicyYamlLoader))
