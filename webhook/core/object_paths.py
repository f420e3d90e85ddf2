"""Paths into objects: ``spec.workerGroupSpecs[*].template`` written, parsed and walked.

A path is written with dots; ``[*]`` steps into every item of a list and ``.*`` into every
value of a map. Walking one yields every concrete place it matches, with the index or key
that stood for each wildcard, so that other paths (a replica count beside the template) can
be read at the same item.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

ANY = "*"  # every value of a map
ANY_ITEM = "[*]"  # every item of a list
ANYS = (ANY, ANY_ITEM)

_STEP = re.compile(r"[A-Za-z0-9_$-]+|\*|\[\*\]")


def parse_path(text: str) -> tuple[str, ...]:
    """``spec.groups[*].template`` → ("spec", "groups", "[*]", "template"); ValueError if
    it is not a path."""
    steps: list[str] = []
    for part in text.replace("[*]", ".[*]").split("."):
        if not _STEP.fullmatch(part):
            raise ValueError(f"{text!r} is not a path: write keys with dots, [*] for list items")
        steps.append(part)
    return tuple(steps)


def written_path(path: Sequence[str | int]) -> str:
    text = ""
    for step in path:
        if isinstance(step, int):
            text += f"[{step}]"
        elif step == ANY_ITEM:
            text += step
        else:
            text += f".{step}" if text else step
    return text


def value_at(document: Any, path: Sequence[str | int], bound: Sequence[str | int] = ()) -> Any:
    """What sits at ``path`` (``*`` steps taken from ``bound`` in order); None if missing."""
    value = document
    anys = iter(bound)
    for step in path:
        key: str | int = next(anys, -1) if step in ANYS else step
        if isinstance(value, dict) and isinstance(key, str):
            value = value.get(key)
        elif isinstance(value, list) and isinstance(key, int) and 0 <= key < len(value):
            value = value[key]
        else:
            return None
    return value


def walk(
    value: Any,
    path: Sequence[str],
    done: tuple[str | int, ...] = (),
    bound: tuple[str | int, ...] = (),
) -> Iterator[tuple[tuple[str | int, ...], tuple[str | int, ...], Any]]:
    """(concrete path, the keys and indexes standing for its wildcards, value) for every
    place ``path`` matches in ``value``."""
    if not path:
        yield done, bound, value
        return
    step, rest = path[0], path[1:]
    if step not in ANYS:
        if isinstance(value, dict) and step in value:
            yield from walk(value[step], rest, (*done, step), bound)
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            yield from walk(item, rest, (*done, index), (*bound, index))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from walk(item, rest, (*done, key), (*bound, key))
