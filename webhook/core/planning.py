"""From a pod, its namespace and the policies to a decision: untouched, denied, or a plan.

Pure: takes plain dicts and frozen policy values, reads no environment, changes nothing in
place. A plan is a set of edits over the original pod (``webhook.core.edits``); planning an
already planned pod yields edits that change nothing, which is what makes the webhook safe
under ``reinvocationPolicy: IfNeeded``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

import orjson

from webhook.constants import (
    APPLIED_ANNOTATION,
    CONTAINER_ANNOTATION,
    FRACTION_ANNOTATION,
    KNOWN_GPU_RESOURCES,
    MIRROR_POD_ANNOTATION,
    MPS_LIMIT_VARS,
    MPS_PIPE_DIRECTORY_VAR,
)
from webhook.core.edits import Path, PodEdits
from webhook.core.frameworks import fixed_framework_env, framework_env
from webhook.core.modes import (
    MODES,
    EnvSetting,
    ModeChanges,
)
from webhook.core.placement import Placement, format_fraction, place
from webhook.core.policy.model import Policy, PolicySet
from webhook.core.policy.selection import Selection, select_policy
from webhook.core.request import (
    GpuRequest,
    has_gpu_request,
    read_request,
)

# Resource names of the sharing schemes gpushare knows; a container asking for one of them
# by hand besides the annotation would be counted twice.
_WARNED_WHEN_OVERWRITTEN = frozenset((*MPS_LIMIT_VARS, MPS_PIPE_DIRECTORY_VAR))

_PLACEMENT_CACHE_LIMIT = 4096
_T = TypeVar("_T")

# status.code of a denial: the annotations cannot be read (422) or break policy (403).
UNPROCESSABLE = 422
FORBIDDEN = 403


@dataclass(frozen=True)
class Untouched:
    reason: str
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Denied:
    reasons: tuple[str, ...]
    policy: str | None = None
    code: int = FORBIDDEN


@dataclass(frozen=True)
class Planned:
    policy: Policy
    edits: PodEdits
    warnings: tuple[str, ...]
    record: Mapping[str, Any]
    explanation: tuple[str, ...] = field(default=())


Decision = Untouched | Denied | Planned


def is_gpu_resource(name: str, policies: PolicySet) -> bool:
    return (
        name in KNOWN_GPU_RESOURCES
        or name.startswith("nvidia.com/mig-")
        or name in policies.gpu_resource_names
    )


_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` where it is an object, else an empty one (pods come from JSON: dicts)."""
    return value if isinstance(value, dict) else _EMPTY


def plan_pod(
    pod: Mapping[str, Any], namespace: str, policies: PolicySet, *, explain: bool = False
) -> Decision:
    """Decide for one pod; ``explain`` also records how each value came about."""
    metadata = _mapping(pod.get("metadata"))
    annotations = _mapping(metadata.get("annotations"))
    if MIRROR_POD_ANNOTATION in annotations:
        return Untouched("mirror pods are managed by the kubelet and never mutated")
    if not has_gpu_request(annotations):
        return Untouched("the pod has no gpu-fraction or gpu-memory annotation")
    selection = select_policy(policies, namespace, _mapping(metadata.get("labels")))
    if selection.policy is None:
        return Untouched(selection.reason, (f"{FRACTION_ANNOTATION} ignored: {selection.reason}",))
    policy = selection.policy

    request = read_request(annotations)
    if isinstance(request, list):
        return Denied(tuple(p.message for p in request), policy.name, UNPROCESSABLE)
    spec = _mapping(pod.get("spec"))
    index = _container_index(spec, request)
    if isinstance(index, str):
        return Denied((index,), policy.name, UNPROCESSABLE)
    return _Planner(pod, policies, policy, selection, request, index, explain).plan()


def _container_index(spec: Mapping[str, Any], request: GpuRequest) -> int | str:
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return "The pod has no containers to give a GPU to."
    if request.container_name is None:
        return 0
    names = [str(_mapping(c).get("name")) for c in containers]
    if request.container_name in names:
        return names.index(request.container_name)
    init_names = [str(_mapping(c).get("name")) for c in spec.get("initContainers") or ()]
    if request.container_name in init_names:
        return (
            f'{CONTAINER_ANNOTATION} "{request.container_name}" names an init container; '
            f"GPUs go to app containers: name one of {', '.join(names)}."
        )
    return (
        f'{CONTAINER_ANNOTATION} "{request.container_name}" is not a container of this pod: '
        f"name one of {', '.join(names)}."
    )


class _Planner:
    """One planning run; collects edits, warnings, problems and explanation lines."""

    def __init__(
        self,
        pod: Mapping[str, Any],
        policies: PolicySet,
        policy: Policy,
        selection: Selection,
        request: GpuRequest,
        index: int,
        explain: bool,
    ) -> None:
        self.pod = pod
        self.policies = policies
        self.policy = policy
        self.request = request
        self.index = index
        self.spec = _mapping(pod.get("spec"))
        self.container = _mapping(self.spec["containers"][index])
        self.container_name = str(self.container.get("name"))
        self.container_path: Path = ("spec", "containers", index)
        self.edits = PodEdits()
        # Env names this plan appends; a later setting of the same name must not add it again.
        self.env_added: set[str] = set()
        self.warnings: list[str] = []
        self.problems: list[str] = []
        # Explanation lines cost string formatting on every admission: only `explain` asks.
        self.explaining = explain
        self.explanation: list[str] = []
        if explain:
            self.explanation.append(f"policy: {selection.reason}")
            self.explanation += [f"  not chosen: {line}" for line in selection.others]

    def plan(self) -> Decision:
        if self.request.is_whole:
            record = self._whole_gpus()
        else:
            placement = self._placement()
            if isinstance(placement, list):
                return Denied(tuple(placement), self.policy.name)
            record = self._shared(placement)
        self._inject_policy_extras()
        self.edits.set(
            ("metadata", "annotations", APPLIED_ANNOTATION),
            orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode(),
        )
        if self.problems:
            return Denied(tuple(self.problems), self.policy.name)
        warnings = tuple(dict.fromkeys(self.warnings))  # one note per fact, in order
        return Planned(self.policy, self.edits, warnings, record, tuple(self.explanation))

    # -- the two kinds of request ---------------------------------------------------------

    def _whole_gpus(self) -> dict[str, Any]:
        whole = self.policy.whole_gpus
        count = self.request.whole_gpus or 0
        if count > whole.max:
            limit = "no whole GPUs" if whole.max == 0 else f"at most {whole.max} whole GPUs"
            self.problems.append(
                f'{FRACTION_ANNOTATION} "{self.request.fraction_text}" asks for {count} whole '
                f"GPUs, but policy {self.policy.name!r} allows {limit}: ask for fewer, or for "
                "a share below 1."
            )
        self._resource(whole.resource_name, count)
        if self.explaining:
            self.explanation.append(f"request: {count} whole GPU(s) as {whole.resource_name}")
        self._node_selector(whole.node_selector)
        return {
            "container": self.container_name,
            "gpus": count,
            "mode": "whole-gpu",
            "policy": self.policy.name,
            "resource": whole.resource_name,
        }

    def _shared(self, placement: Placement) -> dict[str, Any]:
        if self.explaining:
            self.explanation.append(f"placement: {placement.reason}")
        self._resource(self.policy.resource_name, placement.slots)
        changes = self._mode_changes(placement)
        frameworks = framework_env(
            self.policy, placement, self.container, self._cached("frameworks", placement)
        )
        self.problems += frameworks.problems
        self.warnings += [*changes.warnings, *frameworks.warnings]
        self._node_selector(changes.node_selector)
        self._env([*changes.env, *frameworks.env])
        self._volumes(changes)
        if changes.host_ipc and self.spec.get("hostIPC") is not True:
            self.edits.set(("spec", "hostIPC"), True)
            if self.explaining:
                self.explanation.append("hostIPC: true (policy mpsDaemon.hostIPC)")
        record: dict[str, Any] = {
            "container": self.container_name,
            "fraction": format_fraction(placement.fraction),
            "mode": self.policy.mode.value,
            "policy": self.policy.name,
            "pool": placement.pool.name,
            "resource": self.policy.resource_name,
            "slots": placement.slots,
        }
        return record

    def _memo(
        self,
        key: tuple[Any, ...],
        compute: Callable[[], _T],
        keep: Callable[[_T], bool] | None = None,
    ) -> _T:
        """``compute()``, a pure function of ``key``, memoized on the policy set (bounded).

        Keys start with what is memoized and the policy's ``id``; values ``keep`` refuses
        (denials) are computed every time.
        """
        cache = self.policies.placement_cache
        value: _T | None = cache.get(key)
        if value is None:
            value = compute()
            if keep is None or keep(value):
                if len(cache) >= _PLACEMENT_CACHE_LIMIT:
                    cache.clear()
                cache[key] = value
        return value

    def _placement(self) -> Placement | list[str]:
        """``place``: a pure function of policy and request."""
        return self._memo(
            ("place", id(self.policy), self.request),
            lambda: place(self.policy, self.request),
            keep=lambda placement: isinstance(placement, Placement),
        )

    def _mode_changes(self, placement: Placement) -> ModeChanges:
        changes: ModeChanges = self._cached("mode", placement)
        return changes

    def _cached(self, what: str, placement: Placement) -> Any:
        """Mode changes and fixed framework env: pure functions of policy and placement."""
        key = (what, id(self.policy), placement.pool.name, placement.slots, placement.fraction)
        if what == "mode":
            return self._memo(key, lambda: MODES[self.policy.mode].changes(self.policy, placement))
        return self._memo(key, lambda: fixed_framework_env(self.policy, placement))

    # -- pieces of the pod ----------------------------------------------------------------

    def _resource(self, name: str, count: int) -> None:
        """Requests == limits (extended resources allow nothing else); no other GPU asks."""
        resources = _mapping(self.container.get("resources"))
        limits = _mapping(resources.get("limits"))
        for section in ("limits", "requests"):
            for key, value in _mapping(resources.get(section)).items():
                if not is_gpu_resource(key, self.policies):
                    continue
                # The apiserver copies limits into missing requests before admission: one
                # ask, one message, as for the manifest the user wrote.
                repeated = section == "requests" and str(limits.get(key)) == str(value)
                if (key != name or str(value) != str(count)) and not repeated:
                    self.problems.append(
                        f"container {self.container_name!r} already asks for {key}: {value} in "
                        f"resources.{section}; remove it and let the {FRACTION_ANNOTATION} "
                        "annotation decide, or remove the annotation."
                    )
        for section in ("limits", "requests"):
            self.edits.set((*self.container_path, "resources", section, name), str(count))
        if self.explaining:
            self.explanation.append(
                f"resources: {name}: {count} in limits and requests of container "
                f"{self.container_name!r}"
            )

    def _node_selector(self, wanted: Mapping[str, str]) -> None:
        current = _mapping(self.spec.get("nodeSelector"))
        for key, value in wanted.items():
            if key in current and current[key] != value:
                self.problems.append(
                    f"nodeSelector {key}={current[key]} conflicts with {key}={value} that the "
                    f"GPU pool chosen by policy {self.policy.name!r} needs: remove it from the "
                    "pod."
                )
            self.edits.set(("spec", "nodeSelector", key), value)
            if self.explaining:
                self.explanation.append(f"nodeSelector: {key}={value}")

    def _env(self, settings: Sequence[EnvSetting]) -> None:
        env = self.container.get("env") or []
        env_path: Path = (*self.container_path, "env")
        positions: dict[str, list[int]] = {}
        for position, entry in enumerate(env):
            positions.setdefault(str(_mapping(entry).get("name")), []).append(position)
        for setting in settings:
            wanted = {"name": setting.name, "value": setting.value}
            found = positions.get(setting.name)
            if not found:
                if setting.name in self.env_added:
                    continue
                self.env_added.add(setting.name)
                self.edits.append(env_path, wanted)
                if self.explaining:
                    self.explanation.append(
                        f"env {setting.name}={setting.value} ({setting.derivation})"
                    )
                continue
            if not setting.enforced:
                if self.explaining:
                    self.explanation.append(f"env {setting.name}: kept the value the user set")
                continue
            for position in found:
                if env[position] != wanted:
                    self.edits.replace_item(env_path, position, wanted)
                    if setting.name in _WARNED_WHEN_OVERWRITTEN:
                        self.warnings.append(
                            f"{setting.name} in {self.container_name!r} set to {setting.value} "
                            "by policy (user value replaced)"
                        )
            if self.explaining:
                self.explanation.append(
                    f"env {setting.name}={setting.value} ({setting.derivation}; enforced)"
                )

    def _volumes(self, changes: ModeChanges) -> None:
        volumes = {str(_mapping(v).get("name")): v for v in self.spec.get("volumes") or ()}
        for volume in changes.volumes:
            existing = volumes.get(str(volume["name"]))
            if existing is None:
                # Deep copies: mode changes are memoized; planned pods must not share dicts.
                self.edits.append(("spec", "volumes"), copy.deepcopy(dict(volume)))
                if self.explaining:
                    self.explanation.append(f"volume {volume['name']}: {dict(volume)}")
            elif existing != volume:
                self.problems.append(
                    f"the pod already has a volume named {volume['name']!r} that differs from "
                    "the one the MPS daemon needs: rename it."
                )
        mounts = self.container.get("volumeMounts") or []
        for mount in changes.volume_mounts:
            if any(_mapping(m) == mount for m in mounts):
                continue
            clash = [m for m in mounts if _mapping(m).get("mountPath") == mount["mountPath"]]
            if clash:
                self.problems.append(
                    f"container {self.container_name!r} already mounts something at "
                    f"{mount['mountPath']}, where the MPS pipe directory must go: move it."
                )
                continue
            self.edits.append((*self.container_path, "volumeMounts"), copy.deepcopy(dict(mount)))
            if self.explaining:
                self.explanation.append(f"volumeMount {mount['name']} at {mount['mountPath']}")

    def _inject_env_settings(self) -> tuple[EnvSetting, ...]:
        return self._memo(
            ("inject-env", id(self.policy)),
            lambda: tuple(
                EnvSetting(name, value, derivation="policy inject.env")
                for name, value in self.policy.inject.env
            ),
        )

    def _inject_policy_extras(self) -> None:
        inject = self.policy.inject
        if inject.env:
            self._env(self._inject_env_settings())
        for key, value in inject.labels.items():
            self.edits.set(("metadata", "labels", key), value)
            if self.explaining:
                self.explanation.append(f"label {key}={value} (policy inject.labels)")
        for key, value in inject.annotations.items():
            self.edits.set(("metadata", "annotations", key), value)
            if self.explaining:
                self.explanation.append(f"annotation {key}={value} (policy inject.annotations)")
        tolerations = self.spec.get("tolerations") or []
        for toleration in inject.tolerations:
            if dict(toleration) not in tolerations:
                # A copy per plan (planned pods must not share dicts); tolerations are flat.
                self.edits.append(("spec", "tolerations"), dict(toleration))
                if self.explaining:
                    self.explanation.append(f"toleration {dict(toleration)} (policy tolerations)")
