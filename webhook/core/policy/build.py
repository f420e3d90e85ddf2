"""Policy values from a schema-valid document: one builder per section of the spec.

Builders pass a dataclass only the keys the document holds, so ``model`` alone owns the
defaults. They report nothing: a value that cannot be read (a GPU memory size below 1Mi)
builds as absent, and ``rules`` says what is wrong with it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from webhook.core.policy.enforcement import build_enforcement
from webhook.core.policy.model import (
    Allocation,
    DirectRequests,
    DraSettings,
    DraSharing,
    Frameworks,
    Headroom,
    InferenceServers,
    Injections,
    JaxKnobs,
    Match,
    Mode,
    MpsDaemonSettings,
    MpsSettings,
    Policy,
    Pool,
    PyTorchKnobs,
    ServerMemory,
    TensorFlowKnobs,
    WholeGpus,
    frozen_map,
)
from webhook.core.policy.quota import build_quota
from webhook.core.policy.schemes import SCHEME_SECTIONS, build_schemes, scheme_resource
from webhook.core.quantity import parse_memory_mib


def memory_mib(text: str | None) -> int | None:
    """MiB of a GPU memory size; None where absent or not a size of at least 1Mi."""
    if text is None:
        return None
    mib = parse_memory_mib(text)
    if mib is None or mib < 1:
        return None
    return math.floor(mib)


# (YAML key, dataclass field, conversion) for each key a section may hold.
_Fields = tuple[tuple[str, str, Callable[[Any], Any]], ...]


def _as_is(value: Any) -> Any:
    return value


def _present(raw: Mapping[str, Any], fields: _Fields) -> dict[str, Any]:
    """Keyword arguments for the keys ``raw`` holds; the dataclasses own the defaults."""
    return {name: convert(raw[key]) for key, name, convert in fields if key in raw}


def _frozen_maps(items: Iterable[Mapping[str, str]]) -> tuple[Mapping[str, str], ...]:
    return tuple(frozen_map(item) for item in items)


def _env_pairs(env: Iterable[Mapping[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple((entry["name"], entry["value"]) for entry in env)


_POLICY_FIELDS: _Fields = (
    ("default", "default", bool),
    ("priority", "priority", int),
    ("resourceName", "resource_name", _as_is),
    ("allocation", "allocation", Allocation),
    ("directResourceRequests", "direct_requests", DirectRequests),
)
_FRACTION_FIELDS: _Fields = (("min", "min_fraction", float), ("max", "max_fraction", float))
_MATCH_FIELDS: _Fields = (
    ("namespaces", "namespaces", tuple),
    ("excludeNamespaces", "exclude_namespaces", tuple),
    ("podLabels", "pod_labels", frozen_map),
)
_POOL_FIELDS: _Fields = (
    ("gpusPerNode", "gpus_per_node", _as_is),
    ("nodeSelector", "node_selector", frozen_map),
    ("devicePluginConfig", "device_plugin_config", _as_is),
)
_WHOLE_GPU_FIELDS: _Fields = (
    ("resourceName", "resource_name", _as_is),
    ("max", "max", _as_is),
    ("nodeSelector", "node_selector", frozen_map),
)
_IMAGE_FIELDS: _Fields = (
    ("images", "images", tuple),
    ("versions", "versions", lambda versions: tuple(versions.items())),
)
_TENSORFLOW_FIELDS: _Fields = (*_IMAGE_FIELDS, ("allowGrowth", "allow_growth", _as_is))
_JAX_FIELDS: _Fields = (
    *_IMAGE_FIELDS,
    ("memoryFraction", "memory_fraction", _as_is),
    ("preallocate", "preallocate", _as_is),
)
_PYTORCH_FIELDS: _Fields = (*_IMAGE_FIELDS, ("memoryFraction", "memory_fraction", _as_is))
_FRAMEWORKS_FIELDS: _Fields = (("allContainers", "all_containers", _as_is),)
_INFERENCE_FIELDS: _Fields = (
    ("memory", "memory", ServerMemory),
    ("vllmImages", "vllm_images", tuple),
    ("sglangImages", "sglang_images", tuple),
)
_MPS_FIELDS: _Fields = (
    ("enforceThreadPercentage", "enforce_thread_percentage", _as_is),
    ("enforceMemoryLimit", "enforce_memory_limit", _as_is),
    ("threadOverprovision", "thread_overprovision", float),
)
_MPS_DAEMON_FIELDS: _Fields = (
    ("pipeDirectory", "pipe_directory", _as_is),
    ("logDirectory", "log_directory", _as_is),
    ("readyLabel", "ready_label", _as_is),
    ("hostIPC", "host_ipc", _as_is),
    ("setExclusiveProcess", "set_exclusive_process", _as_is),
)
_DRA_FIELDS: _Fields = (
    ("deviceClassName", "device_class", _as_is),
    ("driver", "driver", _as_is),
    ("capacity", "capacity", _as_is),
)
_DRA_SELECTOR_FIELDS: _Fields = (
    ("productNames", "product_names", tuple),
    ("architectures", "architectures", tuple),
)
_DRA_SHARING_FIELDS: _Fields = (
    ("strategy", "sharing", DraSharing),
    ("timeSlicingInterval", "time_slice_interval", _as_is),
)
_TOLERATION_FIELDS: _Fields = (("tolerations", "tolerations", _frozen_maps),)
_INJECT_FIELDS: _Fields = (
    ("env", "env", _env_pairs),
    ("labels", "labels", frozen_map),
    ("annotations", "annotations", frozen_map),
)


def spec_version(spec: Mapping[str, Any]) -> str:
    """12 hex digits of the spec's canonical JSON: equal specs, equal versions."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def build_policy(name: str, source: str, spec: Mapping[str, Any]) -> Policy:
    """The policy a schema-valid spec describes, valid or not (``rules`` tells)."""
    return Policy(
        name=name,
        source=source,
        version=spec_version(spec),
        mode=Mode(spec["mode"]),
        pools=_pools(spec),
        match=Match(**_present(spec.get("match", {}), _MATCH_FIELDS)),
        whole_gpus=WholeGpus(**_present(spec.get("wholeGpus", {}), _WHOLE_GPU_FIELDS)),
        headroom=_headroom(spec.get("headroom")),
        frameworks=_frameworks(spec.get("frameworks", {})),
        inference_servers=InferenceServers(
            **_present(spec.get("inferenceServers", {}), _INFERENCE_FIELDS)
        ),
        mps=MpsSettings(**_present(spec.get("mps", {}), _MPS_FIELDS)),
        mps_daemon=MpsDaemonSettings(**_present(spec.get("mpsDaemon", {}), _MPS_DAEMON_FIELDS)),
        dra=_dra(spec),
        inject=_injections(spec),
        quota=build_quota(spec.get("quota")),
        enforcement=build_enforcement(spec.get("enforcement")),
        schemes=build_schemes(spec, memory_mib(spec.get("gpuMemory")))
        if Mode(spec["mode"]) in SCHEME_SECTIONS
        else None,
        **_present(spec, _POLICY_FIELDS),
        **scheme_resource(spec),
        **_present(spec.get("fraction", {}), _FRACTION_FIELDS),
    )


def _pools(spec: Mapping[str, Any]) -> tuple[Pool, ...]:
    """Pools; one without (valid) gpuMemory of its own gets spec.gpuMemory."""
    default_memory = memory_mib(spec.get("gpuMemory"))
    pools: list[Pool] = []
    for raw in spec.get("pools", ()):  # the dra mode has none
        memory = memory_mib(raw.get("gpuMemory"))
        pools.append(
            Pool(
                name=raw["name"],
                replicas=raw["replicas"],
                gpu_memory_mib=memory if memory is not None else default_memory,
                **_present(raw, _POOL_FIELDS),
            )
        )
    return tuple(pools)


def _dra(spec: Mapping[str, Any]) -> DraSettings:
    """``dra``, with spec.gpuMemory; sizes that cannot be read build as 0 (``rules`` tell)."""
    raw = spec.get("dra", {})
    selectors = raw.get("selectors", {})
    sizes: dict[str, Any] = {"gpu_memory_mib": memory_mib(spec.get("gpuMemory")) or 0}
    if "granularity" in raw:
        sizes["granularity_mib"] = memory_mib(raw["granularity"]) or 0
    if "minGpuMemory" in selectors:
        sizes["min_gpu_memory_mib"] = memory_mib(selectors["minGpuMemory"]) or 0
    return DraSettings(
        **_present(raw, _DRA_FIELDS),
        **_present(selectors, _DRA_SELECTOR_FIELDS),
        **_present(raw.get("sharing", {}), _DRA_SHARING_FIELDS),
        **sizes,
    )


def _headroom(text: str | None) -> Headroom:
    if not text:
        return Headroom()
    if text.endswith("%"):
        return Headroom(fraction=float(text[:-1]) / 100)
    mib = parse_memory_mib(text)
    return Headroom(memory_mib=math.ceil(mib or 0))


def _frameworks(raw: Mapping[str, Any]) -> Frameworks:
    return Frameworks(
        tensorflow=TensorFlowKnobs(**_present(raw.get("tensorflow", {}), _TENSORFLOW_FIELDS)),
        jax=JaxKnobs(**_present(raw.get("jax", {}), _JAX_FIELDS)),
        pytorch=PyTorchKnobs(**_present(raw.get("pytorch", {}), _PYTORCH_FIELDS)),
        **_present(raw, _FRAMEWORKS_FIELDS),
    )


def _injections(spec: Mapping[str, Any]) -> Injections:
    """``inject``, plus the policy's ``tolerations``."""
    return Injections(
        **_present(spec.get("inject", {}), _INJECT_FIELDS),
        **_present(spec, _TOLERATION_FIELDS),
    )
