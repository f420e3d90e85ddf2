"""The real Kueue enforces a ClusterQueue's quota on the e2e control plane (no gpushare).

Kueue's manager, built from its Go module (harness/tools/kueue), runs against a plane of
its own (tests/e2e/kueue_plane.py) with the job and garbage-collector controllers. A
ClusterQueue covers cpu and a made-up extended resource with a nominal quota of one widget;
two suspended jobs, each asking one widget, are queued through a LocalQueue:

- exactly one is admitted (Kueue sets spec.suspend false, and its Workload's admission
  names the ClusterQueue and the flavor), the other stays suspended, and its Workload says
  why (QuotaReserved False: insufficient unused quota for the widget);
- deleting the admitted job frees the widget (the garbage collector deletes its Workload)
  and the other is admitted.

The same for batch Jobs and for JobSets (only the JobSet CRD is installed: Kueue's jobset
integration needs no JobSet controller to admit).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from kueue_plane import KueueTestPlane, queued

from harness.kueue import admission, pending_message
from harness.processes import wait_for
from harness.registration import PAUSE_IMAGE

WIDGET = "example.com/widget"
FLAVOR = "default"
ADMIT_TIMEOUT_S = 60.0
STAYS_SUSPENDED_S = 10.0


def widget_pod_spec() -> dict[str, Any]:
    """One container asking one widget (requests equal limits: an extended resource)."""
    resources = {"requests": {WIDGET: "1"}, "limits": {WIDGET: "1"}}
    container = {"name": "main", "image": PAUSE_IMAGE, "resources": resources}
    return {"restartPolicy": "Never", "containers": [container]}


def widget_job(name: str, queue: str) -> dict[str, Any]:
    spec = {"parallelism": 1, "completions": 1, "template": {"spec": widget_pod_spec()}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}
    return queued(job, queue)


def widget_jobset(name: str, queue: str) -> dict[str, Any]:
    job_spec = {"parallelism": 1, "completions": 1, "template": {"spec": widget_pod_spec()}}
    replicated = {"name": "workers", "replicas": 1, "template": {"spec": job_spec}}
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {"replicatedJobs": [replicated]},
    }
    return queued(jobset, queue)


@dataclass(frozen=True)
class Kind:
    """A job-like kind Kueue admits: where it lives, how to make one, its pod set's name."""

    collection: str  # API path with {namespace}
    manifest: Callable[[str, str], dict[str, Any]]
    pod_set: str


KINDS = {
    "job": Kind("/apis/batch/v1/namespaces/{namespace}/jobs", widget_job, "main"),
    "jobset": Kind(
        "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets", widget_jobset, "workers"
    ),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_one_widget_of_quota_admits_one_job_of_two(kueue_plane: KueueTestPlane, kind: str) -> None:
    kueue = kueue_plane.kueue
    namespace = kueue_plane.namespace(f"kueue-{kind}")
    cluster_queue = f"widgets-{uuid.uuid4().hex[:8]}"
    kueue.create_resource_flavor(FLAVOR)
    kueue.create_cluster_queue(cluster_queue, {"cpu": "4", WIDGET: 1}, flavor=FLAVOR)
    kueue.create_local_queue(namespace, "team", cluster_queue)

    collection = KINDS[kind].collection.format(namespace=namespace)
    created = [
        kueue.request("POST", collection, KINDS[kind].manifest(f"{kind}-{n}", "team"))
        for n in ("a", "b")
    ]
    paths = {f"{collection}/{obj['metadata']['name']}": obj["metadata"]["uid"] for obj in created}

    def admitted_ones() -> list[str] | None:
        kueue.check_alive()
        unsuspended = [path for path in paths if not kueue.suspended(path)]
        return unsuspended or None

    admitted = wait_for(
        f"one {kind} admitted", admitted_ones, timeout=ADMIT_TIMEOUT_S, on_timeout=kueue_plane.logs
    )
    assert len(admitted) == 1, f"both admitted with one widget of quota: {admitted}"
    (pending,) = set(paths) - set(admitted)
    assert kueue.stays_suspended(pending, STAYS_SUSPENDED_S), kueue.log_tail()

    admitted_uid = paths[admitted[0]]
    workload = kueue.wait_workload(namespace, admitted_uid, until=lambda w: bool(admission(w)))
    assignment = admission(workload)
    assert assignment is not None
    assert assignment["clusterQueue"] == cluster_queue
    (pod_set,) = assignment["podSetAssignments"]
    assert pod_set["name"] == KINDS[kind].pod_set
    assert pod_set["flavors"] == {WIDGET: FLAVOR}, pod_set
    assert pod_set["resourceUsage"] == {WIDGET: "1"}, pod_set

    waiting = kueue.wait_workload(
        namespace, paths[pending], until=lambda w: pending_message(w) is not None
    )
    message = pending_message(waiting)
    assert message is not None
    assert f"insufficient unused quota for {WIDGET} in flavor {FLAVOR}" in message, message
    assert f"pod set {KINDS[kind].pod_set}" in message, message

    # Deleting the admitted one frees its widget: the garbage collector deletes its
    # Workload, Kueue gives the quota back and admits the other.
    kueue.request("DELETE", admitted[0], query=[("propagationPolicy", "Background")])
    kueue.wait_unsuspended(pending, timeout=ADMIT_TIMEOUT_S)
