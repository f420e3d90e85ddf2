"""Hypothesis strategies for the differential tests: valid policy sets within the oracle's
scope (``oracle`` module docstring), and pods that probe them.

Policies: 1-4 ``GpuSharingPolicy`` documents over the three modes and both allocations,
1-3 pools each, fraction bounds, namespace names and globs, excluded namespaces, pod
labels, priorities, default policies (unique priorities), whole-GPU settings, GPU memory,
percentage headroom, and sometimes a ``GpuSharingSettings`` document. Every set is valid
by the policy reference, so the core must load it.

Pods: 1-3 containers (plain names, Argo's main and wait, istio-proxy) and 0-2 init
containers, in one of the namespaces the globs are
written for, with ``gpu-fraction`` (shares with up to four decimals, the policies' own
edges: 1/R of each pool, fraction.min and .max; whole numbers; refused spellings),
sometimes ``gpu-memory`` (agreeing exactly, disagreeing, or alone),
``gpu-fraction-container-name``, node selectors that agree or conflict with the pools,
and GPU resources already set on the GPU container.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from fractions import Fraction
from typing import Any

import yaml
from hypothesis import strategies as st

from tests.oracle.oracle import OraclePolicies, default_container
from webhook.constants import (
    CONTAINER_ANNOTATION,
    FRACTION_ANNOTATION,
    GFD_REPLICAS_LABEL,
    GFD_STRATEGY_LABEL,
    MEMORY_ANNOTATION,
    MIRROR_POD_ANNOTATION,
)

API_VERSION = "gpushare.io/v1alpha1"
CONTAINER_NAMES = ("c0", "c1", "c2", "main", "wait", "istio-proxy")
NAMESPACES = (
    "team-a",
    "team-b",
    "ml-x",
    "ml-yy",
    "research",
    "prod",
    "a",
    "b1",
    "default",
    "infer-1",
    "kube-system",
    "kube-public",
    "gpushare-system",
)
GLOBS = ("team-*", "ml-*", "*", "team-a", "research", "prod", "[ab]*", "?", "infer-?", "ml-x", "**")
LABELS = {"team": ("a", "b"), "tier": ("gold", "silver")}
SHARED_RESOURCES = ("nvidia.com/gpu.shared", "example.com/gpu-slice")
WHOLE_RESOURCES = ("nvidia.com/gpu", "example.com/whole-gpu")
GPU_MEMORY = {"80Gi": 81920, "24Gi": 24576, "40960Mi": 40960, "16Gi": 16384}
REPLICAS = st.sampled_from([2, 3, 4, 5, 8, 10, 16, 48]) | st.integers(2, 48)
MIN_FRACTIONS = ("0.01", "0.05", "0.1", "0.2", "0.25")
MAX_FRACTIONS = ("0.25", "0.5", "0.75", "0.9", "1")
REFUSED_FRACTIONS = (
    "abc",
    "",
    "0",
    "0.0",
    "-0.5",
    "1.5",
    "50%",
    "0.5.1",
    "nan",
    "inf",
    "1e-9",
    " 0.5",
    "0,5",
    "1025",
    "0." + "1" * 40,
)


class _Dumper(yaml.SafeDumper):
    """Writes every value out: policy files may not use YAML aliases (&id001 / *id001)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _pool(name: str, replicas: int, count: bool, selector: dict[str, str] | None) -> dict[str, Any]:
    pool: dict[str, Any] = {"name": name, "replicas": replicas}
    if count:
        pool["gpusPerNode"] = 1
    if selector:
        pool["nodeSelector"] = selector
    return pool


@st.composite
def policy_document(draw: st.DrawFn, name: str, default: bool, priority: int) -> dict[str, Any]:
    mode = draw(st.sampled_from(["time-slicing", "mps", "mps-daemon"]))
    count = mode != "mps" and draw(st.booleans())
    replicas = draw(st.lists(REPLICAS, min_size=1, max_size=3))
    pool_selectors = st.none() | st.sampled_from(
        [{"nvidia.com/gpu.product": "NVIDIA-L4"}, {"example.com/zone": "a"}]
    )
    spec: dict[str, Any] = {
        "mode": mode,
        "pools": [
            _pool(f"pool-{i}", r, count, draw(pool_selectors)) for i, r in enumerate(replicas)
        ],
    }
    if count or draw(st.booleans()):
        spec["allocation"] = "count" if count else "replica-class"
    if default:
        spec["default"] = True
    if priority or draw(st.booleans()):
        spec["priority"] = priority
    match: dict[str, Any] = {}
    globs = draw(st.lists(st.sampled_from(GLOBS), min_size=0 if default else 1, max_size=3))
    if globs:
        match["namespaces"] = globs
    excludes = draw(st.lists(st.sampled_from((*GLOBS[3:], "team-b", "kube-*")), max_size=2))
    if excludes:
        match["excludeNamespaces"] = excludes
    if not default:
        keys = draw(st.lists(st.sampled_from(sorted(LABELS)), max_size=2, unique=True))
        labels = {key: draw(st.sampled_from(LABELS[key])) for key in keys}
        if labels:
            match["podLabels"] = labels
    if match:
        spec["match"] = match
    low = Fraction("0.01")  # the policy reference's default fraction.min
    if draw(st.booleans()):
        low_text = draw(st.sampled_from(MIN_FRACTIONS))
        high_text = draw(st.sampled_from([m for m in MAX_FRACTIONS if float(m) >= float(low_text)]))
        spec["fraction"] = {"min": float(low_text), "max": float(high_text)}
        low = Fraction(low_text)
    if mode != "time-slicing" or draw(st.booleans()):
        spec["gpuMemory"] = draw(st.sampled_from(sorted(GPU_MEMORY)))
    if draw(st.booleans()):
        # At most half the smallest share: the planner's 1/1000 flooring of share - headroom
        # never reaches zero (that edge has a test of its own).
        hundredths = draw(st.integers(0, int(low * 100 * 100 / 2)))
        spec["headroom"] = _exact(Fraction(hundredths, 100)) + "%"
    shared = draw(st.sampled_from(SHARED_RESOURCES))
    if shared != SHARED_RESOURCES[0] or draw(st.booleans()):
        spec["resourceName"] = shared
    if draw(st.booleans()):
        whole: dict[str, Any] = {"max": draw(st.integers(0, 8))}
        resource = draw(st.sampled_from(WHOLE_RESOURCES))
        whole["resourceName"] = resource
        if resource == shared:
            whole["max"] = 0
        if draw(st.booleans()):
            whole["nodeSelector"] = {GFD_STRATEGY_LABEL: "none"}
        spec["wholeGpus"] = whole
    if mode == "mps-daemon" and draw(st.booleans()):
        spec["mpsDaemon"] = {"readyLabel": "example.com/mps-up"}
    return {
        "apiVersion": API_VERSION,
        "kind": "GpuSharingPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


@st.composite
def policy_texts(draw: st.DrawFn) -> list[str]:
    """1-4 policies (and maybe settings) as YAML, in one or two files."""
    count = draw(st.integers(1, 4))
    defaults = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    priorities = draw(
        st.lists(st.integers(-3, 3), min_size=count, max_size=count, unique=True)
        | st.lists(st.integers(-1, 1), min_size=count, max_size=count)
    )
    # Two defaults with one priority are refused by the policy reference: keep them apart.
    seen: set[int] = set()
    for index, is_default in enumerate(defaults):
        if is_default and priorities[index] in seen:
            defaults[index] = False
        elif is_default:
            seen.add(priorities[index])
    documents: list[dict[str, Any]] = [
        draw(policy_document(f"p{i}", defaults[i], priorities[i])) for i in range(count)
    ]
    if draw(st.booleans()):
        excluded = draw(
            st.lists(
                st.sampled_from(["kube-*", "gpushare-system", "prod", "team-b", "b?"]), max_size=3
            )
        )
        documents.insert(
            draw(st.integers(0, len(documents))),
            {
                "apiVersion": API_VERSION,
                "kind": "GpuSharingSettings",
                "metadata": {"name": "settings"},
                "spec": {"excludeNamespaces": excluded},
            },
        )
    split = draw(st.integers(1, len(documents)))
    parts = [documents[:split], documents[split:]]
    return [yaml.dump_all(part, Dumper=_Dumper, sort_keys=False) for part in parts if part]


def _decimal(value: Fraction, places: int = 4) -> str:
    """``value`` cut (not rounded) to ``places`` decimals, as a plain decimal."""
    scaled = value.numerator * 10**places // value.denominator
    text = f"{scaled // 10**places}.{scaled % 10**places:0{places}d}".rstrip("0").rstrip(".")
    return text


def _exact(value: Fraction) -> str:
    """An exact plain decimal of ``value`` (its denominator divides a power of ten)."""
    for places in range(0, 30):
        if (value * 10**places).denominator == 1:
            scaled = int(value * 10**places)
            if places == 0:
                return str(scaled)
            return f"{scaled // 10**places}.{scaled % 10**places:0{places}d}"
    raise ValueError(value)


@st.composite
def fraction_text(draw: st.DrawFn, policies: OraclePolicies) -> str:
    edges = {"0.0001", "0.01", "0.05", "0.1", "0.25", "0.5", "0.75", "0.9", "0.9999"}
    for policy in policies.policies:
        for pool in policy.pools:
            edges.add(_decimal(Fraction(1, pool.replicas)))
            edges.add(_decimal(Fraction(1, pool.replicas) + Fraction(1, 10**4)))
        for bound in (policy.get("fraction") or {}).values():
            edges.add(_exact(Fraction(str(bound))))
    edges = {e for e in edges if e not in ("0", "1")}
    kind = draw(st.sampled_from(["fitting"] * 4 + ["share", "edge", "edge", "whole", "refused"]))
    if kind == "fitting":  # within one policy's bounds and slices: mostly planned
        policy = draw(st.sampled_from(policies.policies))
        low = Fraction(str(policy.get("fraction", "min", default=0.01)))
        high = min(
            Fraction(str(policy.get("fraction", "max", default=1))),
            Fraction(1, min(pool.replicas for pool in policy.pools)),
        )
        if low <= high:
            return _decimal(Fraction(draw(st.integers(int(low * 10**4), int(high * 10**4))), 10**4))
        kind = "share"
    if kind == "share":
        return _decimal(Fraction(draw(st.integers(1, 9999)), 10**4))
    if kind == "edge":
        return draw(st.sampled_from(sorted(edges)))
    if kind == "whole":
        return str(draw(st.sampled_from([1, 2, 3, 8, 9, 1024])))
    return draw(st.sampled_from(REFUSED_FRACTIONS))


def _mostly(usual: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> Any:
    """``usual`` five times in six, else ``other`` (``|`` weighs its branches unevenly)."""
    return st.sampled_from([True] * 5 + [False]).flatmap(lambda pick: usual if pick else other)


@st.composite
def pods(draw: st.DrawFn, policies: OraclePolicies) -> tuple[dict[str, Any], str]:
    """(pod, namespace) for ``policies``."""
    # Mostly a namespace some policy names, so that most pods are governed.
    named = [
        namespace
        for namespace in NAMESPACES
        if any(
            fnmatchcase(namespace, glob)
            for policy in policies.policies
            for glob in policy.get("match", "namespaces", default=[])
        )
    ]
    namespace = draw(_mostly(st.sampled_from(named or NAMESPACES), st.sampled_from(NAMESPACES)))
    # Plain names, a known GPU container name and known helpers (oracle rule 5).
    names = draw(st.lists(st.sampled_from(CONTAINER_NAMES), min_size=1, max_size=3, unique=True))
    init_names = [f"i{i}" for i in range(draw(st.integers(0, 2)))]
    annotations: dict[str, str] = {}
    fraction = draw(_mostly(fraction_text(policies), st.none()))
    if fraction is not None:
        annotations[FRACTION_ANNOTATION] = fraction
    memory_kind = draw(st.sampled_from(["none"] * 5 + ["agree", "disagree", "alone", "bad"]))
    if memory_kind != "none" or fraction is None:
        gpu_memory = draw(st.sampled_from(sorted(GPU_MEMORY.values())))
        share = Fraction(fraction) if fraction and _is_share(fraction) else None
        if memory_kind == "agree" and share is not None:
            annotations[MEMORY_ANNOTATION] = _exact(share * gpu_memory) + "Mi"
        elif memory_kind == "disagree" and share is not None:
            factor = draw(st.sampled_from([Fraction(1, 2), Fraction(5, 4), Fraction(2)]))
            annotations[MEMORY_ANNOTATION] = _exact(share * gpu_memory * factor) + "Mi"
        elif memory_kind == "bad":
            annotations[MEMORY_ANNOTATION] = draw(
                st.sampled_from(["abc", "-1Gi", "0", "1e3", "1.5", "0.5", "00", "8 Gi"])
            )
        else:  # a bare whole number is MiB
            annotations[MEMORY_ANNOTATION] = draw(
                st.sampled_from(
                    [
                        *("1Gi", "8Gi", "10Gi", "20480Mi", "16G", "12Gi", "40Gi", "100Mi"),
                        *("8000", "16", "20480", "1", "81920", "500M", "0.5Gi"),
                    ]
                )
            )
    target = draw(
        _mostly(st.none() | st.sampled_from(names), st.sampled_from([*init_names, "nope", ""]))
    )
    if target is not None:
        annotations[CONTAINER_ANNOTATION] = target
    if draw(st.sampled_from([False] * 30 + [True])):
        annotations[MIRROR_POD_ANNOTATION] = "abc"
    labels = {
        key: draw(st.sampled_from(values)) for key, values in LABELS.items() if draw(st.booleans())
    }
    containers: list[dict[str, Any]] = [
        {"name": name, "image": "nvcr.io/nvidia/pytorch:25.01-py3"} for name in names
    ]
    gpu_index = names.index(target) if target in names else default_container(names)
    existing = draw(
        st.sampled_from(
            [None] * 16
            + [
                {"nvidia.com/gpu": "1"},
                {"nvidia.com/gpu.shared": "1"},
                {"example.com/gpu-slice": "2"},
                {"nvidia.com/mig-1g.5gb": "1"},
                {"cpu": "1"},
            ]
        )
    )
    if existing is not None:
        resources = {"limits": dict(existing)}
        if draw(st.booleans()):
            resources["requests"] = dict(existing)
        containers[gpu_index]["resources"] = resources
    spec: dict[str, Any] = {"containers": containers}
    if init_names:
        spec["initContainers"] = [{"name": name, "image": "busybox"} for name in init_names]
    # Now and then a GPU asked by hand elsewhere: another container, an init container (a
    # sidecar where restartPolicy is Always) or an ephemeral container.
    elsewhere = draw(st.sampled_from([None] * 12 + ["containers", "initContainers", "ephemeral"]))
    others = [c for i, c in enumerate(containers) if i != gpu_index]
    if elsewhere == "containers" and others:
        others[0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    elif elsewhere == "initContainers" and init_names:
        spec["initContainers"][0]["restartPolicy"] = "Always"
        spec["initContainers"][0]["resources"] = {"limits": {"nvidia.com/gpu.shared": "1"}}
    elif elsewhere == "ephemeral":
        spec["ephemeralContainers"] = [
            {"name": "debug", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
        ]
    selector = draw(
        st.sampled_from(
            [None] * 6
            + [
                {"kubernetes.io/arch": "amd64"},
                {GFD_REPLICAS_LABEL: "4"},
                {GFD_REPLICAS_LABEL: "2", GFD_STRATEGY_LABEL: "time-slicing"},
                {GFD_STRATEGY_LABEL: "mps"},
                {"nvidia.com/gpu.product": "NVIDIA-L4"},
            ]
        )
    )
    if selector is not None:
        spec["nodeSelector"] = selector
    metadata: dict[str, Any] = {"name": "pod", "namespace": namespace, "annotations": annotations}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}, namespace


def _is_share(text: str) -> bool:
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return False
    return 0 < value < 1 and len(text) <= 32 and text.replace(".", "", 1).isdigit()
