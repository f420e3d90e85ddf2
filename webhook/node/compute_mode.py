"""The GPUs' compute mode while the MPS daemon serves them, and back again when it stops.

NVIDIA recommends EXCLUSIVE_PROCESS under MPS so that only the MPS server holds a context:
a process that bypasses the daemon cannot then share the GPU without limits.
``set_exclusive_process`` and ``restore_compute_modes`` do the switching over ``Nvml``;
``ComputeModes`` applies the policy's ``setExclusiveProcess`` for the launcher, runs
degraded (DEFAULT mode, said loudly) where the container lacks the privilege, and restores
what it changed on the way out.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from webhook.node.errors import ComputeModePermissionError
from webhook.node.events import emit
from webhook.node.nvml import ComputeMode, GpuDevice, Nvml


def set_exclusive_process(nvml: Nvml, gpus: Sequence[GpuDevice]) -> dict[int, ComputeMode]:
    """Put every GPU into EXCLUSIVE_PROCESS; return the modes changed, to restore on exit.

    ComputeModePermissionError propagates; the caller decides how to run degraded.
    """
    changed: dict[int, ComputeMode] = {}
    try:
        for gpu in gpus:
            if gpu.compute_mode is ComputeMode.EXCLUSIVE_PROCESS:
                continue
            nvml.set_compute_mode(gpu.index, ComputeMode.EXCLUSIVE_PROCESS)
            changed[gpu.index] = gpu.compute_mode
    except ComputeModePermissionError:
        # All or nothing: a node half in EXCLUSIVE_PROCESS would be degraded in a way no
        # annotation describes.
        restore_compute_modes(nvml, changed)
        raise
    return changed


def restore_compute_modes(nvml: Nvml, previous: Mapping[int, ComputeMode]) -> None:
    """Put back the compute modes ``set_exclusive_process`` changed (as NVIDIA's daemon does
    when it stops: cmd/mps-control-daemon/mps/daemon.go, Stop)."""
    for index, mode in previous.items():
        nvml.set_compute_mode(index, mode)


class ComputeModes:
    """The compute modes of the GPUs one launcher serves, from start to stop."""

    def __init__(self, nvml: Nvml, gpus: Sequence[GpuDevice], *, set_exclusive: bool) -> None:
        self.nvml = nvml
        self.gpus = tuple(gpus)
        self.set_exclusive = set_exclusive
        self._previous: dict[int, ComputeMode] = {}

    def apply(self) -> bool:
        """Switch to EXCLUSIVE_PROCESS if the policy asks; whether every GPU is in it now.

        Without the privilege this is degraded, not fatal: MPS limits still hold for the
        clients that use the daemon.
        """
        if not self.set_exclusive:
            emit(
                "compute_mode_unchanged",
                "The policy sets setExclusiveProcess: false; GPUs keep their compute mode.",
                modes=[g.compute_mode.name for g in self.gpus],
            )
            return all(g.compute_mode is ComputeMode.EXCLUSIVE_PROCESS for g in self.gpus)
        try:
            self._previous = set_exclusive_process(self.nvml, self.gpus)
        except ComputeModePermissionError as exc:
            emit(
                "compute_mode_degraded",
                f"{exc} Continuing in DEFAULT compute mode: MPS limits still apply to "
                "clients that use the daemon, but a process that bypasses it (another pipe "
                "directory, or CUDA_MPS_PIPE_DIRECTORY unset) can open its own context on "
                "these GPUs without limits. Run the DaemonSet privileged to fix this.",
                level=logging.WARNING,
                missing="CAP_SYS_ADMIN (privileged container) for nvmlDeviceSetComputeMode",
            )
            return False
        if self._previous:
            emit(
                "compute_mode_set",
                "GPUs set to EXCLUSIVE_PROCESS so only the MPS server holds a context.",
                gpus=sorted(self._previous),
            )
        return True

    def restore(self) -> None:
        """Put back what ``apply`` changed; best effort, a failure is logged, not raised."""
        if not self._previous:
            return
        try:
            restore_compute_modes(self.nvml, self._previous)
        except Exception as exc:  # best effort on the way out; the event says what failed
            emit(
                "compute_mode_restore_failed",
                f"Could not restore the GPUs' compute modes: {exc}",
                level=logging.WARNING,
            )
            return
        emit(
            "compute_mode_restored",
            "GPU compute modes restored.",
            gpus=sorted(self._previous),
        )
        self._previous = {}
