"""GPU shares count in the cluster's quotas (docs/quotas.md), through the real apiserver.

gpushare serves a policy with ``quota.shareResource`` (time-slicing, pools of halves and
quarters) and is registered as ``gpushare webhook-config`` prints it.

- Kubernetes ResourceQuota, with the real kube-controller-manager's resource quota
  controller and scheduler: a namespace limited to ``requests.gpushare.io/milligpu: 1000``
  (1.0 GPU) takes a half and two quarters, and the pod asking one more quarter is refused at
  creation with the quota's own message; ``gpushare share-capacity`` advertises the share on
  the GPU node, so the scheduler binds the admitted pods.
- Kueue (v0.17.0, the real controller built from its Go module: harness/kueue.py): a
  ClusterQueue with room for 1.0 GPU (``gpushare.io/milligpu: 1000``) admits two Jobs whose
  templates only say ``gpu-fraction: "0.5"`` and keeps the third suspended, saying why; the
  same for JobSets; the pods the Job controller then creates carry the share Kueue charged.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_nodes import FakeGpuNode, create_fake_node
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kueue_plane import KueueTestPlane, queued

from harness.api import ensure_namespace
from harness.controlplane import ControlPlane
from harness.kueue import admission, pending_message
from harness.processes import wait_for
from harness.registration import PAUSE_IMAGE, GpushareWebhook
from harness.webhookserver import WebhookServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
SHARE = "gpushare.io/milligpu"
QUOTA_POLICY = {
    "apiVersion": "gpushare.io/v1alpha1",
    "kind": "GpuSharingPolicy",
    "metadata": {"name": "shares"},
    "spec": {
        "default": True,
        "mode": "time-slicing",
        "pools": [{"name": "half", "replicas": 2}, {"name": "quarter", "replicas": 4}],
        "quota": {"shareResource": True, "showbackLabels": True},
    },
}
ADMIT_TIMEOUT_S = 90.0
STAYS_SUSPENDED_S = 15.0


@pytest.fixture(scope="module")
def quota_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookServer]:
    """`gpushare serve` with the quota policy (and the bundled settings document)."""
    policies = tmp_path_factory.mktemp("quota-policies")
    settings = next(
        d
        for d in yaml.safe_load_all((REPO / "policies/default.yaml").read_text())
        if d and d["kind"] == "GpuSharingSettings"
    )
    (policies / "policies.yaml").write_text(yaml.safe_dump_all([settings, QUOTA_POLICY]))
    server = WebhookServer.start(tmp_path_factory.mktemp("quota-webhook"), policies)
    try:
        yield server
    finally:
        server.stop()


def registered(server: WebhookServer, api: k8s.ApiClient) -> GpushareWebhook:
    ensure_namespace(k8s.CoreV1Api(api), "e2e-probe")
    webhook = GpushareWebhook(server, api, "e2e-probe")
    webhook.register()
    return webhook


# -- Kubernetes ResourceQuota -----------------------------------------------------------------


@pytest.fixture(scope="module")
def quota_plane(
    harness_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A plane of its own with the resource quota controller (it fills in a quota's status,
    without which the quota admission plugin refuses every pod in the namespace)."""
    workdir = tmp_path_factory.mktemp("quota-plane")
    with ControlPlane(binary=harness_binary, workdir=workdir) as plane:
        plane.start_controller_manager(
            ["resourcequota-controller"], ready_log="Starting resource quota controller"
        )
        yield plane


def share_pod(name: str, fraction: str) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, annotations={"gpu-fraction": fraction}),
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name="main", image=PAUSE_IMAGE)],
            tolerations=[k8s.V1Toleration(operator="Exists")],
        ),
    )


def test_a_resource_quota_counts_gpu_share(
    quota_plane: ControlPlane, quota_server: WebhookServer
) -> None:
    core = k8s.CoreV1Api(quota_plane.api)
    webhook = registered(quota_server, quota_plane.api)
    try:
        # One GPU node per pool: halves (replicas 2) and quarters (replicas 4).
        nodes = [
            FakeGpuNode(name=f"gpu-{replicas}-{uuid.uuid4().hex[:6]}", replicas=replicas, gpus=1)
            for replicas in (2, 4)
        ]
        for node in nodes:
            create_fake_node(core, node)
        # The node side: the share-capacity controller, one pass, as its CLI runs it.
        subprocess.run(
            [
                sys.executable,
                "-m",
                "webhook.cli",
                "share-capacity",
                "--once",
                "--kubeconfig",
                str(quota_plane.kubeconfig),
            ],
            check=True,
            cwd=REPO,
            timeout=60,
        )
        for node in nodes:
            advertised = core.read_node_status(node.name).status.allocatable
            assert advertised[SHARE] in ("1000", "1k")  # the apiserver's canonical form: 1k

        namespace = f"quota-{uuid.uuid4().hex[:6]}"
        ensure_namespace(core, namespace)
        quota = k8s.V1ResourceQuota(
            metadata=k8s.V1ObjectMeta(name="gpushare-gpu-shares"),
            spec=k8s.V1ResourceQuotaSpec(hard={f"requests.{SHARE}": "1000"}),
        )
        core.create_namespaced_resource_quota(namespace, quota)
        wait_for(
            "the quota's status",
            lambda: (
                core.read_namespaced_resource_quota("gpushare-gpu-shares", namespace).status.hard
                or None
            ),
            timeout=60,
            on_timeout=quota_plane.logs,
        )

        created = {}
        for name, fraction in (("half", "0.5"), ("quarter-1", "0.25"), ("quarter-2", "0.2")):
            pod = core.create_namespaced_pod(namespace, share_pod(name, fraction))
            created[name] = pod
        held = {n: p.spec.containers[0].resources.requests[SHARE] for n, p in created.items()}
        assert held == {"half": "500", "quarter-1": "250", "quarter-2": "250"}
        assert created["half"].metadata.labels["gpushare.io/milligpu"] == "500"

        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod(namespace, share_pod("one-too-many", "0.25"))
        assert refused.value.status == 403
        message = refused.value.body
        assert "exceeded quota: gpushare-gpu-shares" in message, message
        assert f"requested: requests.{SHARE}=250" in message, message
        # Quantities in their canonical form: 1000 is written 1k.
        assert f"used: requests.{SHARE}=1k" in message, message
        assert f"limited: requests.{SHARE}=1k" in message, message

        # The scheduler places the admitted pods on the node that advertises the share.
        def bound() -> list[str] | None:
            pods = core.list_namespaced_pod(namespace).items
            nodes = [p.spec.node_name for p in pods]
            return nodes if all(nodes) else None

        bound_to = wait_for("the pods bound", bound, timeout=60, on_timeout=quota_plane.logs)
        half, quarter = nodes
        assert sorted(bound_to) == sorted([half.name, quarter.name, quarter.name])
    finally:
        webhook.unregister()


# -- Kueue ------------------------------------------------------------------------------------


def fraction_pod_spec() -> dict[str, Any]:
    return {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": PAUSE_IMAGE}],
    }


def share_job(name: str, queue: str) -> dict[str, Any]:
    template = {"metadata": {"annotations": {"gpu-fraction": "0.5"}}, "spec": fraction_pod_spec()}
    spec = {"parallelism": 1, "completions": 1, "template": template}
    return queued(
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}, queue
    )


def share_jobset(name: str, queue: str) -> dict[str, Any]:
    template = {"metadata": {"annotations": {"gpu-fraction": "0.5"}}, "spec": fraction_pod_spec()}
    job_spec = {"parallelism": 1, "completions": 1, "template": template}
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {
            "replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": job_spec}}]
        },
    }
    return queued(jobset, queue)


KINDS: dict[
    str, tuple[str, Callable[[str, str], dict[str, Any]], Callable[[dict[str, Any]], Any]]
] = {
    "job": (
        "/apis/batch/v1/namespaces/{namespace}/jobs",
        share_job,
        lambda job: job["spec"]["template"],
    ),
    "jobset": (
        "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets",
        share_jobset,
        lambda jobset: jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"],
    ),
}


@pytest.fixture(scope="module")
def kueue_webhook(
    kueue_plane: KueueTestPlane, quota_server: WebhookServer
) -> Iterator[GpushareWebhook]:
    webhook = registered(quota_server, kueue_plane.plane.api)
    try:
        yield webhook
    finally:
        webhook.unregister()


@pytest.mark.parametrize("kind", list(KINDS))
def test_kueue_charges_the_share_before_any_pod_exists(
    kueue_plane: KueueTestPlane, kueue_webhook: GpushareWebhook, kind: str
) -> None:
    kueue = kueue_plane.kueue
    collection_path, manifest, template_of = KINDS[kind]
    namespace = kueue_plane.namespace(f"shares-{kind}")
    cluster_queue = f"gpu-shares-{uuid.uuid4().hex[:8]}"
    kueue.create_resource_flavor("gpushare")
    kueue.create_cluster_queue(cluster_queue, {"cpu": "8", SHARE: 1000}, flavor="gpushare")
    kueue.create_local_queue(namespace, "team", cluster_queue)

    collection = collection_path.format(namespace=namespace)
    created = [
        kueue.request("POST", collection, manifest(f"{kind}-{n}", "team")) for n in ("a", "b", "c")
    ]
    # The stored templates carry the share their pods will hold, nothing else of gpushare's.
    for obj in created:
        container = template_of(obj)["spec"]["containers"][0]
        assert container["resources"] == {"limits": {SHARE: "500"}, "requests": {SHARE: "500"}}
    paths = {f"{collection}/{o['metadata']['name']}": o["metadata"]["uid"] for o in created}

    def two_admitted() -> list[str] | None:
        kueue.check_alive()
        unsuspended = [path for path in paths if not kueue.suspended(path)]
        return unsuspended if len(unsuspended) >= 2 else None

    admitted = wait_for(
        f"two {kind}s admitted", two_admitted, timeout=ADMIT_TIMEOUT_S, on_timeout=kueue_plane.logs
    )
    assert len(admitted) == 2, admitted
    (pending,) = set(paths) - set(admitted)
    assert kueue.stays_suspended(pending, STAYS_SUSPENDED_S), kueue.log_tail()

    workload = kueue.wait_workload(
        namespace, paths[admitted[0]], until=lambda w: bool(admission(w))
    )
    (pod_set,) = admission(workload)["podSetAssignments"]
    assert pod_set["resourceUsage"][SHARE] == "500", pod_set
    waiting = kueue.wait_workload(
        namespace, paths[pending], until=lambda w: pending_message(w) is not None
    )
    message = pending_message(waiting)
    assert message is not None and f"insufficient unused quota for {SHARE}" in message, message

    if kind == "job":
        # The Job controller makes the admitted Jobs' pods; gpushare's pod webhook gives
        # them the scheme's resource and the very share Kueue charged.
        core = k8s.CoreV1Api(kueue_plane.plane.api)

        def pods() -> list[k8s.V1Pod] | None:
            found = core.list_namespaced_pod(namespace).items
            return found if len(found) >= 2 else None

        for pod in wait_for(
            "the admitted jobs' pods", pods, timeout=60, on_timeout=kueue_plane.logs
        ):
            limits = pod.spec.containers[0].resources.limits
            assert limits[SHARE] == "500" and limits["nvidia.com/gpu.shared"] == "1", limits


def test_a_workload_kueue_does_not_manage_is_left_as_written(
    kueue_plane: KueueTestPlane, kueue_webhook: GpushareWebhook
) -> None:
    """A workload not managed by Kueue is never changed: its template stays as written."""
    namespace = kueue_plane.namespace("unqueued")
    job = share_job("plain", "team")
    del job["metadata"]["labels"]
    stored = kueue_plane.kueue.request("POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", job)
    assert stored["spec"]["template"]["spec"]["containers"][0].get("resources") in (None, {})
