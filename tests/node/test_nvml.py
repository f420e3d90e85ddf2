"""GPU discovery: the refusals, the fake inventory file the tests use, and the pynvml code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest
from fake_nvml import FakeNvml
from node_fakes import A100, fake_gpus_file

from webhook.node.errors import ComputeModePermissionError, NodeSetupError
from webhook.node.nvml import (
    ComputeMode,
    GpuDevice,
    PynvmlNvml,
    discover_gpus,
)


def gpu(index: int, cc: tuple[int, int] = (8, 0), mig: bool = False) -> GpuDevice:
    return GpuDevice(index, f"GPU-{index}", "NVIDIA A100", 81920, cc, mig_enabled=mig)


def test_real_nvml_without_the_library_is_one_clear_error() -> None:
    # This machine has no NVIDIA driver, so pynvml really raises NVMLError_LibraryNotFound.
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:  # pragma: no cover - only on a GPU machine
        pynvml.nvmlShutdown()
        pytest.skip("libnvidia-ml.so.1 is present on this machine")
    with pytest.raises(NodeSetupError, match=r"NVML library \(libnvidia-ml.so.1\) was not found"):
        discover_gpus(PynvmlNvml())


def test_no_gpus_is_refused() -> None:
    with pytest.raises(NodeSetupError, match="NVML found no GPU on this node"):
        discover_gpus(FakeNvml(gpus=[]))


def test_pre_volta_is_refused_naming_the_gpu() -> None:
    with pytest.raises(NodeSetupError, match=r"GPU 1 \(NVIDIA A100, compute capability 6.1\)"):
        discover_gpus(FakeNvml(gpus=[gpu(0), gpu(1, cc=(6, 1))]))


def test_mig_enabled_gpus_are_refused() -> None:
    with pytest.raises(NodeSetupError, match=r"GPU 0 .* is in MIG mode"):
        discover_gpus(FakeNvml(gpus=[gpu(0, mig=True)]))


def test_volta_and_newer_are_served() -> None:
    gpus = discover_gpus(FakeNvml(gpus=[gpu(0, cc=(7, 0)), gpu(1, cc=(9, 0))]))
    assert [g.index for g in gpus] == [0, 1]


def test_fake_inventory_file(tmp_path: Path) -> None:
    path = fake_gpus_file(tmp_path, [A100, {**A100, "index": 1, "computeMode": "PROHIBITED"}])
    nvml = FakeNvml.from_file(path)
    assert [(g.index, g.memory_mib, g.compute_mode) for g in nvml.devices()] == [
        (0, 81920, ComputeMode.DEFAULT),
        (1, 81920, ComputeMode.PROHIBITED),
    ]
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(NodeSetupError, match="Cannot read the fake GPU inventory"):
        FakeNvml.from_file(tmp_path / "broken.json")


# -- PynvmlNvml over a stubbed library ------------------------------------------------------


class FakeMemory:
    total = 80 * 1024**3 + 12345  # bytes; whole MiB are kept


@pytest.fixture
def stub_pynvml(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Replace the library calls (not the error classes) so PynvmlNvml's own code runs."""
    calls: dict[str, Any] = {"set": []}
    handles = ["h0", "h1"]

    def mig_mode(handle: str) -> list[int]:
        if handle == "h0":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]

    def set_mode(handle: str, mode: int) -> None:
        if handle == "h1":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        calls["set"].append((handle, mode))

    for name, value in {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: handles[i],
        "nvmlDeviceGetCudaComputeCapability": lambda h: (8, 0),
        "nvmlDeviceGetUUID": lambda h: f"GPU-{h}".encode(),  # bytes, as older releases return
        "nvmlDeviceGetName": lambda h: "NVIDIA A100-SXM4-80GB",
        "nvmlDeviceGetMemoryInfo": lambda h: FakeMemory(),
        "nvmlDeviceGetComputeMode": lambda h: pynvml.NVML_COMPUTEMODE_DEFAULT,
        "nvmlDeviceGetMigMode": mig_mode,
        "nvmlDeviceSetComputeMode": set_mode,
    }.items():
        monkeypatch.setattr(pynvml, name, value)
    return calls


def test_pynvml_devices_are_translated(stub_pynvml: dict[str, Any]) -> None:
    nvml = PynvmlNvml()
    nvml.init()
    first, second = nvml.devices()
    assert first == GpuDevice(0, "GPU-h0", "NVIDIA A100-SXM4-80GB", 81920, (8, 0))
    assert second.mig_enabled and not first.mig_enabled
    with pytest.raises(NodeSetupError, match=r"GPU 1 .* MIG mode"):
        discover_gpus(nvml)


def test_pynvml_permission_error_becomes_compute_mode_permission_error(
    stub_pynvml: dict[str, Any],
) -> None:
    nvml = PynvmlNvml()
    nvml.set_compute_mode(0, ComputeMode.EXCLUSIVE_PROCESS)
    assert stub_pynvml["set"] == [("h0", pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)]
    with pytest.raises(ComputeModePermissionError, match=r"GPU 1 .* \(insufficient permissions\)"):
        nvml.set_compute_mode(1, ComputeMode.EXCLUSIVE_PROCESS)


def test_compute_mode_values_match_nvml() -> None:
    assert ComputeMode.EXCLUSIVE_PROCESS == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert ComputeMode.DEFAULT == pynvml.NVML_COMPUTEMODE_DEFAULT
    assert ComputeMode.PROHIBITED == pynvml.NVML_COMPUTEMODE_PROHIBITED
