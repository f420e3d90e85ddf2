"""A control plane with the real Kueue in it, for the e2e modules that test quota (the
`kueue_plane` fixture of conftest.py).

Started in this order: etcd, kube-apiserver and kube-scheduler (harness/controlplane.py);
the CRDs of the operators whose Kueue integrations are enabled (JobSet, KubeRay, from
harness/operator_crds.py: before Kueue, so their integrations start at once instead of
waiting for the API) and Kueue's own; the kube-controller-manager with only the job and
garbage-collector controllers (a Job Kueue admits gets its pods, a deleted job takes its
pods and Workload with it); then Kueue (harness/kueue.py).

A plane of its own rather than the session's: start_controller_manager runs once per plane
and the session's may already run only the resourceclaim controller (test_dra.py and
test_plan_vs_scheduler.py start it), and Kueue's and the operators' CRDs stay out of the
session's apiserver.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from operator_plane import install_operator_crds

from harness.controlplane import ControlPlane
from harness.kueue import FRAMEWORKS, QUEUE_LABEL, KueueBuild, KueuePlane
from harness.operator_crds import OperatorCrds
from harness.processes import wait_for

JOB_CONTROLLERS = ("job-controller", "garbage-collector-controller")
# The operator project (harness/tools/operator-crds/modules.txt) behind each integration.
FRAMEWORK_PROJECTS = {"jobset.x-k8s.io/jobset": "jobset", "ray.io/rayjob": "kuberay"}
CONTROLLERS_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class KueueTestPlane:
    """The plane, Kueue on it (`kueue`: its helpers) and the operator CRDs installed."""

    plane: ControlPlane
    kueue: KueuePlane
    operator_crds: dict[str, list[str]]

    def namespace(self, prefix: str = "kueue") -> str:
        """A fresh namespace (no namespace controller runs: deleted ones stay Terminating)."""
        # conftest's unique_name, which this module cannot import (conftest imports it).
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        body = k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name))
        k8s.CoreV1Api(self.plane.api).create_namespace(body)
        return name

    def logs(self) -> str:
        """Kueue's log tail and the plane's, for failure messages."""
        return f"{self.kueue.log_tail()}\n{self.plane.logs()}"


def start_job_controllers(plane: ControlPlane) -> None:
    """The kube-controller-manager with the job and garbage-collector controllers; raises if
    the plane's one controller-manager was already started without them."""
    plane.start_controller_manager(JOB_CONTROLLERS, ready_log="Starting job controller")
    manager = next(c for c in plane.components if c.name == "kube-controller-manager")
    running = {
        name
        for arg in manager.args
        if arg.startswith("--controllers=")
        for name in arg.split("=", 1)[1].split(",")
    }
    missing = set(JOB_CONTROLLERS) - running
    if missing:
        raise AssertionError(
            f"kube-controller-manager already runs {sorted(running)} without {sorted(missing)}"
        )
    # start_controller_manager waits for one line: the job controller's.
    started = re.compile(r'"Starting controller".*controller="garbagecollector"')
    wait_for(
        "the garbage collector",
        lambda: True if started.search(manager.log_path.read_text(errors="replace")) else None,
        timeout=CONTROLLERS_TIMEOUT_S,
        on_timeout=manager.log_tail,
    )


def crds_for(crds: OperatorCrds, frameworks: Sequence[str]) -> OperatorCrds:
    """The operator CRDs that `frameworks` (Kueue integration names) need."""
    projects = {FRAMEWORK_PROJECTS[name] for name in frameworks if name in FRAMEWORK_PROJECTS}
    return OperatorCrds(crds.root, tuple(e for e in crds.entries if e.project in projects))


@contextmanager
def kueue_test_plane(
    harness_binary: Path,
    operator_crds: OperatorCrds,
    build: KueueBuild,
    workdir: Path,
    frameworks: Sequence[str] = FRAMEWORKS,
    resources: Mapping[str, Any] | None = None,
) -> Iterator[KueueTestPlane]:
    """A control plane under `workdir` with the job controllers, the operator CRDs of
    `frameworks` and Kueue running (`resources`: its Configuration's resources section,
    e.g. transformations); all stopped on exit."""
    with ControlPlane(binary=harness_binary, workdir=workdir) as plane:
        needed = crds_for(operator_crds, frameworks)
        installed = install_operator_crds(plane, needed) if needed.entries else {}
        kueue = KueuePlane(
            plane, build, workdir / "kueue", frameworks=frameworks, resources=resources
        )
        kueue.install_crds()
        # After the CRDs: the garbage collector discovers resources when it starts, then
        # only every 30 s, and until then leaves a deleted job's Workload (and its quota).
        start_job_controllers(plane)
        with kueue:
            yield KueueTestPlane(plane, kueue, installed)


def queued(manifest: dict[str, Any], queue: str) -> dict[str, Any]:
    """`manifest` (a Job, JobSet or RayJob) created suspended with the queue-name label,
    as Kueue's job webhooks, not registered here, would have made it."""
    metadata = manifest.setdefault("metadata", {})
    metadata.setdefault("labels", {})[QUEUE_LABEL] = queue
    manifest.setdefault("spec", {})["suspend"] = True
    return manifest
