"""Switching the GPUs to EXCLUSIVE_PROCESS for MPS, all or nothing, and back."""

from __future__ import annotations

import pytest
from fake_nvml import FakeNvml

from webhook.node.compute_mode import restore_compute_modes, set_exclusive_process
from webhook.node.errors import ComputeModePermissionError
from webhook.node.nvml import ComputeMode, GpuDevice


def gpu(index: int) -> GpuDevice:
    return GpuDevice(index, f"GPU-{index}", "NVIDIA A100", 81920, (8, 0))


def test_exclusive_process_is_set_where_needed_and_restored() -> None:
    nvml = FakeNvml(gpus=[gpu(0), GpuDevice(1, "u", "n", 1, (8, 0), ComputeMode.EXCLUSIVE_PROCESS)])
    previous = set_exclusive_process(nvml, nvml.devices())
    assert previous == {0: ComputeMode.DEFAULT}
    assert nvml.compute_mode_changes == [(0, ComputeMode.EXCLUSIVE_PROCESS)]
    restore_compute_modes(nvml, previous)
    assert nvml.gpus[0].compute_mode is ComputeMode.DEFAULT


def test_without_permission_nothing_stays_half_changed() -> None:
    nvml = FakeNvml(gpus=[gpu(0)], compute_mode_permission=False)
    with pytest.raises(ComputeModePermissionError, match="CAP_SYS_ADMIN"):
        set_exclusive_process(nvml, nvml.devices())
    assert nvml.gpus[0].compute_mode is ComputeMode.DEFAULT
