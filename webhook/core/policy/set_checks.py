"""Checks across a loaded policy set that loading does not refuse: what ``gpushare policy
check`` reports besides the problems that make a set invalid.

Each finding is an error (the set cannot work as written: every pod it is meant for is
denied or never schedules) or a warning (part of what a policy says has no effect). The
device-plugin-config clashes between pools are the node side's (``webhook.node.pools``);
the CLI adds them as errors.

* fractions no pool can serve: under replica-class a fraction takes one slot of a pool
  whose slice 1/R is at least the fraction, so asks above the largest slice are denied.
  All of ``fraction`` above it: error; part of it: warning.
* namespaces excluded from every policy (``kube-system`` always; the GpuSharingSettings'
  ``excludeNamespaces``) named in ``match.namespaces``: the webhook never sees their pods.
  Every namespace a non-default policy names: error; some: warning.
* pool ``nodeSelector`` values no GPU Feature Discovery label can have on the pool's nodes:
  error (the pool's pods never schedule).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fnmatch import fnmatchcase

import yaml

from webhook.constants import (
    ALWAYS_EXCLUDED_NAMESPACES,
    GFD_MEMORY_LABEL,
    GFD_PRODUCT_LABEL,
    GFD_REPLICAS_LABEL,
    GFD_STRATEGY_LABEL,
    SHARED_GPU_RESOURCE,
    WHOLE_GPU_RESOURCE,
)
from webhook.core.policy.loader import _join, _line_of
from webhook.core.policy.model import Allocation, Mode, Policy, PolicySet
from webhook.core.policy.yaml_reader import compose_documents, load_documents

# Float slack, as in placement: "0.25" fits a 1/4 slot.
_EPSILON = 1e-9
_GLOB_CHARACTERS = frozenset("*?[")
# GFD's product label gets this suffix where a resource is shared under its own name.
SHARED_PRODUCT_SUFFIX = "-SHARED"


class Severity(StrEnum):
    ERROR = "error"  # `gpushare policy check` exits 2
    WARNING = "warning"  # printed; exit 0


@dataclass(frozen=True)
class SetFinding:
    """One finding about one policy, at ``at`` (a YAML path) in its document."""

    severity: Severity
    policy: Policy
    at: tuple[str | int, ...]
    message: str


def check_policy_set(policies: PolicySet) -> list[SetFinding]:
    """Every finding of the set, policy by policy in file order, errors and warnings mixed."""
    findings: list[SetFinding] = []
    for policy in policies.policies:
        findings += _fractions_no_pool_serves(policy)
        findings += _excluded_namespaces_named(policy, policies.excluded_namespaces)
        findings += _pool_selectors_gfd_never_sets(policy)
    return findings


def _fractions_no_pool_serves(policy: Policy) -> list[SetFinding]:
    # count: ceil(f*R) <= R slots, every f <= 1 fits; no pools: the dra mode, sized per ask.
    if policy.allocation is Allocation.COUNT or not policy.pools:
        return []
    largest = max(pool.slice_fraction for pool in policy.pools)
    low, high = policy.min_fraction, min(policy.max_fraction, 1.0)
    if high <= largest + _EPSILON:
        return []
    biggest = max(policy.pools, key=lambda pool: pool.slice_fraction)
    slot = f"pool {biggest.name!r} (1/{biggest.replicas} = {largest:.4g} of a GPU)"
    if low > largest + _EPSILON:
        message = (
            f"fraction.min {low} is above the largest slot of any pool, {slot}: every "
            "gpu-fraction and gpu-memory ask is denied; add a pool with fewer replicas or "
            f"lower fraction.min to at most {largest:.4g}"
        )
        return [SetFinding(Severity.ERROR, policy, ("spec", "fraction", "min"), message)]
    upto = "1 (not included: 1 is a whole GPU)" if high >= 1.0 else f"{high}"
    message = (
        f"fractions above {largest:.4g} up to {upto} are within fraction but above the "
        f"largest slot of any pool, {slot}: they are denied; lower fraction.max to "
        f"{largest:.4g} or add a pool with fewer replicas"
    )
    return [SetFinding(Severity.WARNING, policy, ("spec", "fraction", "max"), message)]


def _excluded_namespaces_named(policy: Policy, excluded: frozenset[str]) -> list[SetFinding]:
    named = policy.match.namespaces
    dead = [
        (index, name)
        for index, name in enumerate(named)
        if not _GLOB_CHARACTERS & set(name) and any(fnmatchcase(name, e) for e in excluded)
    ]
    if not dead:
        return []
    if len(dead) == len(named) and not policy.default:
        names = ", ".join(repr(name) for _, name in dead)
        message = (
            f"every namespace this policy matches ({names}) is excluded from all policies "
            f"({_why_excluded(dead[0][1])}), so it never applies: match other namespaces"
        )
        return [SetFinding(Severity.ERROR, policy, ("spec", "match", "namespaces"), message)]
    return [
        SetFinding(
            Severity.WARNING,
            policy,
            ("spec", "match", "namespaces", index),
            f"namespace {name!r} is excluded from all policies ({_why_excluded(name)}), so "
            "this entry has no effect: remove it",
        )
        for index, name in dead
    ]


def _why_excluded(name: str) -> str:
    if name in ALWAYS_EXCLUDED_NAMESPACES:
        return "always: the control plane's namespace; the webhook configurations leave it out"
    return (
        "GpuSharingSettings excludeNamespaces, or its default list where no settings are "
        "given; the webhook configurations leave it out"
    )


def _pool_selectors_gfd_never_sets(policy: Policy) -> list[SetFinding]:
    findings = []
    for index, pool in enumerate(policy.pools):
        expected = _gfd_labels(policy, pool.replicas)
        for key, value in pool.node_selector.items():
            problem = _gfd_mismatch(policy, key, value, expected)
            if problem:
                at = ("spec", "pools", index, "nodeSelector", key)
                findings.append(SetFinding(Severity.ERROR, policy, at, problem))
    return findings


def _gfd_labels(policy: Policy, replicas: int) -> dict[str, str]:
    """The values GFD gives the sharing labels on the nodes running this pool's config."""
    strategy = "mps" if policy.mode is Mode.MPS else "time-slicing"
    return {GFD_REPLICAS_LABEL: str(replicas), GFD_STRATEGY_LABEL: strategy}


def _gfd_mismatch(policy: Policy, key: str, value: str, expected: dict[str, str]) -> str:
    """Why GFD never labels this pool's nodes ``key=value``, or "" where it may."""
    if key in expected and value != expected[key]:
        return (
            f"GPU Feature Discovery labels the nodes of this pool {key}={expected[key]} (from "
            f"the pool's device-plugin config), never {value!r}: remove it (the webhook "
            "selects that label itself)"
        )
    if key == GFD_MEMORY_LABEL and not value.isdigit():
        return f"GPU Feature Discovery sets {key} to a whole number of MiB, never {value!r}"
    if key == GFD_PRODUCT_LABEL:
        return _product_mismatch(policy, value)
    return ""


def _product_mismatch(policy: Policy, value: str) -> str:
    # k8s-device-plugin v0.20.0, internal/lm/resource.go, getProductName: the product label
    # gets "-SHARED" appended when the resource is shared (replicas > 1) and not renamed
    # (rename is set by renameByDefault, api/config/v1/replicas.go). gpushare's config for a
    # pool sets renameByDefault exactly when the policy's resource is nvidia.com/gpu.shared
    # (webhook.node.device_plugin_config), so the suffix follows from resourceName.
    shared_suffix = value.endswith(SHARED_PRODUCT_SUFFIX)
    if policy.resource_name == WHOLE_GPU_RESOURCE and not shared_suffix:
        return (
            f"GPU Feature Discovery labels the nodes of this pool {GFD_PRODUCT_LABEL}="
            f"{value}{SHARED_PRODUCT_SUFFIX}: their device-plugin config shares "
            f"{WHOLE_GPU_RESOURCE} under its own name (resourceName {WHOLE_GPU_RESOURCE}), "
            f"and GFD then appends {SHARED_PRODUCT_SUFFIX} to the product; write "
            f"{value}{SHARED_PRODUCT_SUFFIX}, or use resourceName {SHARED_GPU_RESOURCE}"
        )
    if policy.resource_name == SHARED_GPU_RESOURCE and shared_suffix:
        plain = value.removesuffix(SHARED_PRODUCT_SUFFIX)
        return (
            f"GPU Feature Discovery labels the nodes of this pool {GFD_PRODUCT_LABEL}={plain}: "
            f"their device-plugin config renames the shared resource to "
            f"{SHARED_GPU_RESOURCE} (renameByDefault), and GFD appends "
            f"{SHARED_PRODUCT_SUFFIX} only to resources shared under their own name; "
            f"write {plain}"
        )
    return ""


# -- where a finding is, for problem lines -----------------------------------------------------


def finding_lines(
    findings: Iterable[SetFinding], texts: Sequence[tuple[str, str]]
) -> Iterator[str]:
    """``file: yaml.path: severity: message (line N)`` for each finding, with the line
    found in the policy's own text where ``texts`` (as loaded) hold it."""
    documents = _policy_documents(texts)
    for finding in findings:
        policy = finding.policy
        prefix, node = documents.get((policy.source, policy.name), ("", None))
        line = None if node is None else _line_of(node, finding.at)
        where = f" (line {line})" if line is not None else ""
        path = _join(prefix, finding.at)
        yield f"{policy.source}: {path}: {finding.severity.value}: {finding.message}{where}"


def _policy_documents(
    texts: Sequence[tuple[str, str]],
) -> dict[tuple[str, str], tuple[str, yaml.Node]]:
    """(source, policy name) -> (the loader's document prefix, the document's node)."""
    found: dict[tuple[str, str], tuple[str, yaml.Node]] = {}
    for source, text in texts:
        try:
            values, nodes = load_documents(text), compose_documents(text)
        except yaml.YAMLError:
            continue
        # The loader's numbering: documents that are not empty.
        nodes = [node for value, node in zip(values, nodes, strict=True) if value is not None]
        for index, node in enumerate(nodes):
            name = _metadata_name(node)
            if name is not None:
                prefix = f"[document {index + 1}]" if len(nodes) > 1 else ""
                found.setdefault((source, name), (prefix, node))
    return found


def _metadata_name(node: yaml.Node) -> str | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    for key, value in node.value:
        if key.value == "metadata" and isinstance(value, yaml.MappingNode):
            for inner_key, inner_value in value.value:
                if inner_key.value == "name" and isinstance(inner_value, yaml.ScalarNode):
                    return str(inner_value.value)
    return None
