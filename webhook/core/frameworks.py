"""Framework memory knobs (TensorFlow, JAX, PyTorch) as env of the GPU container, merged with
what the user set, and only where they cannot break the workload.

A framework's knobs go into a container whose image is one of that framework's images
(``frameworks.<name>.images``, default: its official images) unless the policy sets
``frameworks.allContainers``; a knob goes only into a release that reads it
(``framework_images``). PyTorch's allocator key is stricter: PyTorch before 2.10 refuses
unknown keys, so an image whose version is unknown never gets it either.

Fractions are of total GPU memory and leave the policy's headroom for the CUDA context,
which no framework allocator counts.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.framework_images import (
    DEFAULT_IMAGES,
    JAX_FRACTION,
    JAX_PREALLOCATE,
    TF_GROWTH,
    TORCH_FRACTION,
    Knob,
    format_version,
    image_version,
    matches,
)
from webhook.core.modes import EnvSetting
from webhook.core.placement import Placement, format_fraction
from webhook.core.policy.model import FrameworkImages, Policy

TF_GROWTH_VAR = TF_GROWTH.name
JAX_FRACTION_VAR = JAX_FRACTION.name
# jaxlib 0.4.33 and later read this newer name too, and refuse it next to the older one
# ("XLA_CLIENT_MEM_FRACTION is specified together with XLA_PYTHON_CLIENT_MEM_FRACTION"):
# the CUDA plugin then fails to register and JAX runs on the CPU. gpushare sends the older
# name, which every jaxlib reads, and none where the user set the newer one.
JAX_NEW_FRACTION_VAR = "XLA_CLIENT_MEM_FRACTION"
JAX_PREALLOCATE_VAR = JAX_PREALLOCATE.name
TORCH_CONF_VAR = "PYTORCH_CUDA_ALLOC_CONF"
TORCH_CONF_VAR_NEW = "PYTORCH_ALLOC_CONF"
TORCH_FRACTION_KEY = TORCH_FRACTION.name
_DISPLAY = {"tensorflow": "TensorFlow", "jax": "JAX", "pytorch": "PyTorch"}


@dataclass(frozen=True)
class FrameworkEnv:
    env: tuple[EnvSetting, ...]
    warnings: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    # What was added or skipped for which framework and why (``gpushare explain``).
    notes: tuple[str, ...] = ()
    # The share PyTorch's allocator key gets in this container; None: no key.
    torch_share: float | None = None


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


class _Collected:
    """What ``image_framework_env`` gathers for one image."""

    def __init__(self, image: str) -> None:
        self.image = image
        self.env: list[EnvSetting] = []
        self.warnings: list[str] = []
        self.notes: list[str] = []
        self.torch_share: float | None = None


def _wanted(policy: Policy) -> list[tuple[Knob, FrameworkImages, str]]:
    """The knobs the policy enables: (knob, its framework's section, fixed value or "" for
    the share)."""
    knobs = policy.frameworks
    wanted: list[tuple[Knob, FrameworkImages, str]] = []
    if knobs.tensorflow.allow_growth:
        wanted.append((TF_GROWTH, knobs.tensorflow, "true"))
    if knobs.jax.memory_fraction:
        wanted.append((JAX_FRACTION, knobs.jax, ""))
    if knobs.jax.preallocate is not None:
        wanted.append((JAX_PREALLOCATE, knobs.jax, str(knobs.jax.preallocate).lower()))
    if knobs.pytorch.memory_fraction:
        wanted.append((TORCH_FRACTION, knobs.pytorch, ""))
    return wanted


def image_framework_env(policy: Policy, placement: Placement, image: str) -> FrameworkEnv:
    """The knobs for a GPU container running ``image``: they depend on policy, placement and
    image only, so callers may memoize them. The PyTorch key is only decided here: its
    merge into the user's allocator config is ``framework_env``'s."""
    collected = _Collected(image)
    share: float | str | None = None
    for knob, section, value in _wanted(policy):
        if not _goes_in(knob, section, policy.frameworks.all_containers, collected):
            continue
        if value:
            collected.env.append(EnvSetting(knob.name, value, derivation=_derivation(knob)))
            continue
        share = framework_fraction(policy, placement) if share is None else share
        if isinstance(share, str):
            return FrameworkEnv((), problems=(share,), notes=tuple(collected.notes))
        if knob is TORCH_FRACTION:
            collected.torch_share = share
            continue
        derivation = f"{format_fraction(placement.fraction)} asked - headroom, floored to 0.001"
        collected.env.append(EnvSetting(knob.name, format_fraction(share), derivation=derivation))
    if not policy.frameworks.pytorch.memory_fraction:
        collected.notes.append(
            f"pytorch: {TORCH_FRACTION.name} off (frameworks.pytorch.memoryFraction)"
        )
    return FrameworkEnv(
        tuple(collected.env),
        tuple(collected.warnings),
        notes=tuple(collected.notes),
        torch_share=collected.torch_share,
    )


def _derivation(knob: Knob) -> str:
    return "TensorFlow grows, never caps" if knob is TF_GROWTH else "policy"


def _goes_in(knob: Knob, section: FrameworkImages, everywhere: bool, seen: _Collected) -> bool:
    """Whether ``knob`` may go into ``seen.image``; notes and warnings say why not."""
    image, framework = seen.image, knob.framework
    globs = DEFAULT_IMAGES[framework] if section.images is None else section.images
    glob = matches(image, globs)
    if glob is None and not everywhere:
        where = (
            "its official images" if section.images is None else f"frameworks.{framework}.images"
        )
        seen.notes.append(f"{framework}: {knob.name} not added: {image!r} is none of {where}")
        return False
    found = image_version(framework, image, section.versions)
    why = f"image matches {glob!r}" if glob else "frameworks.allContainers"
    since = format_version(knob.since)
    if found.version is not None and found.version < knob.since:
        seen.notes.append(f"{framework}: {knob.name} not added: {found.source}, before {since}")
        seen.warnings.append(
            f"{knob.name} not set: {_DISPLAY[framework]} {format_version(found.version)} "
            f"in the image predates it ({since})"
        )
        return False
    if found.version is None and knob.breaks_older:
        seen.notes.append(f"{framework}: {knob.name} not added: {found.source}")
        seen.warnings.append(
            f"{knob.name} not set: the image's {_DISPLAY[framework]} version is unknown "
            f"(declare it in frameworks.{framework}.versions)"
        )
        return False
    version = (
        found.source
        if found.version is not None
        else f"version unknown, and releases before {since} ignore it"
    )
    seen.notes.append(f"{framework}: {knob.name} added ({why}; {version})")
    return True


def framework_env(
    policy: Policy,
    placement: Placement,
    container: Mapping[str, Any],
    fixed: FrameworkEnv | None = None,
) -> FrameworkEnv:
    """Every knob for this container: ``fixed`` (or its computation) fitted to the user's env."""
    base = (
        fixed
        if fixed is not None
        else image_framework_env(policy, placement, str(container.get("image", "")))
    )
    if base.problems:
        return base
    names = {e.get("name") for e in container.get("env") or () if isinstance(e, dict)}
    env = list(base.env)
    notes = list(base.notes)
    if JAX_NEW_FRACTION_VAR in names and any(s.name == JAX_FRACTION_VAR for s in env):
        env = [s for s in env if s.name != JAX_FRACTION_VAR]
        notes.append(
            f"jax: {JAX_FRACTION_VAR} left out: the container sets {JAX_NEW_FRACTION_VAR}, "
            "and jaxlib 0.4.33+ refuses the two together"
        )
    warnings = list(base.warnings)
    if base.torch_share is not None:
        derivation = f"{format_fraction(placement.fraction)} asked - headroom, floored to 0.001"
        setting = _torch_setting(container, base.torch_share, derivation)
        if isinstance(setting, str):
            warnings.append(setting)
        else:
            env.append(setting)
    return FrameworkEnv(tuple(env), tuple(warnings), notes=tuple(notes))


def _torch_setting(container: Mapping[str, Any], share: float, derivation: str) -> EnvSetting | str:
    """Our key merged into the user's allocator config; the smaller fraction wins.

    Where the user set both names, PyTorch 2.9 and 2.10 parse PYTORCH_CUDA_ALLOC_CONF (measured,
    docs/frameworks.md), so the key goes there; into PYTORCH_ALLOC_CONF only where it is the
    one set."""
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
