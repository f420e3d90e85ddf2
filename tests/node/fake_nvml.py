"""Test double of ``webhook.node.nvml.Nvml``: GPUs held in memory or read from a JSON file.

The unit tests build ``FakeNvml`` directly; ``fake_gpu_launcher.py`` reads an inventory file
with ``FakeNvml.from_file`` so that the launcher can run as a process on machines without
GPUs. Compute-mode changes are applied to the in-memory GPUs and recorded. The driver version
and the processes on each GPU (by index) are what the node agent's audit reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from webhook.node.errors import ComputeModePermissionError, NodeSetupError
from webhook.node.nvml import ComputeMode, GpuDevice, GpuProcess


@dataclass
class FakeNvml:
    """An in-memory ``Nvml``; ``compute_mode_permission=False`` acts like an unprivileged
    container, where NVML refuses every compute-mode change."""

    gpus: list[GpuDevice] = field(default_factory=list)
    compute_mode_permission: bool = True
    compute_mode_changes: list[tuple[int, ComputeMode]] = field(default_factory=list)
    initialised: bool = False
    driver: str = "615.43.02"
    gpu_processes: dict[int, list[GpuProcess]] = field(default_factory=dict)

    def init(self) -> None:
        self.initialised = True

    def devices(self) -> list[GpuDevice]:
        return list(self.gpus)

    def set_compute_mode(self, index: int, mode: ComputeMode) -> None:
        if not self.compute_mode_permission:
            raise ComputeModePermissionError(
                f"NVML refused to set GPU {index} to compute mode {mode.name} (insufficient "
                "permissions): it needs root with CAP_SYS_ADMIN, i.e. a privileged container."
            )
        self.compute_mode_changes.append((index, mode))
        self.gpus = [replace(g, compute_mode=mode) if g.index == index else g for g in self.gpus]

    def driver_version(self) -> str:
        return self.driver

    def processes(self, index: int) -> list[GpuProcess]:
        return list(self.gpu_processes.get(index, []))

    def shutdown(self) -> None:
        self.initialised = False

    @classmethod
    def from_file(cls, path: Path) -> FakeNvml:
        """Read an inventory: ``{"gpus": [{"index": 0, "uuid": ..., "name": ...,
        "memoryMiB": 81920, "computeCapability": "8.0", "computeMode": "DEFAULT",
        "mig": false}], "computeModePermission": true, "driverVersion": "615.43.02",
        "processes": {"0": [{"pid": 4242, "usedMiB": 1024}]}}``; only ``memoryMiB`` is
        required."""
        try:
            raw = json.loads(path.read_text())
            return cls(
                gpus=[_gpu(i, g) for i, g in enumerate(raw.get("gpus", []))],
                compute_mode_permission=bool(raw.get("computeModePermission", True)),
                driver=str(raw.get("driverVersion", "615.43.02")),
                gpu_processes={
                    int(index): [
                        GpuProcess(
                            int(p["pid"]),
                            int(p["usedMiB"]) * 1024 * 1024,
                            bool(p.get("mpsClient", False)),
                        )
                        for p in entries
                    ]
                    for index, entries in raw.get("processes", {}).items()
                },
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise NodeSetupError(f"Cannot read the fake GPU inventory {path}: {exc}.") from exc


def _gpu(position: int, raw: Mapping[str, Any]) -> GpuDevice:
    major, _, minor = str(raw.get("computeCapability", "8.0")).partition(".")
    return GpuDevice(
        index=int(raw.get("index", position)),
        uuid=str(raw.get("uuid", f"GPU-00000000-0000-0000-0000-{position:012d}")),
        name=str(raw.get("name", "NVIDIA A100-SXM4-80GB")),
        memory_mib=int(raw["memoryMiB"]),
        compute_capability=(int(major), int(minor or 0)),
        compute_mode=ComputeMode[str(raw.get("computeMode", "DEFAULT"))],
        mig_enabled=bool(raw.get("mig", False)),
    )
