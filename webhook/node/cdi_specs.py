"""The CDI specs on this node, read for one question: which GPUs does a spec give the
toolkit's ``apply-cuda-memory-limits`` hook, and under which kind?

A CDI spec (JSON or YAML, github.com/cncf-tags/container-device-interface SPEC.md) names its
``kind`` (``vendor/class``) and lists ``devices``, each with ``containerEdits`` that may hold
``hooks``; the spec's own ``containerEdits`` apply to every device it injects. nvcdi, the
toolkit library behind ``nvidia-ctk cdi generate``, the runtime's just-in-time specs and the
device plugin, attaches the hook per full GPU as a ``createRuntime`` hook whose arguments are
``nvidia-cdi-hook apply-cuda-memory-limits --driver-root <root> --gpu-id <uuid>``
(``nvidia-ctk hook apply-cuda-memory-limits ...`` where the hook path is nvidia-ctk):
nvidia-container-toolkit v1.20.1 ``pkg/nvcdi/cuda-memory-limits.go``,
``internal/discover/hooks.go`` and ``cmd/nvidia-ctk/cdi/generate/generate_test.go``.

The hook runs only for devices injected through its spec. The device plugin writes its spec,
kind ``k8s.device-plugin.nvidia.com/gpu``, to ``/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json``
only when it injects through CDI (``deviceListStrategy`` cdi-cri or cdi-annotations;
k8s-device-plugin v0.20.0 ``internal/cdi/cdi.go``, ``cmd/nvidia-device-plugin/plugin-manager.go``),
so that spec's presence is what says the plugin injects through CDI. Specs of other kinds
(``nvidia.com/gpu`` from ``nvidia-ctk cdi generate``, ``management.nvidia.com/gpu``) are read
too, to say what is there, but a hook in them does not reach the plugin's containers.

Reading is bounded: spec files directly in each directory (CDI does not recurse), at most
``MAX_SPEC_FILES`` per directory and ``MAX_SPEC_BYTES`` per file; a file that cannot be read
or parsed is reported with its error, never fatal.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DEVICE_PLUGIN_KIND = "k8s.device-plugin.nvidia.com/gpu"
MEMORY_LIMIT_HOOK = "apply-cuda-memory-limits"
DEFAULT_CDI_DIRS: tuple[Path, ...] = (Path("/etc/cdi"), Path("/var/run/cdi"))
SPEC_SUFFIXES = (".json", ".yaml", ".yml")
MAX_SPEC_FILES = 64
MAX_SPEC_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class CdiSpec:
    """What one spec file says: its kind, how many devices, the GPU UUIDs whose injection
    runs the memory-limit hook; or why it could not be read (``error``)."""

    path: Path
    kind: str | None = None
    devices: int = 0
    hook_gpu_ids: frozenset[str] = frozenset()
    error: str | None = None


def read_specs(directories: Iterable[Path]) -> tuple[CdiSpec, ...]:
    """Every spec file in ``directories``, in name order per directory."""
    specs: list[CdiSpec] = []
    for directory in directories:
        specs.extend(read_spec(path) for path in _spec_files(directory))
    return tuple(specs)


def _spec_files(directory: Path) -> list[Path]:
    try:
        names = sorted(entry for entry in directory.iterdir() if entry.suffix in SPEC_SUFFIXES)
    except OSError:
        return []  # no such directory: no specs there
    return [path for path in names if path.is_file()][:MAX_SPEC_FILES]


def read_spec(path: Path) -> CdiSpec:
    """One spec file, parsed as JSON (``.json``) or YAML."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        return CdiSpec(path, error=f"cannot be read ({exc.strerror or exc})")
    if len(raw) > MAX_SPEC_BYTES:
        return CdiSpec(path, error=f"is larger than {MAX_SPEC_BYTES} bytes, left unread")
    try:
        text = raw.decode()
        document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        return CdiSpec(path, error=f"is not valid {path.suffix.lstrip('.').upper()}: {exc}")
    if not isinstance(document, Mapping):
        return CdiSpec(path, error="is not a CDI spec (no mapping at the top)")
    return spec_from_document(path, document)


def spec_from_document(path: Path, document: Mapping[str, Any]) -> CdiSpec:
    """The facts of a parsed spec document."""
    kind = document.get("kind")
    devices = document.get("devices")
    device_list = devices if isinstance(devices, list) else []
    everywhere = hook_gpu_ids(_hooks(document.get("containerEdits")))
    gpu_ids = set(everywhere)
    for device in device_list:
        if isinstance(device, Mapping):
            gpu_ids |= hook_gpu_ids(_hooks(device.get("containerEdits")))
    return CdiSpec(
        path,
        kind=kind if isinstance(kind, str) else None,
        devices=len(device_list),
        hook_gpu_ids=frozenset(gpu_ids),
    )


def _hooks(edits: object) -> Iterator[Sequence[str]]:
    """The argument lists of the hooks in one ``containerEdits``."""
    if not isinstance(edits, Mapping):
        return
    hooks = edits.get("hooks")
    for hook in hooks if isinstance(hooks, list) else []:
        args = hook.get("args") if isinstance(hook, Mapping) else None
        if isinstance(args, list) and all(isinstance(arg, str) for arg in args):
            yield args


def hook_gpu_ids(hooks: Iterable[Sequence[str]]) -> frozenset[str]:
    """The ``--gpu-id`` values of every memory-limit hook among ``hooks``."""
    found: set[str] = set()
    for args in hooks:
        if MEMORY_LIMIT_HOOK not in args:
            continue
        for position, arg in enumerate(args):
            if arg == "--gpu-id" and position + 1 < len(args):
                found.add(args[position + 1])
            elif arg.startswith("--gpu-id="):
                found.add(arg.partition("=")[2])
    return frozenset(found)
