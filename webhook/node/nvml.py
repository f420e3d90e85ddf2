"""What the node side needs from NVML, behind one small interface.

``Nvml`` is the interface: start NVML, list the GPUs (index, UUID, name, total memory,
compute capability, compute mode, MIG mode), change a GPU's compute mode, read the driver
version and the processes on a GPU (the node agent's audit), stop NVML.
``PynvmlNvml`` implements it over nvidia-ml-py (imported as ``pynvml``); the tests' in-memory
implementation lives with them (tests/node/fake_nvml.py).

``discover_gpus`` turns the inventory into the GPUs the daemon may serve, or refuses with one
clear error: no NVML library, no GPUs, a GPU older than Volta, or a GPU in MIG mode.
Switching compute modes for MPS is ``webhook.node.compute_mode``'s business.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol

import pynvml

from webhook.node.errors import ComputeModePermissionError, NodeSetupError

# MPS limits (active thread percentage, pinned device memory) and the 48-client server need
# Volta (compute capability 7.0) or newer; pre-Volta MPS has neither (NVIDIA MPS docs,
# "Volta MPS" and "Appendix: Tools and Interface Reference").
MIN_COMPUTE_CAPABILITY = (7, 0)
MIB = 1024 * 1024


class ComputeMode(IntEnum):
    """NVML compute modes; values are ``nvmlComputeMode_t`` (nvml.h, mirrored by pynvml)."""

    DEFAULT = 0
    EXCLUSIVE_THREAD = 1  # removed from current drivers; kept so every value NVML returns maps
    PROHIBITED = 2
    EXCLUSIVE_PROCESS = 3


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as NVML reports it."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    compute_capability: tuple[int, int]
    compute_mode: ComputeMode = ComputeMode.DEFAULT
    mig_enabled: bool = False

    @property
    def compute_capability_text(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


@dataclass(frozen=True)
class GpuProcess:
    """One process with a context on a GPU: its PID in the host's PID namespace (NVML
    reports host PIDs, hence the node agent's hostPID), the GPU memory it uses in bytes
    (None where NVML cannot tell), and whether it is an MPS client (on NVML's MPS list)."""

    pid: int
    used_bytes: int | None
    mps_client: bool = False


class Nvml(Protocol):
    """The few NVML calls the launcher makes."""

    def init(self) -> None:
        """Load the NVML library and initialise it; NodeSetupError if that is impossible."""

    def devices(self) -> list[GpuDevice]:
        """Every GPU NVML sees, in NVML index order."""

    def set_compute_mode(self, index: int, mode: ComputeMode) -> None:
        """Change one GPU's compute mode; ComputeModePermissionError without privileges."""

    def driver_version(self) -> str:
        """The kernel driver's version, e.g. "615.43.02" (nvmlSystemGetDriverVersion)."""

    def processes(self, index: int) -> list[GpuProcess]:
        """Every process with a compute context on GPU ``index``, MPS clients included."""

    def shutdown(self) -> None:
        """Release NVML."""


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes for names and UUIDs, newer ones str.
    return value.decode() if isinstance(value, bytes) else value


class PynvmlNvml:
    """``Nvml`` over nvidia-ml-py, which loads ``libnvidia-ml.so.1`` on ``nvmlInit``."""

    def init(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as exc:
            raise NodeSetupError(
                "The NVML library (libnvidia-ml.so.1) was not found, so this node's GPUs cannot "
                "be discovered: run gpushare mps-daemon on a GPU node with the NVIDIA driver "
                "installed, in a container started by the NVIDIA container runtime (e.g. "
                "runtimeClassName: nvidia), which mounts the library."
            ) from exc
        except pynvml.NVMLError_DriverNotLoaded as exc:
            raise NodeSetupError(
                "The NVIDIA kernel driver is not loaded on this node (NVML: driver not loaded): "
                "install or load the driver, or keep the MPS daemon off this node."
            ) from exc
        except pynvml.NVMLError_NoPermission as exc:
            raise NodeSetupError(
                "NVML could not open the GPU device nodes (insufficient permissions): give "
                "the container access to /dev/nvidia* through the NVIDIA container runtime."
            ) from exc
        except pynvml.NVMLError as exc:
            raise NodeSetupError(f"NVML failed to initialise: {exc}.") from exc

    def devices(self) -> list[GpuDevice]:
        try:
            count = pynvml.nvmlDeviceGetCount()
            return [self._device(index) for index in range(count)]
        except pynvml.NVMLError as exc:
            raise NodeSetupError(f"NVML failed to list this node's GPUs: {exc}.") from exc

    def _device(self, index: int) -> GpuDevice:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return GpuDevice(
            index=index,
            uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
            name=_text(pynvml.nvmlDeviceGetName(handle)),
            memory_mib=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
            compute_capability=(int(major), int(minor)),
            compute_mode=ComputeMode(int(pynvml.nvmlDeviceGetComputeMode(handle))),
            mig_enabled=self._mig_enabled(handle),
        )

    @staticmethod
    def _mig_enabled(handle: Any) -> bool:
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError_NotSupported:
            # GPUs without MIG (everything but A100/A30/H100-class) answer NOT_SUPPORTED.
            return False
        return bool(int(current) == pynvml.NVML_DEVICE_MIG_ENABLE)

    def set_compute_mode(self, index: int, mode: ComputeMode) -> None:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pynvml.nvmlDeviceSetComputeMode(handle, int(mode))
        except pynvml.NVMLError_NoPermission as exc:
            # nvmlDeviceSetComputeMode "Requires root/admin permissions" (nvml.h).
            raise ComputeModePermissionError(
                f"NVML refused to set GPU {index} to compute mode {mode.name} (insufficient "
                "permissions): it needs root with CAP_SYS_ADMIN, i.e. a privileged container."
            ) from exc
        except pynvml.NVMLError as exc:
            raise NodeSetupError(
                f"NVML failed to set GPU {index} to compute mode {mode.name}: {exc}."
            ) from exc

    def driver_version(self) -> str:
        try:
            return _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as exc:
            raise NodeSetupError(f"NVML failed to report the driver version: {exc}.") from exc

    def processes(self, index: int) -> list[GpuProcess]:
        """The compute processes and, under MPS, the MPS clients: with MPS the compute list
        holds the MPS server, and its clients are on the MPS list (nvml.h,
        nvmlDeviceGetMPSComputeRunningProcesses). A PID on both is an MPS client with the
        larger of its two figures."""
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            found = _process_list(pynvml.nvmlDeviceGetComputeRunningProcesses, handle, False)
            found += _process_list(pynvml.nvmlDeviceGetMPSComputeRunningProcesses, handle, True)
        except pynvml.NVMLError as exc:
            raise NodeSetupError(
                f"NVML failed to list the processes on GPU {index}: {exc}."
            ) from exc
        merged: dict[int, GpuProcess] = {}
        for process in found:
            known = merged.get(process.pid)
            merged[process.pid] = process if known is None else _merged(known, process)
        return sorted(merged.values(), key=lambda p: p.pid)

    def shutdown(self) -> None:
        # Shutting down an NVML that never came up is not worth a second error.
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _merged(first: GpuProcess, second: GpuProcess) -> GpuProcess:
    """One PID on both lists: an MPS client, with the larger figure NVML gave."""
    figures = [b for b in (first.used_bytes, second.used_bytes) if b is not None]
    return GpuProcess(
        first.pid, max(figures) if figures else None, first.mps_client or second.mps_client
    )


def _process_list(call: Any, handle: Any, mps_client: bool) -> list[GpuProcess]:
    """One of NVML's process lists; empty where the GPU or driver does not offer it
    (the MPS list on GPUs without MPS support, a driver older than the _v3 calls)."""
    try:
        entries = call(handle)
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        return []
    return [
        GpuProcess(
            pid=int(entry.pid),
            used_bytes=None if entry.usedGpuMemory is None else int(entry.usedGpuMemory),
            mps_client=mps_client,
        )
        for entry in entries
    ]


def discover_gpus(nvml: Nvml) -> tuple[GpuDevice, ...]:
    """The node's GPUs, or NodeSetupError naming every GPU that MPS cannot serve.

    The control daemon serves every GPU it can see (NVIDIA's own daemon also starts it
    without CUDA_VISIBLE_DEVICES), so one unsupported GPU refuses the whole node rather than
    leaving a GPU without limits.
    """
    nvml.init()
    gpus = tuple(nvml.devices())
    if not gpus:
        raise NodeSetupError(
            "NVML found no GPU on this node, so there is nothing for an MPS daemon to share: "
            "keep the gpushare MPS DaemonSet off this node (its nodeSelector should require "
            "nvidia.com/gpu.present=true), or check that the container sees the GPUs."
        )
    problems = [_unsupported(g) for g in gpus]
    reasons = [p for p in problems if p]
    if reasons:
        raise NodeSetupError(
            "MPS limits cannot be enforced on this node: "
            + "; ".join(reasons)
            + ". Keep the gpushare MPS DaemonSet off this node or use a time-slicing pool."
        )
    return gpus


def _unsupported(gpu: GpuDevice) -> str | None:
    if gpu.compute_capability < MIN_COMPUTE_CAPABILITY:
        return (
            f"GPU {gpu.index} ({gpu.name}, compute capability {gpu.compute_capability_text}) "
            "is older than Volta (7.0), which MPS thread and memory limits need"
        )
    if gpu.mig_enabled:
        # MPS inside MIG instances needs per-instance daemons, which this launcher does not
        # manage; NVIDIA's device plugin likewise refuses MPS on MIG devices.
        return f"GPU {gpu.index} ({gpu.name}) is in MIG mode; disable MIG (nvidia-smi -mig 0)"
    return None
