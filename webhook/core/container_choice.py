"""Which app container gets the GPU when no ``gpu-fraction-container-name`` names one.

1. The first container with a known GPU container name (``GPU_CONTAINER_NAMES``: Argo's
   ``main``, KServe's ``kserve-container``, the training operators' defaults, ...).
2. Else the first container that is no known helper (``HELPER_CONTAINER_NAMES``: Argo's
   ``wait``, mesh proxies, agents, log shippers).
3. Else the first container.

Where rule 2 chose among two or more containers, that is a guess: the pod is admitted with
a warning naming the container that got the GPU and the others. The compiled policies choose
the same way (``webhook.compile.request_cel``); docs/annotations.md says it for users.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from webhook.constants import CONTAINER_ANNOTATION, GPU_CONTAINER_NAMES, HELPER_CONTAINER_NAMES


class Rule(Enum):
    """How the GPU container was chosen."""

    ONLY = "the pod's only container"
    NAMED = f"named by {CONTAINER_ANNOTATION}"
    GPU_NAME = "a known GPU container name"
    NOT_HELPER = "the one container that is not a known helper"
    GUESS = "a guess"
    FIRST = "the first container: every container is a known helper"


class ContainerChoice:
    """The GPU container's index, the rule that chose it, and the warning of a guess; never
    changed once built (a plain slotted class: a frozen dataclass costs several times as
    much to build, and one is built on every admission of a pod of several containers)."""

    __slots__ = ("index", "rule", "warning")

    def __init__(self, index: int, rule: Rule, warning: str | None = None) -> None:
        self.index = index
        self.rule = rule
        self.warning = warning


# The usual pod: one container, nothing to choose.
ONLY = ContainerChoice(0, Rule.ONLY)


def choose_container(names: Sequence[str]) -> ContainerChoice:
    """The container of ``names`` (the names of the pod's ``spec.containers``, two or more)
    that gets the GPU when the pod does not name one: one pass over the names."""
    first_plain, plain = 0, 0
    for index, name in enumerate(names):
        if name in GPU_CONTAINER_NAMES:
            return ContainerChoice(index, Rule.GPU_NAME)
        if name not in HELPER_CONTAINER_NAMES:
            if not plain:
                first_plain = index
            plain += 1
    if not plain:
        return ContainerChoice(0, Rule.FIRST)
    if plain == 1:
        return ContainerChoice(first_plain, Rule.NOT_HELPER)
    name = names[first_plain]
    others = ", ".join(
        f'"{n}"' for n in names[first_plain + 1 :] if n not in HELPER_CONTAINER_NAMES
    )
    warning = (
        f'container "{name}" got the GPU, as the first of "{name}", {others}: '
        f"set {CONTAINER_ANNOTATION} to the one that uses it"
    )
    return ContainerChoice(first_plain, Rule.GUESS, warning)


def explain_choice(names: Sequence[str], choice: ContainerChoice) -> str:
    """``explain``'s line: the container, the rule, and the helpers passed over."""
    name = names[choice.index]
    why = choice.rule.value
    if choice.rule is Rule.GPU_NAME:
        why = f"{why}: {GPU_CONTAINER_NAMES[name]}"
    elif choice.rule is Rule.GUESS:
        others = [n for n in names if n != name and n not in HELPER_CONTAINER_NAMES]
        why = (
            f"{why}: the first of the containers that are neither known GPU containers nor "
            f"helpers, before {', '.join(repr(n) for n in others)}"
        )
    skipped = [n for n in names[: choice.index] if n in HELPER_CONTAINER_NAMES]
    if skipped and choice.rule is not Rule.NAMED:
        helpers = ", ".join(f"{n!r} ({HELPER_CONTAINER_NAMES[n]})" for n in skipped)
        why = f"{why}; passed over {helpers}"
    return f"container: {name!r} ({why})"
