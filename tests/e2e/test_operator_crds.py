"""GPU operators' CRDs, taken from their own Go modules, installed in a real kube-apiserver.

harness/tools/operator-crds/build.sh gathers the CustomResourceDefinitions and published
example manifests of KubeRay, the Kubeflow Training Operator and Trainer, Argo Workflows,
JobSet, LeaderWorkerSet and KServe from the projects' Go modules (versions and h1: sums
pinned in modules.txt there), beside a minimal Notebook CRD of ours (its module is not
served by the proxy); harness/operator_crds.py finds the directory ($GPUSHARE_OPERATOR_CRDS,
else build.sh on demand). This module proves they are usable for tests of workloads that
these operators turn into pods:

- every CRD installs with server-side apply (the full Argo and KServe CRDs are megabytes:
  client-side apply's last-applied annotation could not hold them) and becomes Established,
  with each served version in API discovery;
- every sample named in modules.txt is created as published (its namespace replaced by a
  fresh one) under kubectl's strict field validation, so a field the CRD's schema does not
  know fails the test, and GPU requests in it survive the schema's pruning;
- a TrainJob (the Trainer module publishes runtimes, not jobs) and a Notebook (the minimal
  CRD) are created from their documented API, the Notebook read back in every served version.

A control plane of its own (no scheduler: nothing here is scheduled), so the other modules'
apiserver never carries these schemas (tens of megabytes of OpenAPI).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import unique_name
from operator_plane import FIELD_MANAGER, OperatorPlane, kubectl

from harness.controlplane import ControlPlane
from harness.operator_crds import TOOL_DIR, OperatorCrds, read_pins

PINS = read_pins()
SAMPLES = [(pin.project, sample) for pin in PINS for sample in pin.samples]
GPU = "nvidia.com/gpu"
# Applying the full CRDs (about 25 MB of YAML) and waiting for them: seconds, but leave room.
INSTALL_TIMEOUT_S = 300.0


def get_json(plane: ControlPlane, *args: str) -> Any:
    return json.loads(kubectl(plane, "get", "-o", "json", *args))


def fresh_namespace(plane: ControlPlane, prefix: str) -> str:
    name = unique_name(prefix)
    kubectl(plane, "create", "namespace", name)
    return name


def created_items(output: str) -> list[dict[str, Any]]:
    """The objects `kubectl create -o json` printed: one JSON document after another."""
    decoder = json.JSONDecoder()
    items: list[dict[str, Any]] = []
    rest = output.lstrip()
    while rest:
        item, end = decoder.raw_decode(rest)
        items.append(item)
        rest = rest[end:].lstrip()
    return items


@pytest.fixture(scope="module")
def plane(operator_plane: OperatorPlane) -> ControlPlane:
    """A control plane of this module's own (conftest.py's operator_plane: etcd and
    kube-apiserver, every operator CRD installed server-side and Established)."""
    return operator_plane.plane


@pytest.fixture(scope="module")
def installed(operator_plane: OperatorPlane) -> dict[str, list[str]]:
    """CRD names by project."""
    return operator_plane.installed


def test_modules_txt_gives_every_module_project_samples_and_crds() -> None:
    assert PINS, "modules.txt names no project"
    for pin in PINS:
        assert pin.crds, f"{pin.project} has no CRD"
        if pin.module is not None:
            assert pin.samples, f"{pin.project} ({pin.source}) has no sample"


@pytest.mark.parametrize(
    "path", sorted((TOOL_DIR / "minimal").glob("*.yaml")), ids=lambda p: p.name
)
def test_minimal_crds_say_what_they_are_and_keep_spec_and_status(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("# MINIMAL CustomResourceDefinition"), path
    header = text.split("\napiVersion:", 1)[0]
    assert re.search(r"\b[0-9a-f]{40}\b", header), f"{path}: the header cites no commit"
    crd = yaml.safe_load(text)
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["spec"]["scope"] == "Namespaced"
    versions = crd["spec"]["versions"]
    assert [v["name"] for v in versions if v["storage"]] == [versions[0]["name"]]
    for version in versions:
        assert version["served"] is True
        schema = version["schema"]["openAPIV3Schema"]
        assert schema["type"] == "object"
        for field in ("spec", "status"):
            assert schema["properties"][field] == {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
            }


@pytest.mark.parametrize("project", [pin.project for pin in PINS])
def test_crds_are_established_and_served(
    project: str, plane: ControlPlane, installed: dict[str, list[str]]
) -> None:
    for name in installed[project]:
        crd = get_json(plane, "crd", name)
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions.get("Established") == "True", (name, conditions)
        assert conditions.get("NamesAccepted") == "True", (name, conditions)
        spec = crd["spec"]
        for version in spec["versions"]:
            if not version["served"]:
                continue
            discovery = json.loads(
                kubectl(plane, "get", "--raw", f"/apis/{spec['group']}/{version['name']}")
            )
            served = {resource["name"] for resource in discovery["resources"]}
            assert spec["names"]["plural"] in served, (name, version["name"], served)
            if "status" in version.get("subresources", {}):
                assert f"{spec['names']['plural']}/status" in served


@pytest.mark.parametrize("project, sample", SAMPLES, ids=[f"{p}:{s}" for p, s in SAMPLES])
def test_sample_is_created_as_published(
    project: str,
    sample: str,
    plane: ControlPlane,
    operator_crds: OperatorCrds,
    installed: dict[str, list[str]],
) -> None:
    path = operator_crds.sample(project, sample)
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert documents, path
    for document in documents:
        # Some samples name the namespace their README creates (e.g. kubeflow).
        document.get("metadata", {}).pop("namespace", None)
    namespace = fresh_namespace(plane, project)
    # kubectl's default --validate=strict: the apiserver refuses fields the schema lacks.
    result = plane.kubectl(
        "create",
        "-n",
        namespace,
        f"--field-manager={FIELD_MANAGER}",
        "-o",
        "json",
        "-f",
        "-",
        input=yaml.safe_dump_all(documents, sort_keys=False),
        check=False,
        timeout=INSTALL_TIMEOUT_S,
    )
    source = operator_crds.source(path)
    assert result.returncode == 0, f"{source}\n{result.stderr}"
    assert "Warning:" not in result.stderr, f"{source}\n{result.stderr}"
    items = created_items(result.stdout)
    assert [(i["apiVersion"], i["kind"]) for i in items] == [
        (d["apiVersion"], d["kind"]) for d in documents
    ]
    # A CRD's name is <plural>.<group>: the sample holds at least one of the project's kinds.
    groups = {name.split(".", 1)[1] for name in installed[project]}
    assert any(item["apiVersion"].split("/")[0] in groups for item in items), source
    for document, item in zip(documents, items, strict=True):
        # The CRD's structural schema prunes what it does not know: GPU requests must stay.
        # (managedFields names every field set, so it is left out of the count.)
        stored = {key: value for key, value in item.items() if key != "status"}
        stored["metadata"] = {k: v for k, v in item["metadata"].items() if k != "managedFields"}
        wanted, kept = json.dumps(document).count(GPU), json.dumps(stored).count(GPU)
        assert kept == wanted, f"{source}: {document['kind']} kept {kept} of {wanted} {GPU}"


def test_a_field_the_schema_lacks_is_refused(
    plane: ControlPlane, operator_crds: OperatorCrds, installed: dict[str, list[str]]
) -> None:
    """What makes the sample test strict: a published RayCluster with one field its CRD does
    not know is refused, not silently pruned."""
    path = operator_crds.sample("kuberay", "config/samples/ray-cluster.sample.yaml")
    (document,) = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    document["spec"]["gpushareNoSuchField"] = True
    namespace = fresh_namespace(plane, "strict")
    result = plane.kubectl(
        "create", "-n", namespace, "-f", "-", input=json.dumps(document), check=False
    )
    assert result.returncode != 0
    assert 'unknown field "spec.gpushareNoSuchField"' in result.stderr, result.stderr


def test_a_trainjob_runs_on_a_published_runtime(
    plane: ControlPlane, operator_crds: OperatorCrds, installed: dict[str, list[str]]
) -> None:
    """The TrainJob of Trainer's CONTRIBUTING.md, with GPUs per node, on the module's
    torch-distributed ClusterTrainingRuntime (applied server-side: another test may have
    created it already)."""
    runtime = operator_crds.sample("trainer", "manifests/base/runtimes/torch_distributed.yaml")
    kubectl(plane, "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", str(runtime))
    namespace = fresh_namespace(plane, "trainjob")
    trainjob = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "pytorch-mnist-example", "namespace": namespace},
        "spec": {
            "runtimeRef": {
                "name": "torch-distributed",
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
            },
            "trainer": {"numNodes": 2, "resourcesPerNode": {"limits": {GPU: "1"}}},
        },
    }
    result = plane.kubectl(
        "create", "-o", "json", "-f", "-", input=json.dumps(trainjob), check=False
    )
    assert result.returncode == 0, result.stderr
    assert "Warning:" not in result.stderr, result.stderr
    created = json.loads(result.stdout)
    assert created["spec"]["trainer"]["resourcesPerNode"]["limits"][GPU] == "1"


def test_a_notebook_is_served_in_every_version(
    plane: ControlPlane, installed: dict[str, list[str]]
) -> None:
    """The minimal Notebook CRD: a v1 Notebook with a GPU, read in v1alpha1 and v1beta1
    (conversion None), its status written through the status subresource only."""
    (crd_name,) = installed["notebooks"]
    assert crd_name == "notebooks.kubeflow.org"
    namespace = fresh_namespace(plane, "notebook")
    notebook = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": {"name": "jupyter-gpu", "namespace": namespace},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "jupyter-gpu",
                            "image": "kubeflownotebookswg/jupyter-pytorch-cuda-full:v1.10.0",
                            "resources": {"limits": {GPU: "1"}},
                        }
                    ]
                }
            }
        },
    }
    kubectl(plane, "create", "-f", "-", input=json.dumps(notebook))
    for version in ("v1", "v1beta1", "v1alpha1"):
        raw = kubectl(
            plane,
            "get",
            "--raw",
            f"/apis/kubeflow.org/{version}/namespaces/{namespace}/notebooks/jupyter-gpu",
        )
        read = json.loads(raw)
        assert read["apiVersion"] == f"kubeflow.org/{version}"
        container = read["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"][GPU] == "1"
    status = {"status": {"readyReplicas": 1, "conditions": [], "containerState": {}}}
    kubectl(
        plane,
        "patch",
        "notebooks.v1.kubeflow.org/jupyter-gpu",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )
    # A status in the main resource's update is dropped: the subresource owns it.
    kubectl(
        plane,
        "patch",
        "notebooks.v1.kubeflow.org/jupyter-gpu",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"status": {"readyReplicas": 7}}),
    )
    read = get_json(plane, "notebooks.v1.kubeflow.org/jupyter-gpu", "-n", namespace)
    assert read["status"]["readyReplicas"] == 1


def test_sample_names_resolve(operator_crds: OperatorCrds) -> None:
    """The driver finds a sample by its module path and by a unique file name."""
    by_path = operator_crds.sample("kuberay", "config/samples/ray-cluster.sample.yaml")
    assert by_path == operator_crds.sample("kuberay", "ray-cluster.sample.yaml")
    assert operator_crds.source(by_path).startswith("github.com/ray-project/kuberay/ray-operator@")
    with pytest.raises(KeyError):
        operator_crds.sample("kuberay", "no-such-sample.yaml")
    assert set(operator_crds.projects) == {pin.project for pin in PINS}
