"""Framework memory knobs (TensorFlow, JAX, PyTorch) as env, merged with what the user set.

Fractions are of total GPU memory and leave the policy's headroom for the CUDA context,
which no framework allocator counts.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from webhook.core.modes import EnvSetting
from webhook.core.placement import Placement, format_fraction
from webhook.core.policy.model import Policy

TF_GROWTH_VAR = "TF_FORCE_GPU_ALLOW_GROWTH"
JAX_FRACTION_VARS = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION")
JAX_PREALLOCATE_VAR = "XLA_PYTHON_CLIENT_PREALLOCATE"
TORCH_CONF_VAR = "PYTORCH_CUDA_ALLOC_CONF"
TORCH_CONF_VAR_NEW = "PYTORCH_ALLOC_CONF"
TORCH_FRACTION_KEY = "per_process_memory_fraction"


@dataclass(frozen=True)
class FrameworkEnv:
    env: tuple[EnvSetting, ...]
    warnings: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()


def framework_fraction(policy: Policy, placement: Placement) -> float | str:
    """The allocator share: fraction minus headroom, floored to 1/1000; a problem text if none."""
    headroom = policy.headroom.as_fraction(placement.pool.gpu_memory_mib)
    if headroom is None:  # the loader refuses such policies; keep the core total anyway
        headroom = 0.0
    share = math.floor((placement.fraction - headroom) * 1000 + 1e-9) / 1000
    if share <= 0:
        return (
            f"A share of {format_fraction(placement.fraction)} leaves no memory once policy "
            f"{policy.name!r} keeps its headroom for the CUDA context: ask for more."
        )
    return share


def fixed_framework_env(policy: Policy, placement: Placement) -> FrameworkEnv:
    """The knobs that depend on policy and placement only (so callers may memoize them)."""
    knobs = policy.frameworks
    share = framework_fraction(policy, placement)
    if isinstance(share, str):
        return FrameworkEnv((), problems=(share,))
    text = format_fraction(share)
    derivation = f"{format_fraction(placement.fraction)} asked - headroom, floored to 0.001"
    env: list[EnvSetting] = []
    if knobs.tensorflow_allow_growth:
        env.append(EnvSetting(TF_GROWTH_VAR, "true", derivation="TensorFlow grows, never caps"))
    if knobs.jax_memory_fraction:
        env += [EnvSetting(name, text, derivation=derivation) for name in JAX_FRACTION_VARS]
    if knobs.jax_preallocate is not None:
        env.append(
            EnvSetting(JAX_PREALLOCATE_VAR, str(knobs.jax_preallocate).lower(), derivation="policy")
        )
    return FrameworkEnv(tuple(env))


def framework_env(
    policy: Policy,
    placement: Placement,
    container: Mapping[str, Any],
    fixed: FrameworkEnv | None = None,
) -> FrameworkEnv:
    """Every knob for this container: ``fixed`` (or its computation) plus PyTorch's merge."""
    base = fixed_framework_env(policy, placement) if fixed is None else fixed
    torch = policy.frameworks.pytorch
    if base.problems or not torch.memory_fraction:
        return base
    image = str(container.get("image", ""))
    if torch.images and not any(fnmatchcase(image, glob) for glob in torch.images):
        return base
    share = framework_fraction(policy, placement)
    assert not isinstance(share, str)  # base.problems is empty
    derivation = f"{format_fraction(placement.fraction)} asked - headroom, floored to 0.001"
    setting = _torch_setting(container, share, derivation)
    if isinstance(setting, str):
        return FrameworkEnv(base.env, (*base.warnings, setting))
    return FrameworkEnv((*base.env, setting), base.warnings)


def _torch_setting(container: Mapping[str, Any], share: float, derivation: str) -> EnvSetting | str:
    """Our key merged into the user's allocator config; the smaller fraction wins."""
    entries = {e.get("name"): e for e in container.get("env") or () if isinstance(e, dict)}
    name = (
        TORCH_CONF_VAR_NEW
        if (TORCH_CONF_VAR_NEW in entries and TORCH_CONF_VAR not in entries)
        else TORCH_CONF_VAR
    )
    entry = entries.get(name)
    if entry is not None and "valueFrom" in entry:
        return f"{name} comes from valueFrom; {TORCH_FRACTION_KEY} not merged"
    current = str(entry.get("value", "")) if entry else ""
    parts: list[tuple[str, str]] = []
    for item in filter(None, (p.strip() for p in current.split(","))):
        key, _, value = item.partition(":")
        parts.append((key.strip(), value.strip()))
    fraction = share
    for key, value in parts:
        if key == TORCH_FRACTION_KEY:
            with contextlib.suppress(ValueError):  # not a number: ours replaces it
                fraction = min(fraction, float(value))
    merged = [(k, v) for k, v in parts if k != TORCH_FRACTION_KEY]
    merged.append((TORCH_FRACTION_KEY, format_fraction(fraction)))
    return EnvSetting(
        name,
        ",".join(f"{k}:{v}" for k, v in merged),
        enforced=True,
        derivation=f"{derivation}, merged into the user's {name}",
    )
