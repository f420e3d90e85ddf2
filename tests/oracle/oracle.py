"""The oracle: what gpushare should do to a pod, from the docs alone.

Written from README.md ("For developers: the annotations", "For policy authors",
"The three sharing modes side by side") and policies/README.md, without reading or
importing ``webhook.core``: policy files are read here with ``yaml.safe_load_all``, and only
``webhook.constants`` is used, for names. Slow and plain on purpose: exact fractions, no
memo, one function per rule.

Rules covered (anything else is out of scope, and the generators in ``strategies`` do not
produce it):

1. Skips (allowed, no change): a mirror pod (``kubernetes.io/config.mirror``); a pod with
   neither ``gpu-fraction`` nor ``gpu-memory``; a namespace excluded by the
   ``GpuSharingSettings`` ``excludeNamespaces`` globs (default: the four system namespaces;
   ``kube-system`` always); a namespace no policy governs.
2. Policy selection: a policy matches when a ``match.namespaces`` glob matches the
   namespace, no ``match.excludeNamespaces`` glob does, and the pod carries every
   ``match.podLabels`` entry. Among matches: highest ``priority``, then the most specific
   (exact name > glob > ``*``, then more ``podLabels`` entries), then the name in
   alphabetical order. Only when none matches: the ``default: true`` policy (not excluding
   the namespace) with the highest priority. Default policies with ``podLabels`` are out of
   scope.
3. ``gpu-fraction``: at most 32 characters of ASCII digits with at most one point and
   digits on both sides; 0 is refused; a whole number 1..1024 asks for whole GPUs; a
   non-whole number must be below 1. Spellings the README leaves open (".5", "1.0", "02")
   are out of scope.
4. ``gpu-memory``: at most 32 characters; a whole number of MiB ("8000"; "1.5" and "0" are
   refused) or a positive quantity with a unit (Ki Mi Gi Ti k K M G T). Under a policy with
   ``spec.gpuMemory`` it is the share ``memory / gpuMemory``, placed and bounded as a
   fraction (rule 7); policies with a per-pool ``gpuMemory`` are out of scope. Under a
   policy without it, GPU Feature Discovery's node label decides (policies/README.md): one
   slot of the pool with the largest slice ``1/R`` (the first listed on a tie), the share
   ``min(1/R, fraction.max)``, ``fraction.min`` not applied, and a required node affinity
   ``nvidia.com/gpu.memory Gt N-1`` with ``N = ceil(memory x max(R, 1/fraction.max))``.
   With ``gpu-fraction`` too: refused with whole GPUs, and refused when the two disagree;
   the generators only write exact agreement or disagreement by a factor of at least 1.25
   (the tolerance between is not documented); under a policy without ``gpuMemory`` the two
   cannot be shown to agree, and the oracle refuses (the docs do not say; a reading).
   Refused where the nodes decide and the pod's nodeSelector names a GPU model
   (``nvidia.com/gpu.product``) whose memory a policy declares (``gpuMemory`` of a policy
   with a pool selecting that model; the largest) below ``N`` (docs/annotations.md).
5. ``gpu-fraction-container-name``: the container that gets the GPU; empty, an init
   container's name or no container's name is refused. Without it: the first container with
   a known GPU container name (``GPU_CONTAINER_NAMES``), else the first that is no known
   helper (``HELPER_CONTAINER_NAMES``), else the first (docs/annotations.md).
6. Whole GPUs: refused above ``wholeGpus.max``; else ``wholeGpus.resourceName: N`` and
   ``wholeGpus.nodeSelector``.
7. A share ``f``: refused below ``fraction.min`` or above ``fraction.max``. ``replica-class``:
   one slot of the pool with the smallest slice ``1/R >= f`` (the first listed on a tie);
   ``count``: ``ceil(f*R)`` slots on the pool granting the least ``slots/R`` (the first
   listed on a tie); refused when no pool can serve ``f``. The pod gets
   ``resourceName: slots`` and the nodeSelector ``nvidia.com/gpu.replicas=R``,
   ``nvidia.com/gpu.sharing-strategy`` (``time-slicing``; ``mps`` in mode mps), the pool's
   ``nodeSelector`` and, in mode mps-daemon, ``<mpsDaemon.readyLabel>=true``.
8. A percentage ``headroom`` is subtracted from the share for the framework knobs; a share
   that leaves nothing (``f - headroom <= 0``) is refused.
9. Refused: a GPU resource (``KNOWN_GPU_RESOURCES``, ``nvidia.com/mig-*`` or a resource a
   policy hands out) asked by hand in any other container, init container or ephemeral
   container, or in the GPU container other than exactly what gpushare would set; the
   pod's nodeSelector holding a key the placement needs with another value
   (tests/corpus/deny-node-selector-conflict).
10. Planned: GPU resources in limits and requests (equal) of that container only, the
    nodeSelector merged, the node affinity of rule 4 (pods without affinity of their own
    get it as their one nodeSelectorTerm), and the ``gpushare.io/applied`` record naming
    policy, mode (``whole-gpu`` for whole GPUs), container, resource, pool and slots (or
    gpus).

Not covered: env (framework knobs, MPS limits), volumes, hostIPC, tolerations, injected
labels and annotations, warnings, denial wording and codes, validation, the applied
record's other fields, pods with node affinity of their own.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from fractions import Fraction
from typing import Any

import yaml

from webhook.constants import (
    ALWAYS_EXCLUDED_NAMESPACES,
    CONTAINER_ANNOTATION,
    DEFAULT_EXCLUDED_NAMESPACES,
    FRACTION_ANNOTATION,
    GFD_MEMORY_LABEL,
    GFD_PRODUCT_LABEL,
    GFD_REPLICAS_LABEL,
    GFD_STRATEGY_LABEL,
    GPU_CONTAINER_NAMES,
    HELPER_CONTAINER_NAMES,
    KNOWN_GPU_RESOURCES,
    MEMORY_ANNOTATION,
    MIG_RESOURCE_PREFIX,
    MIRROR_POD_ANNOTATION,
    MPS_READY_LABEL,
    SHARED_GPU_RESOURCE,
    WHOLE_GPU_RESOURCE,
)

MAX_TEXT = 32
MIN_NOT_APPLIED = "fraction.min does not apply to a gpu-memory ask the nodes size"
MAX_WHOLE_GPUS = 1024
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?", re.ASCII)
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|K|M|G|T)?", re.ASCII)
_UNIT = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_UNIT |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
MIB = 2**20
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where built: same result


# -- policies, read from the YAML text ----------------------------------------------------


@dataclass(frozen=True)
class OraclePool:
    name: str
    replicas: int
    node_selector: Mapping[str, str]


@dataclass(frozen=True)
class OraclePolicy:
    name: str
    doc: Mapping[str, Any]

    @property
    def spec(self) -> Mapping[str, Any]:
        spec: Mapping[str, Any] = self.doc["spec"]
        return spec

    def get(self, *keys: str, default: Any = None) -> Any:
        value: Any = self.spec
        for key in keys:
            if not isinstance(value, Mapping) or key not in value:
                return default
            value = value[key]
        return value

    @property
    def pools(self) -> list[OraclePool]:
        return [
            OraclePool(p["name"], p["replicas"], p.get("nodeSelector") or {})
            for p in self.spec["pools"]
        ]

    @property
    def gpu_memory_mib(self) -> Fraction | None:
        text = self.get("gpuMemory")
        return None if text is None else quantity_mib(str(text))


@dataclass(frozen=True)
class OraclePolicies:
    policies: list[OraclePolicy]
    excluded: list[str]

    @property
    def handed_out(self) -> set[str]:
        """Every resource a policy hands out, shared or whole."""
        names = {p.get("resourceName", default=SHARED_GPU_RESOURCE) for p in self.policies}
        names |= {
            p.get("wholeGpus", "resourceName", default=WHOLE_GPU_RESOURCE) for p in self.policies
        }
        return names


def read_policies(texts: Iterable[str]) -> OraclePolicies:
    """The policy files' documents, read with a plain safe YAML loader."""
    policies: list[OraclePolicy] = []
    excluded: list[str] | None = None
    for text in texts:
        for doc in yaml.load_all(text, Loader=_LOADER):
            if not doc:
                continue
            if doc["kind"] == "GpuSharingSettings":
                excluded = [*(excluded or []), *(doc["spec"].get("excludeNamespaces") or [])]
            else:
                policies.append(OraclePolicy(doc["metadata"]["name"], doc))
    if excluded is None:
        excluded = list(DEFAULT_EXCLUDED_NAMESPACES)
    return OraclePolicies(policies, [*excluded, *ALWAYS_EXCLUDED_NAMESPACES])


# -- what the oracle answers --------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """``outcome`` is "untouched", "denied" or "planned"; the rest is set when planned."""

    outcome: str
    why: str
    policy: str | None = None
    mode: str | None = None
    container: str | None = None
    resource: str | None = None
    quantity: int | None = None
    pool: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # N of the affinity ``nvidia.com/gpu.memory Gt N-1`` (rule 4), where the nodes decide.
    node_gpu_memory_mib: int | None = None
    # Rules the docs state that this answer rests on, where tests need to know (rule 4:
    # MIN_NOT_APPLIED).
    notes: tuple[str, ...] = ()

    @property
    def affinity(self) -> Mapping[str, Any] | None:
        """The pod's ``spec.affinity`` once planned (generated pods carry none)."""
        if self.node_gpu_memory_mib is None:
            return None
        expression = {
            "key": GFD_MEMORY_LABEL,
            "operator": "Gt",
            "values": [str(self.node_gpu_memory_mib - 1)],
        }
        terms = [{"matchExpressions": [expression]}]
        return {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
            }
        }


def untouched(why: str) -> Expected:
    return Expected("untouched", why)


def denied(why: str, policy: OraclePolicy) -> Expected:
    return Expected("denied", why, policy=policy.name)


# -- the rules -----------------------------------------------------------------------------


def quantity_mib(text: str) -> Fraction | None:
    """A Kubernetes quantity (a policy's ``gpuMemory``) in MiB: a bare number is bytes."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        return None
    mib = Fraction(match[1]) * _UNIT[match[2] or ""] / MIB
    return mib if mib > 0 else None


def read_memory(text: str) -> Fraction | None:
    """The ``gpu-memory`` annotation in MiB: a bare whole number is MiB; else a quantity
    with a unit; None when refused."""
    match = _QUANTITY.fullmatch(text)
    if len(text) > MAX_TEXT or match is None:
        return None
    if not match[2]:
        return Fraction(int(text)) if "." not in text and int(text) > 0 else None
    return quantity_mib(text)


def read_fraction(text: str) -> Fraction | int | None:
    """A share (0 < f < 1), a whole count (1..1024), or None when refused."""
    if len(text) > MAX_TEXT or not _DECIMAL.fullmatch(text):
        return None
    value = Fraction(text)
    if value <= 0:
        return None
    if value.denominator == 1:
        return int(value) if value <= MAX_WHOLE_GPUS else None
    return value if value < 1 else None


def select(
    policies: OraclePolicies, namespace: str, labels: Mapping[str, str]
) -> OraclePolicy | None:
    def eligible(policy: OraclePolicy) -> bool:
        excludes = policy.get("match", "excludeNamespaces", default=[])
        wanted = policy.get("match", "podLabels", default={})
        return not any(fnmatchcase(namespace, g) for g in excludes) and all(
            labels.get(k) == v for k, v in wanted.items()
        )

    def specificity(policy: OraclePolicy) -> tuple[int, int]:
        best = 0
        for glob in policy.get("match", "namespaces", default=[]):
            if glob == namespace:
                best = max(best, 2)
            elif glob != "*" and fnmatchcase(namespace, glob):
                best = max(best, 1)
        return best, len(policy.get("match", "podLabels", default={}))

    matching = [
        p
        for p in policies.policies
        if eligible(p)
        and any(fnmatchcase(namespace, g) for g in p.get("match", "namespaces", default=[]))
    ]
    if matching:
        return min(
            matching,
            key=lambda p: (
                -p.get("priority", default=0),
                tuple(-part for part in specificity(p)),
                p.name,
            ),
        )
    defaults = [p for p in policies.policies if p.get("default", default=False) and eligible(p)]
    if not defaults:
        return None
    return max(defaults, key=lambda p: p.get("priority", default=0))


def decide(pod: Mapping[str, Any], namespace: str, policies: OraclePolicies) -> Expected:
    """What gpushare should do with ``pod`` created in ``namespace`` under ``policies``
    (``read_policies`` of the policy files' texts)."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    if MIRROR_POD_ANNOTATION in annotations:
        return untouched("a mirror pod")
    if FRACTION_ANNOTATION not in annotations and MEMORY_ANNOTATION not in annotations:
        return untouched("no annotation")
    if any(fnmatchcase(namespace, glob) for glob in policies.excluded):
        return untouched(f"namespace {namespace} is excluded")
    policy = select(policies, namespace, metadata.get("labels") or {})
    if policy is None:
        return untouched("no policy governs the namespace")
    spec = pod.get("spec") or {}
    container = _container(spec, annotations.get(CONTAINER_ANNOTATION))
    if container is None:
        return denied("no such container", policy)
    fraction_text = annotations.get(FRACTION_ANNOTATION)
    memory_text = annotations.get(MEMORY_ANNOTATION)
    fraction = None if fraction_text is None else read_fraction(fraction_text)
    memory = None if memory_text is None else read_memory(memory_text)
    if (fraction_text is not None and fraction is None) or (
        memory_text is not None and memory is None
    ):
        return denied("an annotation is not a valid value", policy)
    if isinstance(fraction, int):
        if memory_text is not None:
            return denied("whole GPUs with gpu-memory", policy)
        return _whole(policy, container, fraction, spec, policies)
    share = _share(policy, fraction, memory)
    if isinstance(share, str):
        return denied(share, policy)
    if isinstance(share, _SizedByNodes):
        return _sized_by_nodes(policy, container, share.memory_mib, spec, policies)
    return _shared(policy, container, share, spec, policies)


def _container(spec: Mapping[str, Any], name: str | None) -> Mapping[str, Any] | None:
    containers = spec.get("containers") or []
    if name is None:
        if not containers:
            return None
        return containers[default_container([c.get("name") for c in containers])]
    return next((c for c in containers if c.get("name") == name), None)


def default_container(names: list[Any]) -> int:
    """Rule 5 without the annotation: the index of the container that gets the GPU."""
    known = [i for i, n in enumerate(names) if n in GPU_CONTAINER_NAMES]
    plain = [i for i, n in enumerate(names) if n not in HELPER_CONTAINER_NAMES]
    return (known or plain or [0])[0]


@dataclass(frozen=True)
class _SizedByNodes:
    """A gpu-memory ask under a policy without gpuMemory: the nodes' label decides."""

    memory_mib: Fraction


def _share(
    policy: OraclePolicy, fraction: Fraction | None, memory: Fraction | None
) -> Fraction | _SizedByNodes | str:
    if memory is None:
        assert fraction is not None
        return fraction
    gpu_memory = policy.gpu_memory_mib
    if gpu_memory is None:
        if fraction is not None:
            return "gpu-fraction and gpu-memory cannot be compared without gpuMemory"
        return _SizedByNodes(memory)
    if fraction is not None:
        if abs(fraction * gpu_memory - memory) > memory / 100:
            return "gpu-fraction and gpu-memory disagree"
        return fraction
    return memory / gpu_memory


def _is_gpu(name: str, policies: OraclePolicies) -> bool:
    return (
        name in KNOWN_GPU_RESOURCES
        or name.startswith(MIG_RESOURCE_PREFIX)
        or name in policies.handed_out
    )


def _gpu_asks_problem(
    spec: Mapping[str, Any],
    container: Mapping[str, Any],
    resource: str,
    quantity: int,
    policies: OraclePolicies,
) -> str | None:
    """A GPU resource asked by hand: anywhere but in ``container``, or there other than
    ``resource: quantity``."""
    everyone = [
        *spec.get("containers", []),
        *spec.get("initContainers", []),
        *spec.get("ephemeralContainers", []),
    ]
    for other in everyone:
        resources = other.get("resources") or {}
        for section in ("limits", "requests"):
            for name, value in (resources.get(section) or {}).items():
                if not _is_gpu(name, policies):
                    continue
                if other is not container or (name, str(value)) != (resource, str(quantity)):
                    return f"{other.get('name')} already asks for {name}"
    return None


def _selector_problem(spec: Mapping[str, Any], wanted: Mapping[str, str]) -> str | None:
    current = spec.get("nodeSelector") or {}
    for key, value in wanted.items():
        if key in current and current[key] != value:
            return f"nodeSelector {key} conflicts"
    return None


def _planned(
    policy: OraclePolicy,
    container: Mapping[str, Any],
    spec: Mapping[str, Any],
    policies: OraclePolicies,
    *,
    mode: str,
    resource: str,
    quantity: int,
    selector: Mapping[str, str],
    pool: str | None = None,
    node_gpu_memory_mib: int | None = None,
) -> Expected:
    problem = _gpu_asks_problem(spec, container, resource, quantity, policies)
    problem = problem or _selector_problem(spec, selector)
    if problem:
        return denied(problem, policy)
    return Expected(
        "planned",
        "planned",
        policy=policy.name,
        mode=mode,
        container=container.get("name"),
        resource=resource,
        quantity=quantity,
        pool=pool,
        node_selector={**(spec.get("nodeSelector") or {}), **selector},
        node_gpu_memory_mib=node_gpu_memory_mib,
    )


def _whole(
    policy: OraclePolicy,
    container: Mapping[str, Any],
    count: int,
    spec: Mapping[str, Any],
    policies: OraclePolicies,
) -> Expected:
    if count > policy.get("wholeGpus", "max", default=8):
        return denied("more whole GPUs than the policy allows", policy)
    return _planned(
        policy,
        container,
        spec,
        policies,
        mode="whole-gpu",
        resource=policy.get("wholeGpus", "resourceName", default=WHOLE_GPU_RESOURCE),
        quantity=count,
        selector=policy.get("wholeGpus", "nodeSelector", default={}),
    )


def _headroom(policy: OraclePolicy) -> Fraction:
    text = policy.get("headroom")
    if not text:
        return Fraction(0)
    assert str(text).endswith("%"), "memory headroom is out of the oracle's scope"
    return Fraction(str(text)[:-1]) / 100


def _placement(policy: OraclePolicy, share: Fraction) -> tuple[OraclePool, int] | None:
    pools = policy.pools
    if policy.get("allocation", default="replica-class") == "count":
        options = [(p, max(1, math.ceil(share * p.replicas))) for p in pools]
        options = [(p, slots) for p, slots in options if slots <= p.replicas]
        if not options:
            return None
        return min(options, key=lambda option: Fraction(option[1], option[0].replicas))
    fitting = [p for p in pools if Fraction(1, p.replicas) >= share]
    if not fitting:
        return None
    return max(fitting, key=lambda p: p.replicas), 1


def _shared(
    policy: OraclePolicy,
    container: Mapping[str, Any],
    share: Fraction,
    spec: Mapping[str, Any],
    policies: OraclePolicies,
) -> Expected:
    low = Fraction(str(policy.get("fraction", "min", default=0.01)))
    high = Fraction(str(policy.get("fraction", "max", default=1)))
    if share < low or share > high:
        return denied("the share is outside the policy's bounds", policy)
    placement = _placement(policy, share)
    if placement is None:
        return denied("no pool serves the share", policy)
    if share - _headroom(policy) <= 0:
        return denied("the headroom leaves nothing", policy)
    pool, slots = placement
    return _on_pool(policy, container, spec, policies, pool, slots)


def _on_pool(
    policy: OraclePolicy,
    container: Mapping[str, Any],
    spec: Mapping[str, Any],
    policies: OraclePolicies,
    pool: OraclePool,
    slots: int,
    node_gpu_memory_mib: int | None = None,
) -> Expected:
    mode = policy.get("mode")
    selector = {
        GFD_REPLICAS_LABEL: str(pool.replicas),
        GFD_STRATEGY_LABEL: "mps" if mode == "mps" else "time-slicing",
        **pool.node_selector,
    }
    if mode == "mps-daemon":
        selector[policy.get("mpsDaemon", "readyLabel", default=MPS_READY_LABEL)] = "true"
    return _planned(
        policy,
        container,
        spec,
        policies,
        mode=mode,
        resource=policy.get("resourceName", default=SHARED_GPU_RESOURCE),
        quantity=slots,
        selector=selector,
        pool=pool.name,
        node_gpu_memory_mib=node_gpu_memory_mib,
    )


def _selected_model_memory(spec: Mapping[str, Any], policies: OraclePolicies) -> Fraction | None:
    """Rule 4's refusal: the GPU memory of the model the pod's nodeSelector names, where a
    policy's pools name the same model with gpuMemory (the largest such); None if unknown.
    (Generated pools name models through GFD's product only, without -SHARED.)"""
    selected = (spec.get("nodeSelector") or {}).get(GFD_PRODUCT_LABEL)
    declared = [
        p.gpu_memory_mib
        for p in policies.policies
        if p.gpu_memory_mib is not None
        and any(pool.node_selector.get(GFD_PRODUCT_LABEL) == selected for pool in p.pools)
    ]
    return max(declared) if selected is not None and declared else None


def _sized_by_nodes(
    policy: OraclePolicy,
    container: Mapping[str, Any],
    memory: Fraction,
    spec: Mapping[str, Any],
    policies: OraclePolicies,
) -> Expected:
    """Rule 4 without gpuMemory: the largest slice, and nodes whose GPUs hold the ask."""
    pool = min(policy.pools, key=lambda p: p.replicas)  # the first listed on a tie
    high = Fraction(str(policy.get("fraction", "max", default=1)))
    share = min(Fraction(1, pool.replicas), high)
    if share - _headroom(policy) <= 0:
        return denied("the headroom leaves nothing", policy)
    node_memory = math.ceil(memory / share)
    known = _selected_model_memory(spec, policies)
    if known is not None and known < node_memory:
        return denied("the pod selects a GPU model too small for the ask", policy)
    planned = _on_pool(policy, container, spec, policies, pool, 1, node_memory)
    low = Fraction(str(policy.get("fraction", "min", default=0.01)))
    if share < low and planned.outcome == "planned":
        return replace(planned, notes=(MIN_NOT_APPLIED,))
    return planned
