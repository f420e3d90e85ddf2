"""The plan being built for one pod: the parts of the pod it reads, and what it has collected
so far (edits, warnings, problems, explanation lines).

Pods come from JSON, so objects are dicts; ``as_mapping`` reads anything else as empty, which
lets planning walk a malformed pod without guarding every step.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from webhook.core.edits import Path, PodEdits
from webhook.core.policy.model import Policy, PolicySet

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def as_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` where it is an object, else an empty one (pods come from JSON: dicts)."""
    return value if isinstance(value, dict) else _EMPTY


class PlanDraft:
    """One planning run: the pod's spec and the container that gets the GPU, and the
    edits, warnings, problems and explanation lines gathered for them."""

    __slots__ = (
        "annotations",
        "container",
        "container_name",
        "container_path",
        "edits",
        "env_added",
        "explaining",
        "explanation",
        "labels",
        "policies",
        "policy",
        "problems",
        "spec",
        "unschedulable",
        "warnings",
    )

    def __init__(
        self,
        spec: Mapping[str, Any],
        index: int,
        policies: PolicySet,
        policy: Policy,
        explain: bool,
        annotations: Mapping[str, Any] = _EMPTY,
        labels: Mapping[str, Any] = _EMPTY,
    ) -> None:
        self.policies = policies
        # The pod's annotations as admitted (modes may set some of their own).
        self.annotations = annotations
        self.labels = labels
        self.policy = policy
        self.spec = spec
        self.container = as_mapping(spec["containers"][index])
        self.container_name = str(self.container.get("name"))
        self.container_path: Path = ("spec", "containers", index)
        self.edits = PodEdits()
        # Env names this plan appends; a later setting of the same name must not add it again.
        self.env_added: set[str] = set()
        self.warnings: list[str] = []
        self.problems: list[str] = []
        # What would make the planned pod unschedulable against its own nodeSelector or node
        # affinity (``node_constraints``): a denial with status 422 where nothing else is.
        self.unschedulable: list[str] = []
        # Explanation lines cost string formatting on every admission: only `explain` asks.
        self.explaining = explain
        self.explanation: list[str] = []
