"""Where a workload's pods are written: kind → its pod templates, as data.

One table (``workload_kinds.yaml`` beside this module, in the very format policy authors
use for their own kinds under ``GpuSharingSettings.spec.workloadKinds``) says, for every
kind gpushare reads, where its pod templates sit, what each template is for (a role: "head",
"worker group gpu", "Master replicas"), how its controller names and labels the pods it
makes from it, and how many pods it makes. The CLI (``mutate``, ``explain``), ``plan``, the
validating webhook and ``webhook-config`` all read this table, so a kind added here (or in
the settings) is read everywhere at once.

A template's path is written with dots; ``[*]`` steps into every item of a list and ``.*``
into every value of a map (``spec.workerGroupSpecs[*].template``,
``spec.pytorchReplicaSpecs.*.template``). A template's ``shape`` says what sits there:

- ``PodTemplateSpec``: metadata and spec, as a Deployment's ``spec.template``;
- ``PodSpec``: a pod spec, the pods' labels and annotations being the owner's own;
- ``KServeComponent``: a KServe predictor, transformer or explainer (pod spec fields inline,
  next to KServe's own; see ``workload_pods``);
- ``ArgoTemplate``: one of an Argo workflow's templates (see ``workload_pods``).

Strings in ``podName``, ``labels`` and ``annotations`` may use ``{name}`` (the workload's
name), ``{item}`` (the list item's ``itemName`` field, or the map key), ``{itemLower}``,
and ``{PATH|DEFAULT}`` (a value from the workload, ``*`` bound to this template's item).
``pods`` is a product of such values (``spec.replicas|1 * (spec.size|1 - 1)``): how many
pods the template makes at once.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from webhook.core.object_paths import ANYS, parse_path, value_at, walk, written_path

# More pod templates than this in one object is hostile input, not a workload: a Workflow
# with hundreds of steps still has far fewer templates.
MAX_TEMPLATES = 256


class Shape(StrEnum):
    POD_TEMPLATE = "PodTemplateSpec"
    POD_SPEC = "PodSpec"
    KSERVE_COMPONENT = "KServeComponent"
    ARGO_TEMPLATE = "ArgoTemplate"

    @property
    def described(self) -> str:
        return _DESCRIBED[self]


_DESCRIBED = {
    Shape.POD_TEMPLATE: "a pod template",
    Shape.POD_SPEC: "a pod spec",
    Shape.KSERVE_COMPONENT: "a KServe component",
    Shape.ARGO_TEMPLATE: "an Argo template",
}


@dataclass(frozen=True)
class Factor:
    """One term of a pod count: the number at ``path`` (``default`` where absent), less
    ``minus``; a literal where ``path`` is empty."""

    path: tuple[str, ...]
    default: int
    minus: int = 0


@dataclass(frozen=True)
class TemplateSite:
    """Where one kind keeps one of its pod templates, and what its controller does with it."""

    path: tuple[str, ...]
    role: str = ""
    shape: Shape = Shape.POD_TEMPLATE
    pod_name: str = "{name}-"
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    # The owner's own labels and annotations reach the pods (KServe, Notebook).
    owner_metadata: bool = False
    # An object in the owner whose ``labels`` and ``annotations`` reach the pods
    # (an LLMInferenceService's workload), read over the owner's.
    metadata_from: tuple[str, ...] = ()
    item_name: str = ""
    pods: tuple[Factor, ...] = ()
    # The first term of the count is at least / at most the number here where it is set
    # (a Job's completions; a Ray worker group's minReplicas and maxReplicas).
    at_least: tuple[str, ...] = ()
    at_most: tuple[str, ...] = ()
    # Read only when this path is present (``when``) or absent (``unless``).
    when: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()
    # What gpushare cannot know or model exactly here, said with every verdict.
    note: str = ""
    # What the pod count cannot know (a DaemonSet's nodes), said by ``gpushare plan``.
    pods_note: str = ""

    @property
    def where(self) -> str:
        return written_path(self.path)

    @property
    def exact(self) -> bool:
        """Whether the template is written where the pods' own is: it can be shown as
        admitted (``gpushare mutate``) and patched."""
        return self.shape is Shape.POD_TEMPLATE and not (self.owner_metadata or self.metadata_from)


@dataclass(frozen=True)
class WorkloadKind:
    """A kind whose objects carry pod templates, and where."""

    group: str
    kind: str
    resource: str
    sites: tuple[TemplateSite, ...]
    versions: tuple[str, ...] = ("v1",)
    cluster_scoped: bool = False
    # An inference server in one template may run on every template's GPUs (a Ray cluster).
    gpus_across_templates: bool = False
    # Where the kind is documented, and what gpushare cannot model exactly for it.
    note: str = ""
    custom: bool = False

    @property
    def path(self) -> tuple[str, ...]:
        """The first template's path (for kinds with one template: its only one)."""
        return self.sites[0].path if self.sites else ()

    @property
    def where(self) -> str:
        return ", ".join(site.where for site in self.sites)

    @property
    def api_versions(self) -> tuple[str, ...]:
        return tuple(f"{self.group}/{v}" if self.group else v for v in self.versions)


@dataclass(frozen=True)
class TemplateAt:
    """One pod template found in an object: its site, its concrete path and its item."""

    site: TemplateSite
    path: tuple[str | int, ...]
    value: Any
    item: str = ""
    # The concrete index or key standing for each ``*`` of the site's path, in order.
    bound: tuple[str | int, ...] = ()

    @property
    def where(self) -> str:
        return written_path(self.path)

    @property
    def role(self) -> str:
        return self.site.role.replace("{item}", self.item)


class TooManyTemplatesError(ValueError):
    """An object holds more pod templates than ``MAX_TEMPLATES``."""


def templates_at(document: Mapping[str, Any], kind: WorkloadKind) -> list[TemplateAt]:
    """Every pod template the object holds, in the table's order (site, then item)."""
    found: list[TemplateAt] = []
    for site in kind.sites:
        if site.when and value_at(document, site.when) is None:
            continue
        if site.unless and value_at(document, site.unless) is not None:
            continue
        for path, bound, value in walk(document, site.path):
            if value is None:
                continue
            found.append(TemplateAt(site, path, value, _item(document, site, path, bound), bound))
            if len(found) > MAX_TEMPLATES:
                raise TooManyTemplatesError(
                    f"holds more than {MAX_TEMPLATES} pod templates; gpushare checks at most "
                    f"{MAX_TEMPLATES} per object: split it"
                )
    return found


def _item(
    document: Any, site: TemplateSite, path: tuple[str | int, ...], bound: tuple[str | int, ...]
) -> str:
    if not bound:
        return ""
    last = bound[-1]
    if isinstance(last, str):
        return last
    if site.item_name:
        # The list item is the value at the path up to the last ``*``.
        index = max(i for i, step in enumerate(site.path) if step in ANYS)
        name = value_at(document, path[: index + 1])
        named = name.get(site.item_name) if isinstance(name, dict) else None
        if isinstance(named, str) and named:
            return named
    return str(last)


# -- names, labels and counts -------------------------------------------------------------

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def formatted(text: str, document: Mapping[str, Any], name: str, at: TemplateAt) -> str:
    """``text`` with its placeholders filled for ``at`` (see the module docstring)."""

    def fill(match: re.Match[str]) -> str:
        word = match.group(1)
        if word == "name":
            return name
        if word == "item":
            return at.item
        if word == "itemLower":
            return at.item.lower()
        path, _, default = word.partition("|")
        value = value_at(document, parse_path(path), at.bound)
        if isinstance(value, str | int) and not isinstance(value, bool):
            return str(value)
        return default

    return _PLACEHOLDER.sub(fill, text)


def pod_count(document: Mapping[str, Any], at: TemplateAt, where: str) -> int:
    """How many pods the template makes at once; ValueError naming ``where`` if unreadable.

    The first term is bounded by ``atLeast`` then ``atMost`` where those are set (KubeRay
    clamps a worker group's replicas so, the maximum winning a conflict)."""
    count = 1
    for index, factor in enumerate(at.site.pods):
        if not factor.path:
            count *= factor.default
            continue
        value = value_at(document, factor.path, at.bound)
        if value is None:
            value = factor.default
        if not _whole(value):
            raise ValueError(
                f"{where}: {written_path(factor.path)} {value!r} is not a whole number from 0 "
                "to 1,000,000"
            )
        if index == 0:
            value = _bounded(document, at, value)
        count *= max(value - factor.minus, 0)
    return count


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1_000_000


def _bounded(document: Mapping[str, Any], at: TemplateAt, value: int) -> int:
    low = value_at(document, at.site.at_least, at.bound) if at.site.at_least else None
    high = value_at(document, at.site.at_most, at.bound) if at.site.at_most else None
    if isinstance(low, int) and _whole(low):
        value = max(value, low)
    if isinstance(high, int) and _whole(high):
        value = min(value, high)
    return value


_TERM = re.compile(r"\(?\s*([^|()\s]+)\|(\d+)\s*(?:-\s*(\d+))?\s*\)?|(\d+)")


def parse_pods(text: str) -> tuple[Factor, ...]:
    """``spec.replicas|1 * (spec.size|1 - 1)`` → factors; ValueError if it is not that."""
    factors = []
    for term in re.split(r"\s+\*\s+", text.strip()):
        if not term:
            continue
        match = _TERM.fullmatch(term)
        if match is None:
            raise ValueError(
                f"{text!r}: write pods as PATH|DEFAULT terms joined by ' * ', e.g. "
                "'spec.replicas|1 * (spec.size|1 - 1)'"
            )
        if match.group(4) is not None:
            factors.append(Factor((), int(match.group(4))))
        else:
            path = parse_path(match.group(1))
            factors.append(Factor(path, int(match.group(2)), int(match.group(3) or 0)))
    return tuple(factors)


# -- reading the table (built in, and the policy settings' own kinds) ---------------------


def kind_from_data(entry: Mapping[str, Any], *, custom: bool) -> WorkloadKind:
    """One ``workloadKinds`` entry as a ``WorkloadKind``; ValueError says what is wrong.

    The entry has passed the settings schema (or is the built-in table)."""
    group, _, version = str(entry["apiVersion"]).rpartition("/")
    versions = tuple(dict.fromkeys([version, *entry.get("otherVersions", ())]))
    sites = []
    for template in entry["templates"]:
        metadata = template.get("pod", {})
        sites.append(
            TemplateSite(
                path=parse_path(template["path"]),
                role=str(template.get("role", "")),
                shape=Shape(template.get("shape", Shape.POD_TEMPLATE.value)),
                pod_name=str(metadata.get("generateName", "{name}-")),
                labels=tuple((str(k), str(v)) for k, v in metadata.get("labels", {}).items()),
                annotations=tuple(
                    (str(k), str(v)) for k, v in metadata.get("annotations", {}).items()
                ),
                owner_metadata=bool(template.get("ownerMetadata", False)),
                metadata_from=(
                    parse_path(template["metadataFrom"]) if "metadataFrom" in template else ()
                ),
                item_name=str(template.get("itemName", "")),
                pods=parse_pods(str(template.get("pods", "1"))),
                at_least=parse_path(template["atLeast"]) if "atLeast" in template else (),
                at_most=parse_path(template["atMost"]) if "atMost" in template else (),
                when=parse_path(template["when"]) if template.get("when") else (),
                unless=parse_path(template["unless"]) if template.get("unless") else (),
                note=str(template.get("note", "")),
                pods_note=str(template.get("podsNote", "")),
            )
        )
    return WorkloadKind(
        group=group,
        kind=str(entry["kind"]),
        resource=str(entry["resource"]),
        sites=tuple(sites),
        versions=versions,
        cluster_scoped=entry.get("scope", "Namespaced") == "Cluster",
        gpus_across_templates=bool(entry.get("gpusAcrossTemplates", False)),
        note=str(entry.get("note", "")),
        custom=custom,
    )


@functools.cache
def builtin_kinds() -> tuple[WorkloadKind, ...]:
    """The kinds gpushare knows by itself (``workload_kinds.yaml``)."""
    text = (Path(__file__).with_name("workload_kinds.yaml")).read_text(encoding="utf-8")
    return tuple(kind_from_data(entry, custom=False) for entry in yaml.safe_load(text))


@dataclass(frozen=True)
class KindTable:
    """Kinds by (group, kind): the built-in ones, then a policy set's own."""

    kinds: tuple[WorkloadKind, ...]
    by_group_kind: dict[tuple[str, str], WorkloadKind] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        table = {(k.group, k.kind): k for k in reversed(self.kinds)}
        object.__setattr__(self, "by_group_kind", table)

    def get(self, group: str | None, kind: Any) -> WorkloadKind | None:
        if group is None or not isinstance(kind, str):
            return None
        return self.by_group_kind.get((group, kind))


# A few entries: one per distinct set of the policies' own kinds a process has loaded.
@functools.lru_cache(maxsize=16)
def kind_table(custom: tuple[WorkloadKind, ...] = ()) -> KindTable:
    """The built-in kinds and ``custom`` ones (a custom kind may not replace a built-in)."""
    return KindTable((*builtin_kinds(), *custom))
