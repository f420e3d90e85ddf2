"""Builders for the server tests: pods, AdmissionReview bodies, and a gunicorn under test."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.cli import clean_environment
from harness.processes import terminate

REPO = Path(__file__).resolve().parents[2]
BUNDLED_POLICIES = REPO / "policies"
START_DEADLINE_SECONDS = 30.0


def annotated_pod(fraction: str = "0.5", **metadata: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "trainer-",
            "namespace": "ml",
            "annotations": {"gpu-fraction": fraction},
            "labels": {"app": "trainer"},
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "command": ["python", "train.py"],
                    "env": [{"name": "EPOCHS", "value": "3"}],
                    "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "2Gi"}},
                }
            ]
        },
    }
    pod["metadata"].update(metadata)
    return pod


def share_counting_policies(directory: Path) -> Path:
    """The bundled policies with ``quota.shareResource`` on, written to ``directory``: their
    pods carry gpushare.io/milligpu and count in gpushare_admitted_milligpus_total."""
    documents = list(yaml.safe_load_all((BUNDLED_POLICIES / "default.yaml").read_text()))
    for document in documents:
        if document["kind"] == "GpuSharingPolicy":
            document["spec"]["quota"] = {"shareResource": True}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "default.yaml").write_text(yaml.safe_dump_all(documents))
    return directory


def plain_pod() -> dict[str, Any]:
    pod = annotated_pod()
    pod["metadata"]["annotations"] = {}
    return pod


def review(
    pod: dict[str, Any] | None,
    *,
    uid: str = "0a1b2c3d-0000-4000-8000-000000000001",
    namespace: str = "ml",
    operation: str = "CREATE",
    kind: tuple[str, str, str] = ("", "v1", "Pod"),
    resource: str = "pods",
    dry_run: bool = False,
    **request_fields: Any,
) -> dict[str, Any]:
    group, version, kind_name = kind
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": group, "version": version, "kind": kind_name},
        "resource": {"group": group, "version": version, "resource": resource},
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "tester"},
        "object": copy.deepcopy(pod),
        "dryRun": dry_run,
    }
    request.update(request_fields)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return patch


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_until(
    condition: Callable[[], bool], timeout: float = 15.0, interval: float = 0.05
) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


@dataclass
class RunningServer:
    """A ``gpushare serve`` process (the gunicorn arbiter after exec) on a loopback port."""

    process: subprocess.Popen[bytes]
    port: int
    ca_file: Path
    log_path: Path
    state_dir: Path
    extra: dict[str, Any] = field(default_factory=dict)

    def context(self, ca_file: Path | None = None) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(ca_file or self.ca_file))

    def connection(
        self, ca_file: Path | None = None, timeout: float = 10.0
    ) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=self.context(ca_file), timeout=timeout
        )

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, bytes]:
        connection = self.connection()
        try:
            headers = {"Content-Type": content_type} if body is not None else {}
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def json(self, method: str, path: str, payload: Any = None) -> tuple[int, Any]:
        body = None if payload is None else json.dumps(payload).encode()
        status, data = self.request(method, path, body)
        return status, json.loads(data)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def worker_pids(self) -> list[int]:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(pid) for pid in children.read_text().split()] if children.exists() else []

    def stop(self, timeout: float = 30.0) -> int:
        return terminate(self.process, timeout)


@contextmanager
def running_server(
    tmp_path: Path, *args: str, ca_file: Path | None = None, ready: bool = True
) -> Iterator[RunningServer]:
    """Start ``gpushare serve`` with ``args`` on a free port; stop it (SIGTERM) afterwards."""
    port = free_port()
    state_dir = tmp_path / "state"
    log_path = tmp_path / f"server-{port}.log"
    command = [
        sys.executable,
        "-m",
        "webhook.cli",
        "serve",
        "--port",
        str(port),
        "--state-dir",
        str(state_dir),
        "--workers",
        "2",
        *args,
    ]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command, cwd=REPO, env=clean_environment(), stdout=log_file, stderr=subprocess.STDOUT
        )
    server = RunningServer(
        process, port, ca_file or state_dir / "certs" / "ca.crt", log_path, state_dir
    )
    try:
        if ready:
            wait_ready(server)
        yield server
    finally:
        server.stop()


def wait_ready(server: RunningServer) -> None:
    def answers() -> bool:
        if server.process.poll() is not None:
            raise AssertionError(f"server exited {server.process.returncode}:\n{server.log()}")
        try:
            status, _ = server.request("GET", "/readyz")
        except (OSError, ssl.SSLError):
            return False
        return status == 200

    if not wait_until(answers, START_DEADLINE_SECONDS):
        raise AssertionError(f"server not ready within {START_DEADLINE_SECONDS}s:\n{server.log()}")
