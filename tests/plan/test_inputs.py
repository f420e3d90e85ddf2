"""The three inputs: CSV rows (bad ones named by line), manifests (replicas count), and
pods read back from a cluster (turned back into what their authors wrote)."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.constants import APPLIED_ANNOTATION, FRACTION_ANNOTATION
from webhook.errors import ManifestError
from webhook.plan.cluster_input import authored_pod, group_pods
from webhook.plan.csv_input import parse_table
from webhook.plan.manifest_input import read_workloads


def test_csv_rows_become_annotated_pods() -> None:
    (train, mem) = parse_table("name,fraction,memory,count\ntrain,0.5,,3\nmem,,20Gi,2\n", "t.csv")
    assert (train.name, train.count, train.source) == ("train", 3, "t.csv:2")
    assert train.document["metadata"]["annotations"] == {FRACTION_ANNOTATION: "0.5"}
    assert mem.document["metadata"]["annotations"] == {"gpu-memory": "20Gi"}
    assert mem.namespace == "default"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "t.csv: empty; write a header: name,fraction,memory,count"),
        (
            "name,fraction,size,count\n",
            "t.csv:1: unknown column 'size'; the columns are name, "
            "fraction, memory, count, namespace",
        ),
        ("name,fraction\n", "t.csv:1: the header has no count column"),
        ("name,count\n", "t.csv:1: the header has no fraction or memory column"),
        (
            "name,fraction,count\na,0.5,1\nb,0.5,many\n",
            "t.csv:3: count 'many' is not a whole number from 1 to 1,000,000",
        ),
        ("name,fraction,count\na,0.5,0\n", "t.csv:2: count '0' is not a whole number"),
        ("name,fraction,count\na,0.5\n", "t.csv:2: 2 cells, but the header has 3"),
        ("name,fraction,count\n,0.5,1\n", "t.csv:2: the name is empty"),
        ("name,fraction,memory,count\na,,,1\n", "t.csv:2: 'a' gives neither fraction nor memory"),
        ("name,fraction,count\n", "t.csv: no rows after the header"),
        ("name,fraction,count\na,0.5,2000000\n", "t.csv:2: count '2000000' is not a whole"),
        ('name,fraction,count\n"a,0.5,1\n', "t.csv:"),
    ],
)
def test_bad_csv_is_refused_with_its_line(text: str, message: str) -> None:
    with pytest.raises(ManifestError) as error:
        parse_table(text, "t.csv")
    assert str(error.value).startswith(message)


def test_csv_total_pods_are_bounded() -> None:
    rows = "".join(f"w{n},0.5,600000\n" for n in range(2))
    with pytest.raises(ManifestError, match=r"t.csv:3: more than 100,000 rows or 1,000,000 pods"):
        parse_table("name,fraction,count\n" + rows, "t.csv")


MANIFESTS = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}, annotations: {gpu-fraction: "0.25"}}
    spec: {containers: [{name: main, image: nginx}]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: sweep}
spec:
  parallelism: 5
  completions: 2
  template:
    metadata: {annotations: {gpu-fraction: "0.5"}}
    spec: {restartPolicy: Never, containers: [{name: main, image: trainer}]}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      parallelism: 4
      template:
        metadata: {annotations: {gpu-fraction: "0.1"}}
        spec: {restartPolicy: Never, containers: [{name: main, image: trainer}]}
---
apiVersion: v1
kind: Pod
metadata: {name: one, annotations: {gpu-fraction: "1"}}
spec: {containers: [{name: main, image: trainer}]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: not-a-workload}
"""


def test_manifests_count_replicas(tmp_path: Path) -> None:
    (tmp_path / "mix.yaml").write_text(MANIFESTS)
    workloads = read_workloads([str(tmp_path)])
    assert [(w.name, w.count) for w in workloads] == [
        ("Deployment/shop/web", 3),
        ("Job/default/sweep", 2),  # parallelism 5, but only 2 completions
        ("CronJob/default/nightly", 4),
        ("Pod/default/one", 1),
    ]
    assert workloads[0].source == f"{tmp_path / 'mix.yaml'}:2"


def test_manifest_replicas_must_be_a_count(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(MANIFESTS.replace("replicas: 3", "replicas: -1"))
    with pytest.raises(
        ManifestError, match=r"Deployment/shop/web: spec.replicas -1 is not a whole"
    ):
        read_workloads([str(tmp_path / "bad.yaml")])


def test_manifests_refused_as_the_apiserver_would(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(MANIFESTS.replace('gpu-fraction: "1"', "gpu-fraction: 1"))
    with pytest.raises(ManifestError, match=r"is the number 1, which the apiserver refuses"):
        read_workloads([str(tmp_path / "bad.yaml")])


def mutated(name: str, owner: str | None, phase: str = "Running") -> dict[str, object]:
    metadata: dict[str, object] = {
        "name": name,
        "namespace": "team",
        "uid": name,
        "annotations": {FRACTION_ANNOTATION: "0.5", APPLIED_ANNOTATION: "{}"},
    }
    if owner:
        metadata["ownerReferences"] = [{"kind": "ReplicaSet", "name": owner, "controller": True}]
    return {
        "metadata": metadata,
        "spec": {
            "nodeName": "node-1",
            "containers": [
                {
                    "name": "main",
                    "image": "trainer",
                    "resources": {
                        "limits": {"nvidia.com/gpu.shared": "1", "cpu": "1"},
                        "requests": {"nvidia.com/gpu.shared": "1"},
                    },
                }
            ],
        },
        "status": {"phase": phase},
    }


def test_cluster_pods_are_turned_back_into_what_was_written() -> None:
    pod = authored_pod(mutated("a", "web-1"), frozenset({"nvidia.com/gpu.shared"}))
    assert pod["metadata"]["annotations"] == {FRACTION_ANNOTATION: "0.5"}
    assert "nodeName" not in pod["spec"]
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"cpu": "1"}, "requests": {}}


def test_cluster_pods_group_by_controller_and_skip_finished_ones() -> None:
    pods = [
        mutated("a", "web-1"),
        mutated("b", "web-1"),
        mutated("c", "web-1", phase="Pending"),
        mutated("d", None),
        mutated("e", "web-1", phase="Succeeded"),
    ]
    workloads = group_pods(pods, frozenset({"nvidia.com/gpu.shared"}))
    assert [(w.name, w.count) for w in workloads] == [
        ("ReplicaSet/team/web-1", 3),
        ("Pod/team/d", 1),
    ]


def test_daemonsets_and_pods_without_api_version(tmp_path: Path) -> None:
    (tmp_path / "ds.yaml").write_text(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: agent}\nspec:\n  template:\n"
        "    metadata: {annotations: {gpu-fraction: '0.1'}}\n"
        "    spec: {containers: [{name: main, image: agent}]}\n---\n"
        "kind: Pod\nmetadata: {name: bare, annotations: {gpu-fraction: '0.5'}}\n"
        "spec: {containers: [{name: main, image: trainer}]}\n"
    )
    daemonset, pod = read_workloads([str(tmp_path)])
    assert (daemonset.count, daemonset.note) == (
        1,
        "DaemonSet/default/agent runs one pod on each node it selects; counted as one pod",
    )
    assert (pod.name, pod.count, pod.note) == ("Pod/default/bare", 1, "")
