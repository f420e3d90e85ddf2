"""Test doubles and helpers for the node-side tests: a recording NodeApi, the stand-in MPS
control program's wrapper, policy files, and bounded waits."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from webhook.node.errors import NodeApiError
from webhook.node.mps_control import MpsControl
from webhook.node.node_api import merge_patch_body

HERE = Path(__file__).resolve().parent
FAKE_CONTROL = HERE / "fake_mps_control.py"

T = TypeVar("T")


def write_fake_control(directory: Path) -> Path:
    """An executable wrapper that runs the stand-in control program with this interpreter."""
    wrapper = directory / "nvidia-cuda-mps-control"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_CONTROL}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return wrapper


def command_log(pipe: Path) -> list[str]:
    """Every command the stand-in received, in order (plus daemon-start/crash/quit marks)."""
    path = pipe / "fake-commands.log"
    if not path.exists():
        return []
    return [json.loads(line)["cmd"] for line in path.read_text().splitlines() if line]


def fake_state(pipe: Path) -> dict[str, Any]:
    return dict(json.loads((pipe / "fake-state.json").read_text()))


def wait_until(what: str, check: Callable[[], T | bool | None], timeout: float = 10.0) -> T:
    """Poll ``check`` until truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except OSError:
        return True


def kill_quietly(pid: int | None) -> None:
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)


class RecordingNodeApi:
    """An in-memory NodeApi: applies merge patches to dicts and records each one.

    ``on_patch`` runs before each patch is applied (tests snapshot other state there);
    ``fail`` makes every call raise NodeApiError.
    """

    def __init__(
        self,
        node_name: str = "gpu-node-1",
        labels: Mapping[str, str] | None = None,
        on_patch: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self._node_name = node_name
        self.labels: dict[str, str] = dict(labels or {})
        self.annotations: dict[str, str] = {}
        self.patches: list[dict[str, Any]] = []
        self.on_patch = on_patch
        self.fail = False

    @property
    def node_name(self) -> str:
        return self._node_name

    def read_labels(self) -> Mapping[str, str]:
        if self.fail:
            raise NodeApiError(f"Cannot read node {self._node_name}: injected failure.")
        return dict(self.labels)

    def patch_metadata(
        self,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> None:
        if self.fail:
            raise NodeApiError(f"Cannot patch node {self._node_name}: injected failure.")
        body = merge_patch_body(labels, annotations)
        if self.on_patch is not None:
            self.on_patch(body)
        self.patches.append(body)
        for target, changes in ((self.labels, labels), (self.annotations, annotations)):
            for key, value in (changes or {}).items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value

    def label_history(self, label: str) -> list[str | None]:
        """The value each patch gave ``label`` (None: removed), for patches that touched it."""
        return [
            p["metadata"]["labels"][label]
            for p in self.patches
            if label in p["metadata"].get("labels", {})
        ]


MPS_DAEMON_POLICY = """\
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata:
  name: {name}
spec:
  default: {default}
  match:
    namespaces: ["{namespace}"]
  mode: mps-daemon
  allocation: {allocation}
  gpuMemory: {memory}
  pools:
    - name: {pool}
      replicas: {replicas}
{extra_pool}  mpsDaemon:
    pipeDirectory: {pipe}
    logDirectory: {log}
    readyLabel: gpushare.io/mps-ready
"""


def mps_daemon_policy(
    directory: Path,
    *,
    name: str = "mps-daemon",
    pool: str = "a100-mps",
    replicas: int = 4,
    allocation: str = "replica-class",
    memory: str = "80Gi",
    pipe: Path,
    log: Path,
    gpus_per_node: int | None = None,
    default: bool = True,
    namespace: str = "ml",
) -> Path:
    extra = f"      gpusPerNode: {gpus_per_node}\n" if gpus_per_node is not None else ""
    path = directory / f"{name}.yaml"
    path.write_text(
        MPS_DAEMON_POLICY.format(
            name=name,
            pool=pool,
            replicas=replicas,
            allocation=allocation,
            memory=memory,
            pipe=pipe,
            log=log,
            extra_pool=extra,
            default=str(default).lower(),
            namespace=namespace,
        )
    )
    return path


def fake_gpus_file(directory: Path, gpus: list[dict[str, Any]], **extra: Any) -> Path:
    path = directory / "fake-gpus.json"
    path.write_text(json.dumps({"gpus": gpus, **extra}))
    return path


A100 = {
    "uuid": "GPU-11111111-2222-3333-4444-555555555555",
    "name": "NVIDIA A100-SXM4-80GB",
    "memoryMiB": 81920,
    "computeCapability": "8.0",
}


@dataclass
class FakeMps:
    binary: Path
    pipe: Path
    log: Path

    def control(self, **timeouts: float) -> MpsControl:
        return MpsControl(str(self.binary), self.pipe, self.log, **timeouts)

    def commands(self) -> list[str]:
        return command_log(self.pipe)

    def touch(self, name: str) -> None:
        (self.pipe / name).touch()

    def clear(self, name: str) -> None:
        (self.pipe / name).unlink(missing_ok=True)
