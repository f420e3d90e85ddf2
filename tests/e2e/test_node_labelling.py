"""``gpushare mps-daemon`` against the real kube-apiserver, with deploy/mps-daemon's RBAC.

The launcher runs as a process with the DaemonSet's ServiceAccount token (so the ClusterRole
is what is tested, not the admin's rights), fake GPUs and the stand-in MPS control program
from tests/node. It must find its pool from the node's nvidia.com/device-plugin.config label,
label the node once the defaults are in, take the label off while the daemon is dead and
put it back after the restart, and on SIGTERM take label and annotations off, quit the
daemon and exit 0, all without touching the labels GPU Feature Discovery wrote.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from gpu_nodes import FakeGpuNode
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from harness.controlplane import ControlPlane

REPO = Path(__file__).resolve().parents[2]
FAKE_CONTROL = REPO / "tests/node/fake_mps_control.py"
# The shipped CLI with a fake GPU inventory instead of NVML (test-only entry point).
FAKE_GPU_LAUNCHER = REPO / "tests/node/fake_gpu_launcher.py"
NAMESPACE = "gpushare-mps"
SERVICE_ACCOUNT = "gpushare-mps-daemon"
READY = "gpushare.io/mps-ready"

POLICY = """\
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata:
  name: e2e-mps-daemon
spec:
  default: true
  mode: mps-daemon
  gpuMemory: 24Gi
  pools:
    - name: l4-e2e
      replicas: 4
      devicePluginConfig: l4-e2e-config
  mpsDaemon:
    pipeDirectory: {pipe}
    logDirectory: {log}
    readyLabel: gpushare.io/mps-ready
"""


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def mps_daemon_deployed(control_plane: ControlPlane) -> None:
    """deploy/mps-daemon applied as a cluster admin would (kubectl apply -k)."""
    result = control_plane.kubectl("apply", "-k", str(REPO / "deploy/mps-daemon"))
    assert "daemonset.apps/gpushare-mps-daemon" in result.stdout, result.stdout


@pytest.fixture
def service_account_kubeconfig(
    control_plane: ControlPlane, mps_daemon_deployed: None, tmp_path: Path
) -> Path:
    """A kubeconfig holding a token of the DaemonSet's ServiceAccount (TokenRequest API)."""
    return control_plane.service_account_kubeconfig(
        NAMESPACE, SERVICE_ACCOUNT, tmp_path / "sa-kubeconfig"
    )


@pytest.fixture
def launcher_files(tmp_path: Path) -> dict[str, Path]:
    pipe, log = tmp_path / "pipe", tmp_path / "log"
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "mps-daemon.yaml").write_text(POLICY.format(pipe=pipe, log=log))
    wrapper = tmp_path / "nvidia-cuda-mps-control"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_CONTROL}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    gpus = tmp_path / "gpus.json"
    gpus.write_text(
        json.dumps(
            {
                "gpus": [
                    {"uuid": "GPU-a", "name": "NVIDIA L4", "memoryMiB": 23034,
                     "computeCapability": "8.9"},
                ]
            }
        )
    )  # fmt: skip
    return {"pipe": pipe, "policies": policies, "control": wrapper, "gpus": gpus}


@pytest.fixture
def launched(
    service_account_kubeconfig: Path, launcher_files: dict[str, Path], tmp_path: Path
) -> Iterator[Callable[[str], tuple[subprocess.Popen[str], int]]]:
    processes: list[subprocess.Popen[str]] = []
    logs: list[IO[str]] = []

    def launch(node_name: str) -> tuple[subprocess.Popen[str], int]:
        port = free_port()
        stderr = (tmp_path / "launcher.log").open("w")
        logs.append(stderr)
        process = subprocess.Popen(
            [
                sys.executable, str(FAKE_GPU_LAUNCHER), str(launcher_files["gpus"]), "mps-daemon",
                "--policies", str(launcher_files["policies"]),
                "--node-name", node_name,
                "--kubeconfig", str(service_account_kubeconfig),
                "--mps-control", str(launcher_files["control"]),
                "--listen", f"127.0.0.1:{port}",
                "--check-interval", "0.2",
                "--backoff-initial", "0.2",
            ],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr, text=True,
            env={k: v for k, v in os.environ.items() if k != "NODE_NAME"},
        )  # fmt: skip
        processes.append(process)
        return process, port

    yield launch
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    for log in logs:
        log.close()
    pid_file = launcher_files["pipe"] / "nvidia-cuda-mps-control.pid"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def log_events(tmp_path: Path) -> list[dict[str, Any]]:
    lines = (tmp_path / "launcher.log").read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def test_launcher_publishes_and_withdraws_readiness_on_the_real_node(
    core_v1: k8s.CoreV1Api,
    fake_nodes: Callable[[FakeGpuNode], k8s.V1Node],
    launched: Callable[[str], tuple[subprocess.Popen[str], int]],
    launcher_files: dict[str, Path],
    tmp_path: Path,
) -> None:
    node = FakeGpuNode(
        name=f"mps-node-{os.getpid()}-{time.monotonic_ns() % 100000}",
        replicas=4,
        product="NVIDIA-L4",
        extra_labels={"nvidia.com/device-plugin.config": "l4-e2e-config"},
    )
    fake_nodes(node)
    process, port = launched(node.name)

    def labels() -> dict[str, str]:
        return dict(core_v1.read_node(node.name).metadata.labels or {})

    def annotations() -> dict[str, str]:
        return dict(core_v1.read_node(node.name).metadata.annotations or {})

    wait_for("ready label", lambda: labels().get(READY) == "true")
    assert annotations()["gpushare.io/mps-pool"] == "l4-e2e"
    assert annotations()["gpushare.io/mps-pinned-memory-mib"] == str(23034 // 4)
    assert annotations()["gpushare.io/mps-active-thread-percentage"] == "25"
    # GPU Feature Discovery's labels are untouched by the merge patches.
    for key, value in node.labels().items():
        assert labels()[key] == value
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
        assert response.status == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert "gpushare_mps_node_ready 1.0" in response.read().decode().splitlines()

    # The daemon crashes: the label goes, then comes back after the restart.
    (launcher_files["pipe"] / "fake-die").touch()
    wait_for("label removed after the crash", lambda: READY not in labels())
    wait_for("label back after the restart", lambda: labels().get(READY) == "true")

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert READY not in labels()
    assert not any(k.startswith("gpushare.io/mps-") for k in annotations())
    commands = (launcher_files["pipe"] / "fake-commands.log").read_text()
    assert '"cmd": "quit"' in commands
    events = [e["event"] for e in log_events(tmp_path)]
    assert events.count("daemon_died") == 1 and "daemon_restarted" in events
    assert events[-1] == "stopped"


def test_the_service_account_can_do_nothing_but_read_and_patch_nodes(
    control_plane: ControlPlane, service_account_kubeconfig: Path
) -> None:
    from kubernetes import config as k8s_config

    api = k8s_config.new_client_from_config(
        config_file=str(service_account_kubeconfig), persist_config=False
    )
    try:
        core = k8s.CoreV1Api(api)
        for forbidden in (
            core.list_node,
            lambda: core.list_namespaced_pod("default"),
            lambda: core.list_namespaced_secret(NAMESPACE),
            lambda: core.delete_node("any-node"),
        ):
            with pytest.raises(ApiException) as raised:
                forbidden()
            assert raised.value.status == 403
    finally:
        api.close()
