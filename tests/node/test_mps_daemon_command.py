"""``gpushare mps-daemon`` as a process: every setup problem is one clear error line and a
non-zero exit. (The full run against a real apiserver is tests/e2e/test_node_labelling.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest
from node_fakes import A100, fake_gpus_file, mps_daemon_policy, write_fake_control

REPO = Path(__file__).resolve().parents[2]
FAKE_GPU_LAUNCHER = Path(__file__).resolve().parent / "fake_gpu_launcher.py"

# A kubeconfig for an apiserver that is not there: connecting works, every call fails.
UNREACHABLE_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The shipped CLI, which discovers GPUs through the real NVML."""
    return _run([sys.executable, "-m", "webhook.cli", *args], timeout)


def run_with_fake_gpus(
    gpus: Path, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """The same CLI with the GPUs of the inventory file ``gpus`` (fake_gpu_launcher.py)."""
    return _run([sys.executable, str(FAKE_GPU_LAUNCHER), str(gpus), *args], timeout)


def _run(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "GPUSHARE_POLICIES")}
    return subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def error_lines(stderr: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [line for line in lines if line["level"] == "error"]


def the_error(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The one startup error; exit 1, or 2 where the policies are invalid."""
    assert result.returncode == code, result.stderr
    (error,) = error_lines(result.stderr)
    assert error["event"] == "startup_failed"
    assert "Traceback" not in result.stderr
    return str(error["message"])


@pytest.fixture
def base_args(tmp_path: Path) -> list[str]:
    policy = mps_daemon_policy(tmp_path, pipe=tmp_path / "pipe", log=tmp_path / "log")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE_KUBECONFIG)
    return [
        "mps-daemon",
        "--policies", str(policy),
        "--pool", "a100-mps",
        "--node-name", "gpu-node-1",
        "--kubeconfig", str(kubeconfig),
        "--listen", "127.0.0.1:0",
    ]  # fmt: skip


def test_missing_control_binary(base_args: list[str]) -> None:
    message = the_error(
        run_cli(*base_args, "--mps-control", "/nonexistent/nvidia-cuda-mps-control")
    )
    assert "'/nonexistent/nvidia-cuda-mps-control' was not found" in message


def test_missing_nvml_library(base_args: list[str], tmp_path: Path) -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:  # pragma: no cover - only on a GPU machine
        pynvml.nvmlShutdown()
        pytest.skip("libnvidia-ml.so.1 is present on this machine")
    binary = write_fake_control(tmp_path)
    message = the_error(run_cli(*base_args, "--mps-control", str(binary)))
    assert "NVML library (libnvidia-ml.so.1) was not found" in message


def test_no_gpus(base_args: list[str], tmp_path: Path) -> None:
    binary = write_fake_control(tmp_path)
    gpus = fake_gpus_file(tmp_path, [])
    message = the_error(run_with_fake_gpus(gpus, *base_args, "--mps-control", str(binary)))
    assert "NVML found no GPU on this node" in message


def test_a_binary_that_is_not_the_mps_control_program(base_args: list[str], tmp_path: Path) -> None:
    gpus = fake_gpus_file(tmp_path, [A100])
    result = run_with_fake_gpus(
        gpus, *base_args, "--mps-control", "/bin/true", "--start-timeout", "1"
    )
    message = the_error(result)
    assert "no live daemon wrote" in message and "really nvidia-cuda-mps-control" in message


def test_node_name_is_required(base_args: list[str]) -> None:
    args = [a for a in base_args if a not in ("--node-name", "gpu-node-1")]
    assert "pass --node-name or set NODE_NAME" in the_error(run_cli(*args))


def test_unknown_pool(base_args: list[str]) -> None:
    args = [("nope" if a == "a100-mps" else a) for a in base_args]
    message = the_error(run_cli(*args))
    assert "No policy defines the pool of --pool nope" in message and "a100-mps" in message


def test_invalid_policies(base_args: list[str], tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: gpushare.io/v1alpha1\nkind: GpuSharingPolicy\nspec: 3\n")
    args = [str(broken) if a.endswith("mps-daemon.yaml") else a for a in base_args]
    assert "are invalid" in the_error(run_cli(*args), code=2)


def test_count_pool_on_a_multi_gpu_node_is_refused(tmp_path: Path, base_args: list[str]) -> None:
    policy = mps_daemon_policy(
        tmp_path, name="count", allocation="count", gpus_per_node=1,
        pipe=tmp_path / "pipe", log=tmp_path / "log",
    )  # fmt: skip
    gpus = fake_gpus_file(tmp_path, [A100, {**A100, "index": 1}])
    args = [str(policy) if a.endswith("mps-daemon.yaml") else a for a in base_args]
    binary = write_fake_control(tmp_path)
    message = the_error(run_with_fake_gpus(gpus, *args, "--mps-control", str(binary)))
    assert "only safe on one-GPU nodes, but this node has 2 GPUs" in message
