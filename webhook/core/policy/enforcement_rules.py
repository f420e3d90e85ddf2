"""The rules across a policy's ``enforcement`` section and the rest of it (mode, pools,
gpuMemory): what ``gpushare policy check`` and the loader refuse, each finding at its YAML
path under ``spec``.

- ``driverMemoryLimit`` other than ``auto``/``off`` needs a pool mode (the other schemes
  enforce limits their own way, docs/schemes.md), and under ``inject``/``require`` a pool
  whose gpuMemory is unknown would refuse every ``gpu-fraction`` ask;
- ``reservedMemory`` applies to the pool modes only, must leave each pool's GPUs something,
  and names only GPU models (``nvidia.com/gpu.product``) some pool selects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.constants import GFD_PRODUCT_LABEL
from webhook.core.policy.enforcement import DriverMemoryLimit
from webhook.core.policy.model import Mode, Policy

# The NVIDIA device plugin's modes: the ones that write the driver limit.
POOL_MODES = frozenset({Mode.TIME_SLICING, Mode.MPS, Mode.MPS_DAEMON})
_POOL_MODE_NAMES = ", ".join(mode.value for mode in (Mode.TIME_SLICING, Mode.MPS, Mode.MPS_DAEMON))

Found = tuple[str, tuple[str | int, ...]]


def enforcement_findings(policy: Policy, spec: Mapping[str, Any]) -> list[Found]:
    """What is wrong across the section and the policy: (message, where under spec)."""
    raw = spec.get("enforcement")
    if not raw:
        return []
    if policy.mode not in POOL_MODES:
        return _outside_pool_modes(policy, raw)
    return [
        *_unknown_memory_refuses_fractions(policy),
        *_reservations_leave_memory(policy, raw),
        *_reserved_products_are_selected(policy, raw),
    ]


def _outside_pool_modes(policy: Policy, raw: Mapping[str, Any]) -> list[Found]:
    found: list[Found] = []
    setting = policy.enforcement.driver_memory_limit
    if setting in (DriverMemoryLimit.INJECT, DriverMemoryLimit.REQUIRE):
        found.append(
            (
                f"driverMemoryLimit: {setting.value} is written by the pool modes "
                f"({_POOL_MODE_NAMES}); mode {policy.mode.value} enforces limits its own way "
                "(docs/schemes.md): remove it",
                ("enforcement", "driverMemoryLimit"),
            )
        )
    if "reservedMemory" in raw:
        found.append(
            (
                f"reservedMemory sizes the driver limit of the pool modes ({_POOL_MODE_NAMES}), "
                f"which mode {policy.mode.value} does not write: remove it",
                ("enforcement", "reservedMemory"),
            )
        )
    return found


def _unknown_memory_refuses_fractions(policy: Policy) -> list[Found]:
    """Under inject/require, a gpu-fraction ask on a pool of unknown memory is refused at
    admission (``driver_limits.unenforceable``): say so where the policy is written."""
    enforcement = policy.enforcement
    if not enforcement.needs_known_memory:
        return []
    return [
        (
            f"driverMemoryLimit: {enforcement.driver_memory_limit.value} needs each share's "
            f"size in MiB, but pool {pool.name!r} declares no gpuMemory, so every "
            "gpu-fraction ask on it would be refused: declare gpuMemory on this pool (or "
            "spec.gpuMemory), or use driverMemoryLimit: auto",
            ("pools", index),
        )
        for index, pool in enumerate(policy.pools)
        if pool.gpu_memory_mib is None
    ]


def _reservations_leave_memory(policy: Policy, raw: Mapping[str, Any]) -> list[Found]:
    """A reservation of at least a pool's GPU memory leaves its pods nothing."""
    reserved = raw.get("reservedMemory") or {}
    enforcement = policy.enforcement
    found: dict[tuple[str | int, ...], str] = {}
    for pool in policy.pools:
        if pool.gpu_memory_mib is None:
            continue
        product = pool.node_selector.get(GFD_PRODUCT_LABEL)
        mib = enforcement.reserved_mib(product)
        if mib < pool.gpu_memory_mib:
            continue
        if product is not None and product in enforcement.reserved_by_product:
            at: tuple[str | int, ...] = ("enforcement", "reservedMemory", "products", product)
            text = reserved["products"][product]
        else:
            at, text = ("enforcement", "reservedMemory", "default"), reserved.get("default")
        found.setdefault(
            at,
            f"reservedMemory {text!r} ({mib}Mi) is not less than the {pool.gpu_memory_mib}Mi "
            f"of GPU memory of pool {pool.name!r}, which would leave its pods nothing: reserve "
            "what the driver and the CUDA context keep (some hundreds of MiB)",
        )
    return [(message, at) for at, message in found.items()]


def _reserved_products_are_selected(policy: Policy, raw: Mapping[str, Any]) -> list[Found]:
    """A reservation for a GPU model no pool selects is never used: likely a typo."""
    products = (raw.get("reservedMemory") or {}).get("products") or {}
    selected = {pool.name: pool.node_selector.get(GFD_PRODUCT_LABEL) for pool in policy.pools}
    chosen = {product for product in selected.values() if product is not None}
    pools = "; ".join(
        f"pool {name!r} selects {product!r}" if product else f"pool {name!r} selects no model"
        for name, product in selected.items()
    )
    return [
        (
            f"no pool of this policy selects {GFD_PRODUCT_LABEL}={product} ({pools}), so this "
            f"reservation is never used: name a product a pool selects in its nodeSelector, "
            "or remove it (reservedMemory.default covers pools that name no model)",
            ("enforcement", "reservedMemory", "products", product),
        )
        for product in products
        if product not in chosen
    ]
