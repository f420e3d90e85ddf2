"""NVIDIA device plugin configs generated from the policies, so pools and replica classes
come from one source and cannot drift.

Each pool becomes one named config of the device plugin's ``version: v1`` format
(k8s-device-plugin, api/config/v1/config.go and replicas.go):

* ``sharing.timeSlicing`` for time-slicing pools and for mps-daemon pools: there the device
  plugin only counts slots, and gpushare's own daemon does MPS;
* ``sharing.mps`` for mps pools, where the device plugin runs MPS itself;
* ``resources: [{name: nvidia.com/gpu, replicas: R}]`` (R >= 2: replicas.go refuses fewer);
* ``renameByDefault: true`` when the policy's resource is ``nvidia.com/gpu.shared``, the one
  rename the plugin honours (custom ``rename`` values are ignored: replicas.go,
  disableResoureRenaming);
* ``failRequestsGreaterThanOne: true`` for replica-class allocation (one slot per pod) and
  always under mps; false for count allocation, which asks for several slots.

All configs go into one ConfigMap for the GPU Operator's ``devicePlugin.config``; a node
picks its pool's config with the label ``nvidia.com/device-plugin.config=<name>``.

Unlabelled GPU nodes get the ConfigMap's ``default`` key, always written. NVIDIA's
config-manager (k8s-device-plugin cmd/config-manager/main.go, updateConfigName) takes the
label's config, else DEFAULT_CONFIG, else walks FALLBACK_STRATEGIES: ``named`` picks a key
called ``default``, ``single`` the only key, ``empty`` no config; when none applies it exits
with "no config was set, no default was provided, and all fallbacks failed" and the device
plugin pod never starts. The device plugin's chart defaults to ``[named, single]``
(deployments/helm/nvidia-device-plugin/values.yaml, config.fallbackStrategies): one key
would silently share every unlabelled GPU, several keys without ``default`` break the plugin
there. The GPU Operator sets ``empty`` (gpu-operator controllers/object_controls.go,
transformConfigManager*Container, since 76b03b2d) and DEFAULT_CONFIG from
``devicePlugin.config.default``. So the ``default`` key holds a deliberate choice: by
default no sharing at all (``version: v1`` alone: whole GPUs, as without a config), or with
``--default CONFIG`` a copy of one pool's config; and both charts are told
``default: default`` (guidance), so they agree.

A config whose pools belong to a policy that relies on the driver memory limit
(``enforcement.driverMemoryLimit`` ``inject`` or ``require``) also sets
``flags.plugin.deviceListStrategy: [cdi-annotations, cdi-cri]``: the toolkit's
``apply-cuda-memory-limits`` hook is a per-device hook of the CDI spec the device plugin
writes (kind ``k8s.device-plugin.nvidia.com/gpu``), so it runs only for GPUs injected
through that spec (docs/enforcement.md, docs/node-side.md). A node group has one config, so
a config shared with such a pool injects through CDI for every pool that uses it. Under
``auto`` (the default) the configs stay as they were: CDI injection needs a container runtime
with CDI enabled, which a policy author opts into, not a default that changes every node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from webhook.constants import (
    ANNOTATION_PREFIX,
    DEVICE_PLUGIN_CONFIG_LABEL,
    GFD_PRODUCT_LABEL,
    SHARED_GPU_RESOURCE,
    WHOLE_GPU_RESOURCE,
)
from webhook.core import (
    Allocation,
    DriverMemoryLimit,
    Mode,
    Policy,
    PolicySet,
    writes_driver_limit,
)
from webhook.node.errors import DevicePluginConfigError
from webhook.node.pools import PoolRef, pool_conflicts, pool_refs

DEFAULT_CONFIGMAP_NAME = "gpushare-device-plugin-configs"
DEFAULT_NAMESPACE = "gpu-operator"
MIN_REPLICAS = 2
# config-manager's NamedConfigFallback: the key the `named` fallback strategy looks for.
DEFAULT_KEY = "default"
# --default's value for "unlabelled nodes share nothing".
WHOLE_GPUS = "whole-gpus"
DEFAULT_CHOICE_ANNOTATION = f"{ANNOTATION_PREFIX}default-config"
# Devices injected through the plugin's CDI spec, where the driver limit's hook lives.
# k8s-device-plugin v0.20.0: api/config/v1/flags.go, PluginCommandLineFlags.DeviceListStrategy
# (``flags.plugin.deviceListStrategy``, one string or a list); values in consts.go;
# cmd/nvidia-device-plugin/main.go validateFlags (CDI needs an NVML-based node). Both, as the
# GPU Operator sets them with cdi.enabled (gpu-operator v26.7.0 controllers/object_controls.go,
# transformDevicePluginCtrForCDI): cdi-cri fills the CRI's CDIDevices field,
# cdi-annotations names the devices in cdi.k8s.io/ annotations, which nvidia-container-runtime
# also reads (toolkit v1.20.1 internal/info/auto.go: CDI mode for CDI-only requests). With
# only CDI strategies the plugin sets no NVIDIA_VISIBLE_DEVICES (internal/plugin/server.go,
# getAllocateResponse, AllCDIEnabled). An env DEVICE_LIST_STRATEGY outranks the config file
# (api/config/v1/config.go NewConfig: command line, then environment, then config file).
CDI_DEVICE_LIST_STRATEGY = ("cdi-annotations", "cdi-cri")
# GFD names a MIG device's product <product>-MIG-<profile> (mig.strategy single;
# k8s-device-plugin internal/lm/mig-strategy_test.go).
MIG_PRODUCT_MARK = "-MIG-"


@dataclass(frozen=True)
class DevicePluginConfig:
    """One named device plugin config and the pools (one or more policies) it serves."""

    name: str
    document: dict[str, Any]
    pools: tuple[PoolRef, ...]

    @property
    def strategy(self) -> str:
        return "mps" if "mps" in self.document["sharing"] else "time-slicing"

    @property
    def injects_through_cdi(self) -> bool:
        return "flags" in self.document

    def render(self) -> str:
        return yaml.safe_dump(self.document, sort_keys=False)


def _document(ref: PoolRef, *, cdi: bool) -> dict[str, Any]:
    policy, pool = ref.policy, ref.pool
    fail_above_one = policy.mode is Mode.MPS or policy.allocation is Allocation.REPLICA_CLASS
    strategy = "mps" if policy.mode is Mode.MPS else "timeSlicing"
    flags = {"flags": {"plugin": {"deviceListStrategy": list(CDI_DEVICE_LIST_STRATEGY)}}}
    return {
        "version": "v1",
        **(flags if cdi else {}),
        "sharing": {
            strategy: {
                "renameByDefault": policy.resource_name == SHARED_GPU_RESOURCE,
                "failRequestsGreaterThanOne": fail_above_one,
                "resources": [{"name": WHOLE_GPU_RESOURCE, "replicas": pool.replicas}],
            }
        },
    }


def pool_problems(ref: PoolRef) -> list[str]:
    """What the NVIDIA device plugin cannot express about this pool (one sentence each)."""
    policy, pool = ref.policy, ref.pool
    problems = []
    if policy.resource_name not in (WHOLE_GPU_RESOURCE, SHARED_GPU_RESOURCE):
        problems.append(
            f"{ref.where} uses resource {policy.resource_name!r}, but the NVIDIA device "
            f"plugin advertises a shared GPU only as {WHOLE_GPU_RESOURCE} or, with "
            f"renameByDefault, "
            f"{SHARED_GPU_RESOURCE}: set resourceName to one of those."
        )
    if pool.replicas < MIN_REPLICAS:
        problems.append(
            f"{ref.where} has replicas {pool.replicas}, but the device plugin shares a GPU "
            f"only with replicas >= {MIN_REPLICAS}: raise replicas, or serve whole GPUs "
            "without a sharing pool."
        )
    if policy.mode is Mode.MPS and policy.allocation is Allocation.COUNT:
        problems.append(
            f"{ref.where} combines mode mps with allocation count, but the device plugin's "
            "MPS mode refuses requests above one slot: use allocation replica-class."
        )
    return problems


def selects_cdi(policy: Policy) -> bool:
    """Whether the policy's pool configs inject through CDI: where it relies on the driver
    limit (inject, require), not under auto."""
    return writes_driver_limit(policy) and policy.enforcement.driver_memory_limit in (
        DriverMemoryLimit.INJECT,
        DriverMemoryLimit.REQUIRE,
    )


def hook_problems(ref: PoolRef) -> list[str]:
    """Why the driver memory limit's hook cannot run for the pods of a pool whose policy
    writes the limit (one sentence each); nothing for other pools."""
    if not writes_driver_limit(ref.policy):
        return []
    setting = ref.policy.enforcement.driver_memory_limit.value
    problems = []
    product = ref.pool.node_selector.get(GFD_PRODUCT_LABEL, "")
    if MIG_PRODUCT_MARK in product:
        problems.append(
            f"{ref.where} selects MIG devices ({GFD_PRODUCT_LABEL}={product}), which the "
            f"driver memory limit (driverMemoryLimit: {setting}) cannot cover: the toolkit "
            "attaches its hook to full GPUs only and NVML refuses limits on MIG devices; "
            "MIG already isolates memory, so set driverMemoryLimit: off."
        )
    if pool_problems(ref) and selects_cdi(ref.policy):
        problems.append(
            f"{ref.where} has no generated device-plugin config, which would inject its GPUs "
            f"through CDI for the driver memory limit's hook (driverMemoryLimit: {setting}): "
            "a config written by hand needs flags.plugin.deviceListStrategy "
            f"[{', '.join(CDI_DEVICE_LIST_STRATEGY)}] (the GPU Operator: cdi.enabled=true)."
        )
    return problems


def build_configs(policies: PolicySet) -> list[DevicePluginConfig]:
    """One config per distinct config name, in file order; DevicePluginConfigError lists
    every problem (unsupported values, and pools sharing a name but not a definition)."""
    refs = pool_refs(policies)
    problems = [p for ref in refs for p in pool_problems(ref)]
    problems += pool_conflicts(refs, key=lambda r: r.pool.config_name)
    if problems:
        raise DevicePluginConfigError(problems)
    grouped: dict[str, list[PoolRef]] = {}
    for ref in refs:
        grouped.setdefault(ref.pool.config_name, []).append(ref)
    return [
        DevicePluginConfig(
            name=name,
            document=_document(group[0], cdi=any(selects_cdi(r.policy) for r in group)),
            pools=tuple(group),
        )
        for name, group in grouped.items()
    ]


def default_document(configs: Sequence[DevicePluginConfig], choice: str) -> dict[str, Any]:
    """What the ``default`` key holds for ``--default choice`` (see the module docstring);
    DevicePluginConfigError when the choice cannot work on an unlabelled node."""
    by_name = {config.name: config for config in configs}
    if choice == WHOLE_GPUS:
        if DEFAULT_KEY in by_name:
            raise DevicePluginConfigError(
                [
                    f"a pool's device plugin config is named {DEFAULT_KEY!r}, the key "
                    "config-manager gives every unlabelled GPU node: pass --default "
                    f"{DEFAULT_KEY} to mean it, or give the pool another devicePluginConfig."
                ]
            )
        return {"version": "v1"}
    chosen = by_name.get(choice)
    if chosen is None:
        raise DevicePluginConfigError(
            [
                f"--default {choice!r} is neither {WHOLE_GPUS} nor a config of the policies' "
                f"pools ({', '.join(sorted(by_name)) or 'none'})."
            ]
        )
    daemon_pools = [ref.where for ref in chosen.pools if ref.policy.mode is Mode.MPS_DAEMON]
    if daemon_pools:
        raise DevicePluginConfigError(
            [
                f"--default {choice!r} serves {', '.join(daemon_pools)} in mode mps-daemon, "
                "whose MPS DaemonSet runs only on nodes labelled "
                f"{DEVICE_PLUGIN_CONFIG_LABEL}={choice}: an unlabelled node would advertise "
                "slots with no MPS daemon. Label those nodes instead, or choose another config."
            ]
        )
    return chosen.document


def config_map(
    configs: Sequence[DevicePluginConfig],
    *,
    name: str,
    namespace: str,
    sources: Sequence[str],
    default: str = WHOLE_GPUS,
) -> dict[str, Any]:
    """The ConfigMap for ``devicePlugin.config.name``: the ``default`` key, then one key
    per config."""
    data = {DEFAULT_KEY: yaml.safe_dump(default_document(configs, default), sort_keys=False)}
    data.update({config.name: config.render() for config in configs})
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "gpushare"},
            "annotations": {
                f"{ANNOTATION_PREFIX}generated-from": ",".join(sources),
                DEFAULT_CHOICE_ANNOTATION: default,
            },
        },
        "data": data,
    }


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the configs inside the ConfigMap) as ``|`` blocks, readable."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _represent_str)


def render(document: dict[str, Any]) -> str:
    """``document`` as YAML, the embedded configs as literal blocks."""
    return yaml.dump(document, Dumper=_BlockDumper, sort_keys=False)


def helm_values(document: dict[str, Any]) -> dict[str, Any]:
    """The ConfigMap as values of gpushare's chart (deploy/helm/gpushare, devicePluginConfig)."""
    metadata = document["metadata"]
    return {
        "devicePluginConfig": {
            "enabled": True,
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "data": dict(document["data"]),
        }
    }


def guidance(
    configs: Sequence[DevicePluginConfig],
    *,
    name: str,
    namespace: str,
    default: str = WHOLE_GPUS,
) -> str:
    """What to do with the ConfigMap: point the GPU Operator at it, label the nodes."""
    unlabelled = (
        "whole GPUs, no sharing" if default == WHOLE_GPUS else f"a copy of config {default}"
    )
    lines = [
        f"# ConfigMap {namespace}/{name} holds {len(configs)} device plugin config(s) and "
        f"{DEFAULT_KEY!r} ({unlabelled}) for unlabelled GPU nodes.",
        "# GPU Operator Helm values (or patch clusterpolicies.nvidia.com/cluster-policy "
        "spec.devicePlugin.config the same way):",
        f"#   --set devicePlugin.config.name={name} "
        f"--set devicePlugin.config.default={DEFAULT_KEY}",
        "# NVIDIA device plugin chart (nvidia-device-plugin) values:",
        f"#   --set config.name={name} --set config.default={DEFAULT_KEY}",
        "# Then label each pool's nodes with the config it should use:",
    ]
    daemon_configs: list[str] = []
    for config in configs:
        ref = config.pools[0]
        policies = ", ".join(sorted({r.policy.name for r in config.pools}))
        lines.append(
            f"#   pool {ref.pool.name} (policy {policies}; {ref.policy.mode.value}, "
            f"{ref.pool.replicas} slots per GPU, {config.strategy} in the device plugin):"
        )
        selector = ",".join(f"{k}={v}" for k, v in sorted(ref.pool.node_selector.items()))
        target = f"-l {selector}" if selector else "<node>"
        lines.append(
            f"#     kubectl label node {target} {DEVICE_PLUGIN_CONFIG_LABEL}={config.name} "
            "--overwrite"
        )
        if any(r.policy.mode is Mode.MPS_DAEMON for r in config.pools):
            daemon_configs.append(config.name)
    if daemon_configs:
        lines.append(
            "# Pools in mps-daemon mode also need gpushare's MPS DaemonSet (deploy/mps-daemon)"
            f" on their nodes: {DEVICE_PLUGIN_CONFIG_LABEL} in [{', '.join(daemon_configs)}]."
        )
    lines += _cdi_guidance(configs)
    lines.append(
        "# The GPU Operator does not watch this ConfigMap: after changing it, restart the "
        "device plugin pods (gpu-operator#1144)."
    )
    return "\n".join(lines) + "\n"


def _cdi_guidance(configs: Sequence[DevicePluginConfig]) -> list[str]:
    """What the configs that inject through CDI need on the nodes (docs/node-side.md)."""
    cdi = [config.name for config in configs if config.injects_through_cdi]
    if not cdi:
        return []
    return [
        f"# Configs [{', '.join(cdi)}] inject GPUs through CDI (flags.plugin.deviceListStrategy"
        f" {', '.join(CDI_DEVICE_LIST_STRATEGY)}), where the driver memory limit's hook runs.",
        "# GPU Operator: set cdi.enabled=true (the default since v25.10.0): its "
        "DEVICE_LIST_STRATEGY env outranks the config file.",
        "# The hook needs nvidia-container-toolkit >= v1.20.1, a device plugin built with it, "
        "driver R615+ and cgroup v2 (docs/enforcement.md).",
    ]
