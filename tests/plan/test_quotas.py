"""``gpushare plan`` against quotas on GPU shares: ResourceQuotas and Kueue ClusterQueues from
manifests, ResourceQuotas from a cluster; each quota's demand in thousandths of a GPU, as
the webhook's applied record counts it, against its room."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.plan.conftest import REPO
from webhook.cli import main
from webhook.core import load_policies
from webhook.plan import plan, read_cluster, read_manifest_input
from webhook.plan.quota_input import milli_of, quotas_of

WORKLOADS = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: infer, namespace: team-a}
spec:
  replicas: 4
  template:
    metadata: {annotations: {gpu-fraction: "0.5"}}
    spec: {containers: [{name: main, image: vllm/vllm-openai}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: train, namespace: team-b}
spec:
  replicas: 6
  template:
    metadata: {annotations: {gpu-fraction: "0.5"}}
    spec: {containers: [{name: main, image: pytorch/pytorch}]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: sweep, namespace: team-b}
spec:
  parallelism: 3
  template:
    metadata: {annotations: {gpu-fraction: "0.25"}}
    spec: {restartPolicy: Never, containers: [{name: main, image: pytorch/pytorch}]}
"""

# team-a: 4 x 500 = 2000 of 3000: fits. team-b: 6 x 500 + 3 x 250 = 3750 of 4000 - 1500
# used = 2500: 1250 short.
QUOTAS = """\
apiVersion: v1
kind: ResourceQuota
metadata: {name: gpu-shares, namespace: team-a}
spec:
  hard: {requests.gpushare.io/milligpu: 3k}
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: gpu-shares, namespace: team-b}
spec:
  hard: {requests.gpushare.io/milligpu: "4000", cpu: "64"}
status:
  used: {requests.gpushare.io/milligpu: "1500"}
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: cpu-only, namespace: team-a}
spec:
  hard: {cpu: "64"}
"""

KUEUE = """\
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: research}
spec:
  namespaceSelector:
    matchExpressions: [{key: kubernetes.io/metadata.name, operator: In, values: [team-c, team-d]}]
  resourceGroups:
  - coveredResources: [gpushare.io/milligpu]
    flavors:
    - name: a
      resources: [{name: gpushare.io/milligpu, nominalQuota: "1000"}]
    - name: b
      resources: [{name: gpushare.io/milligpu, nominalQuota: 500}]
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata: {name: research, namespace: team-c}
spec: {clusterQueue: research}
---
apiVersion: batch/v1
kind: Job
metadata: {name: queued, namespace: team-c, labels: {kueue.x-k8s.io/queue-name: research}}
spec:
  parallelism: 4
  suspend: true
  template:
    metadata: {annotations: {gpu-fraction: "0.5"}}
    spec: {restartPolicy: Never, containers: [{name: main, image: pytorch/pytorch}]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: unqueued, namespace: team-c}
spec:
  template:
    metadata: {annotations: {gpu-fraction: "0.5"}}
    spec: {restartPolicy: Never, containers: [{name: main, image: pytorch/pytorch}]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: no-local-queue, namespace: team-d, labels: {kueue.x-k8s.io/queue-name: research}}
spec:
  template:
    metadata: {annotations: {gpu-fraction: "0.5"}}
    spec: {restartPolicy: Never, containers: [{name: main, image: pytorch/pytorch}]}
"""


def share_policies(directory: Path) -> Path:
    """The bundled default policy with quota.shareResource: its pods carry the share."""
    documents = list(yaml.safe_load_all((REPO / "policies/default.yaml").read_text()))
    for document in documents:
        if document["kind"] == "GpuSharingPolicy":
            document["spec"]["quota"] = {"shareResource": True}
    path = directory / "shares.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    return path


@pytest.fixture
def manifests(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "workloads.yaml").write_text(WORKLOADS)
    (tmp_path / "quotas.yaml").write_text(QUOTAS)
    return tmp_path / "workloads.yaml", tmp_path / "quotas.yaml"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 0
    out, _ = capsys.readouterr()
    return out


def test_resource_quotas_from_manifests(
    manifests: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workloads, quotas = manifests
    argv = ["plan", "-f", str(workloads), "-f", str(quotas), "-o", "json"]
    out = run([*argv, "--policies", str(share_policies(tmp_path))], capsys)
    (configured, _) = json.loads(out)["schemes"]
    fits = {q["name"]: q for q in configured["quotas"]}
    assert list(fits) == ["team-a/gpu-shares", "team-b/gpu-shares"]  # cpu-only sets none
    assert fits["team-a/gpu-shares"] == {
        "kind": "ResourceQuota",
        "name": "team-a/gpu-shares",
        "namespaces": ["team-a"],
        "source": f"{quotas}:1",
        "hardMilliGpus": 3000,
        "usedMilliGpus": None,
        "heldNowMilliGpus": 0,
        "roomMilliGpus": 3000,
        "demandMilliGpus": 2000,
        "fits": True,
        "shortMilliGpus": 0,
        "charged": [{"workload": "Deployment/team-a/infer", "milliGpus": 2000}],
    }
    team_b = fits["team-b/gpu-shares"]
    assert (team_b["hardMilliGpus"], team_b["usedMilliGpus"], team_b["roomMilliGpus"]) == (
        4000,
        1500,
        2500,
    )
    assert (team_b["demandMilliGpus"], team_b["fits"], team_b["shortMilliGpus"]) == (
        3750,
        False,
        1250,
    )
    assert team_b["charged"] == [
        {"workload": "Deployment/team-b/train", "milliGpus": 3000},
        {"workload": "Job/team-b/sweep", "milliGpus": 750},
    ]


def test_the_table_and_the_page_say_which_quota_would_not_hold(
    manifests: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workloads, quotas = manifests
    policies = str(share_policies(tmp_path))
    argv = ["plan", "-f", str(workloads), "-f", str(quotas), "--policies", policies]
    lines = run([*argv, "--policy", "default"], capsys).splitlines()
    assert lines[14].split() == ["quotas", "exceeded", "1", "of", "2"]
    assert lines[-4:] == [
        "  quota ResourceQuota/team-a/gpu-shares: asks 2 GPUs of shares, room 3 (hard 3): fits",
        "  quota ResourceQuota/team-b/gpu-shares: asks 3.75 GPUs of shares, room 2.5 (hard 4, "
        "used 1.5): does not fit, 1.25 short",
        "    Deployment/team-b/train: 3",
        "    Job/team-b/sweep: 0.75",
    ]
    page = run([*argv, "-o", "html"], capsys)
    assert "ResourceQuota/team-b/gpu-shares: asks 3.75 GPUs of shares" in page


def test_without_quotas_the_report_is_unchanged(
    policy_dir: Path, mix_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "--csv", str(mix_csv), "--policies", str(policy_dir)]
    assert "quota" not in run(argv, capsys)
    report = json.loads(run([*argv, "-o", "json"], capsys))
    assert [s["quotas"] for s in report["schemes"]] == [[], [], [], []]


def test_a_policy_without_share_resource_charges_nothing(
    manifests: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Its pods carry no gpushare.io/milligpu, so no quota on it sees them."""
    workloads, quotas = manifests
    argv = ["plan", "-f", str(workloads), "-f", str(quotas), "-o", "json"]
    out = run([*argv, "--policies", str(REPO / "policies/default.yaml")], capsys)
    (configured, _) = json.loads(out)["schemes"]
    assert [(q["demandMilliGpus"], q["fits"]) for q in configured["quotas"]] == [
        (0, True),
        (0, True),
    ]


def test_a_cluster_queue_charges_the_workloads_of_its_local_queues(tmp_path: Path) -> None:
    (tmp_path / "kueue.yaml").write_text(KUEUE)
    given = read_manifest_input([str(tmp_path / "kueue.yaml")])
    (queue,) = given.quotas
    assert (queue.label, queue.namespaces, queue.hard) == (
        "ClusterQueue/research",
        ("team-c", "team-d"),
        1500,  # 1000 + 500 over its two flavors
    )
    assert queue.queues == (("team-c", "research"),)
    policies = load_policies(share_policies(tmp_path))
    (configured,) = plan(given.workloads, policies, names=["default"], quotas=given.quotas)
    (fit,) = configured.quotas
    # Only the labelled Job of a namespace with the LocalQueue: 4 x 500. The unlabelled one
    # is not Kueue's; team-d has no LocalQueue of it, so Kueue cannot admit its Job.
    assert fit.charged == (("Job/team-c/queued", 2000),)
    assert (fit.demand, fit.quota.room, fit.fits, fit.short) == (2000, 1500, False, 500)


def test_cluster_queue_selectors() -> None:
    def queue(selector: Any) -> tuple[tuple[str, ...], str]:
        document = yaml.safe_load(KUEUE.split("---", maxsplit=1)[0])
        document["spec"]["namespaceSelector"] = selector
        (found,) = quotas_of([(document, "x")])
        return found.namespaces, found.note

    assert queue({}) == (("*",), "")
    assert queue(None) == ((), "")  # null admits no namespace
    assert queue({"matchLabels": {"kubernetes.io/metadata.name": "ml"}}) == (("ml",), "")
    assert queue({"matchLabels": {"team": "ml"}}) == (
        ("*",),
        "its namespaceSelector's other labels are not evaluated",
    )


@pytest.mark.parametrize(
    ("value", "down", "up"),
    [
        ("4000", 4000, 4000),
        (4000, 4000, 4000),
        ("3k", 3000, 3000),
        ("1.5k", 1500, 1500),
        ("2e3", 2000, 2000),
        ("1Ki", 1024, 1024),
        ("500m", 0, 1),
        ("x", None, None),
        ("-1", None, None),
        (True, None, None),
        ("1e999999", None, None),
    ],
)
def test_quantities(value: Any, down: int | None, up: int | None) -> None:
    assert (milli_of(value), milli_of(value, round_up=True)) == (down, up)


# -- a cluster ---------------------------------------------------------------------------------


class Response:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.data = json.dumps({"items": items, "metadata": {}}).encode()


def running_pod(name: str, phase: str = "Running") -> dict[str, Any]:
    """A pod the webhook admitted under a policy with quota.shareResource."""
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "annotations": {"gpu-fraction": "0.5", "gpushare.io/applied": "{}"},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "web-1", "controller": True}],
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "trainer",
                    "resources": {
                        "limits": {"nvidia.com/gpu.shared": "1", "gpushare.io/milligpu": "500"},
                        "requests": {"nvidia.com/gpu.shared": "1", "gpushare.io/milligpu": "500"},
                    },
                }
            ]
        },
        "status": {"phase": phase},
    }


CLUSTER_QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "gpu-shares", "namespace": "team-a"},
    "spec": {"hard": {"requests.gpushare.io/milligpu": "1500"}},
    "status": {"used": {"requests.gpushare.io/milligpu": "1000"}},
}


NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "gpu-1", "labels": {"gpushare.io/driver-memory-limit": "true"}},
}


def fake_cluster(
    monkeypatch: pytest.MonkeyPatch,
    quotas: Exception | list[Any],
    nodes: Exception | tuple[Any, ...] | list[Any] = (),
) -> None:
    from kubernetes import client, config

    class Api:
        def __enter__(self) -> Api:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    class Core:
        def __init__(self, api: Api) -> None:
            self.api = api

        def list_pod_for_all_namespaces(self, **options: Any) -> Response:
            assert options["limit"] == 500
            pods = [running_pod("a"), running_pod("b"), running_pod("c", phase="Succeeded")]
            return Response(pods)

        def list_resource_quota_for_all_namespaces(self, **options: Any) -> Response:
            assert options["_request_timeout"] == (5.0, 30.0)
            if isinstance(quotas, Exception):
                raise quotas
            return Response(quotas)

        def list_node(self, **options: Any) -> Response:
            assert options["limit"] == 500 and "label_selector" not in options
            if isinstance(nodes, Exception):
                raise nodes
            return Response(list(nodes))

    monkeypatch.setattr(config, "new_client_from_config", lambda **_: Api())
    monkeypatch.setattr(client, "CoreV1Api", Core)


def test_cluster_quotas_room_counts_what_the_pods_hold_already(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_cluster(monkeypatch, [CLUSTER_QUOTA])
    given = read_cluster(None, None, None, None, frozenset())
    (workload,) = given.workloads
    assert (workload.name, workload.count) == ("ReplicaSet/team-a/web-1", 2)
    # The share resource is gpushare's: taken off, as the pods' GPU resources are.
    resources = workload.document["spec"]["containers"][0]["resources"]
    assert resources == {"limits": {}, "requests": {}}
    (quota,) = given.quotas
    # used 1000 is these two running pods' 500 each: the room is 1500 - 1000 + 1000.
    assert (quota.hard, quota.used, quota.held_now, quota.room) == (1500, 1000, 1000, 1500)
    (configured, _) = plan(
        given.workloads, load_policies(share_policies(tmp_path)), quotas=given.quotas
    )
    (fit,) = configured.quotas
    assert (fit.demand, fit.fits) == (1000, True)
    # Under a policy without shareResource the re-planned pods are served, not refused for
    # asking the share resource themselves.
    (bundled,) = plan(given.workloads, load_policies(REPO / "policies/default.yaml"))[1:]
    assert (bundled.pods_served, bundled.pods_not_served) == (2, 0)


def test_cluster_quotas_not_listable_leave_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.client.exceptions import ApiException

    fake_cluster(monkeypatch, ApiException(status=403, reason="Forbidden"), [NODE])
    given = read_cluster(None, None, None, None, frozenset())
    assert given.quotas == ()
    assert given.notes == (
        "listing ResourceQuotas failed (403 Forbidden): no quota on GPU shares is checked; "
        "let the kubeconfig's user list resourcequotas",
    )
    assert [w.count for w in given.workloads] == [2]
    assert given.nodes == (NODE,)


def test_cluster_nodes_not_listable_leave_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.client.exceptions import ApiException

    fake_cluster(monkeypatch, [CLUSTER_QUOTA], ApiException(status=403, reason="Forbidden"))
    given = read_cluster(None, None, None, None, frozenset())
    assert given.nodes is None and len(given.quotas) == 1
    assert given.notes == (
        "listing nodes failed (403 Forbidden): which pools have a node enforcing the driver "
        "memory limit is not checked; let the kubeconfig's user list nodes, or pass --nodes FILE",
    )
