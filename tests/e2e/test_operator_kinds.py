"""Every operator kind gpushare reads, created in a real kube-apiserver that serves the
operators' own CRDs, with gpushare's webhook registered in front of it.

One control plane for the module (`operator_plane`, conftest.py: etcd and kube-apiserver with
every CRD of harness/tools/operator-crds/modules.txt installed) and gpushare registered on it
as `gpushare webhook-config` prints it (harness/registration.py), so the validating webhooks
for these kinds are the ones users install. For each kind of gpushare's table
(webhook/core/workload_kinds.yaml) but JAXJob:

(a) a good object (a published sample adopted as tests/operator_adoption.py does, or given a
    share where its project publishes none with a GPU; a hand-written one following the
    project's documented API where it publishes no sample) is created and stored as
    written, with the Warning headers `check_workload` gives for it as stored;
(b) a bad one (`gpu-fraction: "1.5"`, or the annotation beside an `nvidia.com/gpu` limit in
    the same container) is refused with exactly `check_workload(...).admission_reasons`;
(c) the pod the controller would make from the bad template (`webhook.core.template_pod`),
    created directly, is refused by the mutating webhook with the same reasons, without
    the workload's prefix.

A TrainJob has no pod template: its annotation is warned about (its pods come from the
runtime). JAXJob has no CRD in training-operator v1.8.1 (the pinned module; facts sheet §4),
so it is checked offline only (`test_a_jaxjob_offline`). The LLMInferenceService's pods take
their annotations from `spec.annotations` (facts sheet §10, KServe v0.20.0, the pinned
version), which the validating condition reads.

No controller runs here, so nothing is ever made from these objects; pods in (c) are server-
side dry runs (the mutating webhook has sideEffects None, so it is called).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PROBE_NAMESPACE, unique_name
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from operator_plane import OperatorPlane

from harness.api import Admitted, create_pod, ensure_namespace, parse_warnings, status_message
from harness.operator_crds import OperatorCrds
from harness.registration import MUTATING_WEBHOOK, GpushareWebhook
from harness.webhookserver import WebhookServer
from tests.operator_adoption import (
    GPU,
    PodPath,
    adopt,
    annotate,
    request_annotations,
    share,
    value_at,
)
from webhook.core import (
    PolicySet,
    WorkloadVerdict,
    builtin_kinds,
    check_workload,
    load_policies,
    mutate,
    template_pod,
    workload_kind,
)
from webhook.server.review import clean_warnings

REPO = Path(__file__).resolve().parents[2]
APPLIED = "gpushare.io/applied"
KUBERNETES_GROUPS = ("", "apps", "batch")
# The kinds of gpushare's table that have a CRD here; JAXJob has none in v1.8.1.
KINDS = [
    "RayCluster",
    "RayJob",
    "RayService",
    "PyTorchJob",
    "TFJob",
    "MPIJob",
    "XGBoostJob",
    "PaddleJob",
    "MXJob",
    "TrainingRuntime",
    "ClusterTrainingRuntime",
    "TrainJob",
    "Notebook",
    "LeaderWorkerSet",
    "JobSet",
    "InferenceService",
    "LLMInferenceService",
    "Workflow",
    "WorkflowTemplate",
    "ClusterWorkflowTemplate",
    "CronWorkflow",
]
NO_CRD = {"JAXJob": "training-operator v1.8.1 ships no JAXJob CRD (added in v1.9)"}
# Versions gpushare reads (of later releases) that the pinned CRDs do not serve.
NOT_SERVED: set[tuple[str, str]] = set()


# -- the objects --------------------------------------------------------------------------


@dataclass(frozen=True)
class Mark:
    """Where the good object's (first) share is: the annotations its pods take, the
    container that gets the GPU (None: no pod template) and the GPUs it asked for."""

    annotations: PodPath
    container: PodPath | None
    count: int


@dataclass(frozen=True)
class Case:
    """A kind's good object (``build(crds, name)``), where it came from, and how it is
    spoiled: ``fraction`` (gpu-fraction "1.5") or ``gpu-limit`` (nvidia.com/gpu back beside
    the annotation)."""

    build: Callable[[OperatorCrds, str], tuple[dict[str, Any], Mark]]
    source: str
    spoil: str = "fraction"


def sample(crds: OperatorCrds, project: str, path: str, kind: str, name: str) -> dict[str, Any]:
    """The first `kind` of a published sample, named `name` (its namespace dropped)."""
    documents = yaml.safe_load_all(crds.sample(project, path).read_text())
    document = next(doc for doc in documents if doc and doc["kind"] == kind)
    metadata = {
        k: v for k, v in document["metadata"].items() if k not in ("namespace", "generateName")
    }
    document["metadata"] = {**metadata, "name": name}
    return dict(document)


def adopted(project: str, path: str, kind: str, *, as_kind: str = "") -> Callable[..., Any]:
    """A published GPU sample adopted (tests/operator_adoption.py); the first share marked."""

    def build(crds: OperatorCrds, name: str) -> tuple[dict[str, Any], Mark]:
        document = sample(crds, project, path, kind, name)
        if as_kind:
            document["kind"] = as_kind
        gpus = adopt(document)
        assert gpus, f"{project}/{path} asks for no {GPU}"
        return document, Mark(gpus[0].annotations, gpus[0].container, gpus[0].count)

    return build


def shared(project: str, path: str, kind: str, template: PodPath) -> Callable[..., Any]:
    """A published sample asking for no GPU, its template given half a GPU."""

    def build(crds: OperatorCrds, name: str) -> tuple[dict[str, Any], Mark]:
        document = sample(crds, project, path, kind, name)
        gpu = share(document, template)
        return document, Mark(gpu.annotations, gpu.container, gpu.count)

    return build


def trainjob(crds: OperatorCrds, name: str) -> tuple[dict[str, Any], Mark]:
    """The TrainJob of Trainer's CONTRIBUTING.md (as tests/e2e/test_operator_crds.py), the
    annotation on its own metadata, where a user coming from Pods would put it."""
    document = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "annotations": {"gpu-fraction": "0.5"}},
        "spec": {
            "runtimeRef": {
                "name": "torch-distributed",
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
            },
            "trainer": {"numNodes": 2},
        },
    }
    return document, Mark(("metadata", "annotations"), None, 1)


def notebook(crds: OperatorCrds, name: str) -> tuple[dict[str, Any], Mark]:
    """A Notebook as the Jupyter web app makes one with a GPU (facts §6: container named
    after the notebook, the limit on containers[0]), adopted."""
    document = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": name,
                            "image": "kubeflownotebookswg/jupyter-pytorch-cuda-full:v1.10.0",
                            "resources": {"limits": {GPU: "1"}},
                        }
                    ]
                }
            }
        },
    }
    (gpu,) = adopt(document)
    return document, Mark(gpu.annotations, gpu.container, gpu.count)


KR, TO, TR = "kuberay", "training-operator", "trainer"
LLAMA = "manifests/base/runtimes/torchtune/llama3_2/llama3_2_1B.yaml"
QWEN = "docs/samples/llmisvc/single-node-gpu/llm-inference-service-qwen2-7b-gpu.yaml"
ARGO_TEMPLATE = ("spec", "templates", 0)
CASES: dict[str, Case] = {
    "RayCluster": Case(
        adopted(KR, "config/samples/ray-cluster.verl.yaml", "RayCluster"),
        "kuberay v1.5.0 config/samples/ray-cluster.verl.yaml, adopted",
    ),
    "RayJob": Case(
        adopted(KR, "config/samples/ray-job.batch-inference.yaml", "RayJob"),
        "kuberay v1.5.0 config/samples/ray-job.batch-inference.yaml, adopted",
    ),
    "RayService": Case(
        adopted(KR, "config/samples/ray-service.stable-diffusion.yaml", "RayService"),
        "kuberay v1.5.0 config/samples/ray-service.stable-diffusion.yaml, adopted",
        "gpu-limit",
    ),
    "PyTorchJob": Case(
        adopted(TO, "examples/pytorch/mnist/v1/pytorch_job_mnist_nccl.yaml", "PyTorchJob"),
        "training-operator v1.8.1 examples/pytorch/mnist/v1/pytorch_job_mnist_nccl.yaml, adopted",
        "gpu-limit",
    ),
    "TFJob": Case(
        adopted(
            TO,
            "examples/tensorflow/distribution_strategy/keras-API/multi_worker_tfjob.yaml",
            "TFJob",
        ),
        "training-operator v1.8.1 examples/tensorflow/.../multi_worker_tfjob.yaml, adopted",
        "gpu-limit",
    ),
    "MPIJob": Case(
        shared(
            TO,
            "examples/mpi/tensorflow-mnist.yaml",
            "MPIJob",
            ("spec", "mpiReplicaSpecs", "Worker", "template"),
        ),
        "training-operator v1.8.1 examples/mpi/tensorflow-mnist.yaml (no GPU), Worker shared",
    ),
    "XGBoostJob": Case(
        shared(
            TO,
            "examples/xgboost/xgboostjob.yaml",
            "XGBoostJob",
            ("spec", "xgbReplicaSpecs", "Worker", "template"),
        ),
        "training-operator v1.8.1 examples/xgboost/xgboostjob.yaml (no GPU), Worker shared",
    ),
    "PaddleJob": Case(
        adopted(TO, "examples/paddlepaddle/simple-gpu.yaml", "PaddleJob"),
        "training-operator v1.8.1 examples/paddlepaddle/simple-gpu.yaml, adopted",
    ),
    "MXJob": Case(
        adopted(TO, "examples/mxnet/mxjob_dist_v1.yaml", "MXJob"),
        "training-operator v1.8.1 examples/mxnet/mxjob_dist_v1.yaml, adopted",
        "gpu-limit",
    ),
    "TrainingRuntime": Case(
        adopted(TR, LLAMA, "ClusterTrainingRuntime", as_kind="TrainingRuntime"),
        f"trainer v2.0.0 {LLAMA} (a ClusterTrainingRuntime; same spec), adopted",
    ),
    "ClusterTrainingRuntime": Case(
        adopted(TR, LLAMA, "ClusterTrainingRuntime"), f"trainer v2.0.0 {LLAMA}, adopted"
    ),
    "TrainJob": Case(trainjob, "hand-written: Trainer CONTRIBUTING.md's TrainJob"),
    "Notebook": Case(notebook, "hand-written: the Jupyter web app's GPU notebook", "gpu-limit"),
    "LeaderWorkerSet": Case(
        adopted("lws", "docs/examples/sglang/lws.yaml", "LeaderWorkerSet"),
        "lws v0.7.0 docs/examples/sglang/lws.yaml, adopted",
        "gpu-limit",
    ),
    "JobSet": Case(
        shared(
            "jobset",
            "site/static/examples/pytorch/cnn-mnist/mnist.yaml",
            "JobSet",
            ("spec", "replicatedJobs", 0, "template", "spec", "template"),
        ),
        "jobset v0.8.2 site/static/examples/pytorch/cnn-mnist/mnist.yaml (no GPU), shared",
    ),
    "InferenceService": Case(
        adopted("kserve", "docs/samples/storage/hf/hf_isvc.yaml", "InferenceService"),
        "kserve v0.16.0 docs/samples/storage/hf/hf_isvc.yaml, adopted",
        "gpu-limit",
    ),
    "LLMInferenceService": Case(
        adopted("kserve", QWEN, "LLMInferenceService"), f"kserve v0.16.0 {QWEN}, adopted"
    ),
    "Workflow": Case(
        shared("argo-workflows", "examples/hello-world.yaml", "Workflow", ARGO_TEMPLATE),
        "argo-workflows v4.0.5 examples/hello-world.yaml (no GPU), shared",
    ),
    "WorkflowTemplate": Case(
        shared(
            "argo-workflows",
            "examples/workflow-template/templates.yaml",
            "WorkflowTemplate",
            ARGO_TEMPLATE,
        ),
        "argo-workflows v4.0.5 examples/workflow-template/templates.yaml (no GPU), shared",
    ),
    "ClusterWorkflowTemplate": Case(
        shared(
            "argo-workflows",
            "examples/cluster-workflow-template/clustertemplates.yaml",
            "ClusterWorkflowTemplate",
            ARGO_TEMPLATE,
        ),
        "argo-workflows v4.0.5 examples/cluster-workflow-template/clustertemplates.yaml, shared",
    ),
    "CronWorkflow": Case(
        shared(
            "argo-workflows",
            "examples/cron-workflow.yaml",
            "CronWorkflow",
            ("spec", "workflowSpec", "templates", 0),
        ),
        "argo-workflows v4.0.5 examples/cron-workflow.yaml (no GPU), shared",
    ),
}


def spoiled(document: Mapping[str, Any], mark: Mark, how: str) -> dict[str, Any]:
    """The bad object: gpu-fraction "1.5", or nvidia.com/gpu back beside the annotation."""
    bad = copy.deepcopy(dict(document))
    if how == "fraction":
        annotate(bad, mark.annotations, "1.5")
    else:
        assert mark.container is not None
        container = value_at(bad, mark.container)
        limits = container.setdefault("resources", {}).setdefault("limits", {})
        limits[GPU] = str(mark.count)
    return bad


# -- the apiserver ------------------------------------------------------------------------


@dataclass(frozen=True)
class Api:
    """How the plane serves each operator kind: resource, scope (from API discovery)."""

    api: k8s.ApiClient
    resources: dict[tuple[str, str], tuple[str, bool]]

    def path(self, document: Mapping[str, Any], namespace: str) -> str:
        version = document["apiVersion"]
        resource, namespaced = self.resources[(version, document["kind"])]
        if namespaced:
            return f"/apis/{version}/namespaces/{namespace}/{resource}"
        return f"/apis/{version}/{resource}"

    def namespaced(self, document: Mapping[str, Any]) -> bool:
        return self.resources[(document["apiVersion"], document["kind"])][1]

    def create(
        self, document: Mapping[str, Any], namespace: str, *, dry_run: bool = False
    ) -> Admitted:
        """POST the object as raw JSON under Strict field validation (a field the CRD does
        not know fails, rather than being pruned with a warning): body and Warning headers."""
        query = [("fieldValidation", "Strict")] + ([("dryRun", "All")] if dry_run else [])
        method, url, headers, body, post = self.api.param_serialize(
            "POST",
            self.path(document, namespace),
            query_params=query,
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=dict(document),
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(method, url, headers, body, post)
        data: bytes = response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return Admitted(json.loads(data), parse_warnings(response.headers.getlist("Warning")))


@pytest.fixture(scope="module")
def api(operator_plane: OperatorPlane) -> Api:
    """Discovery of every group/version the operator kinds' documents use."""
    client = operator_plane.plane.api
    resources: dict[tuple[str, str], tuple[str, bool]] = {}
    versions = {f"{k.group}/{v}" for k in builtin_kinds() for v in k.versions}
    served = {
        f"{g['name']}/{v['version']}"
        for g in get_json(client, "/apis")["groups"]
        for v in g["versions"]
    }
    for version in sorted(versions & served):
        for item in get_json(client, f"/apis/{version}")["resources"]:
            if "/" not in item["name"]:
                resources[(version, item["kind"])] = (item["name"], item["namespaced"])
    return Api(client, resources)


def get_json(client: k8s.ApiClient, path: str) -> Any:
    method, url, headers, body, post = client.param_serialize(
        "GET", path, header_params={"Accept": "application/json"}, auth_settings=["BearerToken"]
    )
    response = client.call_api(method, url, headers, body, post)
    return json.loads(response.read())  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def webhook(operator_plane: OperatorPlane, webhook_server: WebhookServer) -> GpushareWebhook:
    """gpushare registered on this module's plane as `gpushare webhook-config` prints it
    (the session's server); the registration goes with the plane at the module's end."""
    client = operator_plane.plane.api
    ensure_namespace(k8s.CoreV1Api(client), PROBE_NAMESPACE)
    registered = GpushareWebhook(webhook_server, client, PROBE_NAMESPACE)
    registered.register()
    return registered


@pytest.fixture(scope="module")
def policies(webhook: GpushareWebhook) -> PolicySet:
    return load_policies(webhook.policies)


@pytest.fixture
def namespace(operator_plane: OperatorPlane) -> str:
    """A fresh namespace on this module's plane (the plane goes at the module's end)."""
    name = unique_name("opk")
    core = k8s.CoreV1Api(operator_plane.plane.api)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    return name


def validating_webhook(webhook: GpushareWebhook, group: str, resource: str) -> str:
    """The name of the registration's validating webhook whose rules match the resource."""
    (configuration,) = [
        d for d in webhook.documents if d["kind"] == "ValidatingWebhookConfiguration"
    ]
    names = [
        str(hook["name"])
        for hook in configuration["webhooks"]
        for rule in hook["rules"]
        if group in rule["apiGroups"] and resource in rule["resources"]
    ]
    assert len(names) == 1, (group, resource, names)
    return names[0]


def verdict_of(
    document: Mapping[str, Any], namespace: str, api: Api, policies: PolicySet
) -> WorkloadVerdict:
    """`check_workload` for the object as the webhook gets it (a cluster-scoped object's pods
    are read in the namespace default, as the webhook does)."""
    group = document["apiVersion"].rpartition("/")[0]
    kind = workload_kind(group, document["kind"], policies)
    assert kind is not None, document["kind"]
    where = namespace if api.namespaced(document) else "default"
    verdict = check_workload(document, kind, where, policies)
    assert verdict is not None
    return verdict


def as_received(stored: Mapping[str, Any], name: str, namespace: str) -> dict[str, Any]:
    """An object the apiserver returned, as the user's: the server's metadata dropped."""
    received = {k: v for k, v in stored.items() if k != "status"}
    metadata = {k: v for k, v in stored["metadata"].items() if k in ("labels", "annotations")}
    received["metadata"] = {**metadata, "name": name, "namespace": namespace}
    return received


def build(kind: str, operator_plane: OperatorPlane) -> tuple[dict[str, Any], Mark]:
    document, mark = CASES[kind].build(operator_plane.crds, unique_name(kind.lower()))
    assert document["kind"] == kind
    return document, mark


# -- the table, the CRDs and the registration agree ----------------------------------------


def test_every_kind_of_the_table_is_served_here_but_jaxjob(
    operator_plane: OperatorPlane, api: Api
) -> None:
    """The kinds this module creates are gpushare's operator kinds, each served by the
    plane in every version gpushare reads; JAXJob, in the table, has no CRD in the pinned
    training-operator (v1.8.1) and is tested offline instead."""
    operators = [k for k in builtin_kinds() if k.group not in KUBERNETES_GROUPS]
    assert sorted(k.kind for k in operators) == sorted([*KINDS, *NO_CRD])
    for kind in operators:
        crd = f"{kind.resource}.{kind.group}"
        if kind.kind in NO_CRD:
            assert crd not in operator_plane.crd_names, NO_CRD[kind.kind]
            continue
        assert crd in operator_plane.crd_names
        for version in kind.api_versions:
            if (version, kind.kind) not in api.resources:
                # A version gpushare reads that this pin does not serve: say which.
                assert (kind.kind, version) in NOT_SERVED, (kind.kind, version)
                continue
            resource, namespaced = api.resources[(version, kind.kind)]
            assert (resource, namespaced) == (kind.resource, not kind.cluster_scoped)


def test_the_registration_has_a_validating_webhook_for_every_kind(
    webhook: GpushareWebhook,
) -> None:
    """`gpushare webhook-config` (registration.py applies what it prints) matches each kind,
    in every version and the right scope."""
    (configuration,) = [
        d for d in webhook.documents if d["kind"] == "ValidatingWebhookConfiguration"
    ]
    for kind in builtin_kinds():
        if kind.group in KUBERNETES_GROUPS:
            continue
        name = validating_webhook(webhook, kind.group, kind.resource)
        hook = next(h for h in configuration["webhooks"] if h["name"] == name)
        (rule,) = [r for r in hook["rules"] if kind.resource in r["resources"]]
        assert rule["apiGroups"] == [kind.group]
        assert set(rule["apiVersions"]) == set(kind.versions)
        assert set(rule["operations"]) >= {"CREATE", "UPDATE"}
        assert rule["scope"] == ("Cluster" if kind.cluster_scoped else "Namespaced")
        assert hook["sideEffects"] == "None"


# -- (a) good: admitted as written, warned as check_workload says ---------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_good_object_is_admitted_with_the_warnings_check_workload_gives(
    kind: str,
    operator_plane: OperatorPlane,
    api: Api,
    webhook: GpushareWebhook,
    policies: PolicySet,
    namespace: str,
) -> None:
    document, _ = build(kind, operator_plane)
    before = webhook.server.admission_counts()

    created = api.create(document, namespace)

    stored = created.pod
    verdict = verdict_of(stored, namespace, api, policies)
    assert verdict.allowed
    assert created.warnings == clean_warnings(verdict.warnings), CASES[kind].source
    if kind != "TrainJob":
        assert any("each pod will get" in w for w in created.warnings), created.warnings
    # Stored as written: the annotation kept, the template never patched.
    assert request_annotations(stored) == request_annotations(document) >= 1
    assert APPLIED not in json.dumps(stored) and "gpu.shared" not in json.dumps(stored)
    assert webhook.server.admission_counts().minus(before) == {("validate", "allowed"): 1.0}


# -- (b) bad: refused with check_workload's reasons -----------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_object_is_refused_with_the_reasons_check_workload_gives(
    kind: str,
    operator_plane: OperatorPlane,
    api: Api,
    webhook: GpushareWebhook,
    policies: PolicySet,
    namespace: str,
) -> None:
    case = CASES[kind]
    document, mark = build(kind, operator_plane)
    # The bad object as the webhook gets it: the good one as the apiserver decoded and
    # defaulted it (a dry run), spoiled the same way (annotations and limits are neither
    # defaulted nor pruned).
    good = api.create(document, namespace, dry_run=True).pod
    name = unique_name(kind.lower())
    bad = spoiled(
        {**document, "metadata": {**document["metadata"], "name": name}}, mark, case.spoil
    )
    received = spoiled(as_received(good, name, namespace), mark, case.spoil)
    verdict = verdict_of(received, namespace, api, policies)
    before = webhook.server.admission_counts()

    if kind == "TrainJob":  # no pod template: the annotation does nothing and is said to
        created = api.create(bad, namespace)
        assert verdict.allowed and verdict.templates == ()
        assert created.warnings == clean_warnings(verdict.warnings)
        assert webhook.server.admission_counts().minus(before) == {("validate", "allowed"): 1.0}
        return
    with pytest.raises(ApiException) as caught:
        api.create(bad, namespace)

    assert not verdict.allowed and len(verdict.denied) == 1
    group = document["apiVersion"].rpartition("/")[0]
    resource = api.resources[(document["apiVersion"], kind)][0]
    hook = validating_webhook(webhook, group, resource)
    assert status_message(caught.value) == (
        f'admission webhook "{hook}" denied the request: ' + " ".join(verdict.admission_reasons)
    )
    assert caught.value.status == verdict.code
    assert webhook.server.admission_counts().minus(before) == {("validate", "denied"): 1.0}


# -- (c) the bad template's pod: refused by the mutating webhook ----------------------------


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "TrainJob"])
def test_the_pod_of_a_bad_template_is_refused_with_the_same_reasons(
    kind: str,
    operator_plane: OperatorPlane,
    webhook: GpushareWebhook,
    api: Api,
    policies: PolicySet,
    namespace: str,
) -> None:
    document, mark = build(kind, operator_plane)
    bad = spoiled(document, mark, CASES[kind].spoil)
    verdict = verdict_of(bad, namespace, api, policies)
    (template,) = verdict.denied
    pod = template_pod(bad, template.kind, template.at, namespace)
    assert pod is not None
    before = webhook.server.admission_counts()

    with pytest.raises(ApiException) as caught:
        create_pod(webhook.api, namespace, pod, dry_run=True)

    core = " ".join(template.reasons)
    assert status_message(caught.value) == (
        f'admission webhook "{MUTATING_WEBHOOK}" denied the request: {core}'
    )
    assert caught.value.status == template.code
    # The workload's reasons are the pod's after the prefix naming the template.
    assert verdict.admission_reasons == (template.denial_prefix, *template.reasons)
    assert webhook.server.admission_counts().minus(before) == {("mutate", "denied"): 1.0}


def test_a_trainjob_has_no_pod_template_to_refuse(
    operator_plane: OperatorPlane, api: Api, policies: PolicySet
) -> None:
    """(c) for TrainJob: it makes no pod of its own (facts §5: its pods are its runtime's
    templates, with the TrainJob's overrides), so there is no pod to create; gpushare reads
    none and says where the annotation must go."""
    document, mark = build("TrainJob", operator_plane)
    verdict = verdict_of(spoiled(document, mark, "fraction"), "default", api, policies)
    assert verdict.allowed and verdict.templates == ()
    assert any("runtime's pod templates" in w for w in verdict.warnings), verdict.warnings


# -- LLMInferenceService: where its pods take annotations from ------------------------------


def test_the_condition_for_llminferenceservices_reads_where_their_pods_take_annotations(
    webhook: GpushareWebhook,
) -> None:
    """Its validating webhook is sent an LLMInferenceService whose workload annotations
    (spec, spec.prefill) carry the request: where its pods take them from (facts §10)."""
    (configuration,) = [
        d for d in webhook.documents if d["kind"] == "ValidatingWebhookConfiguration"
    ]
    name = validating_webhook(webhook, "serving.kserve.io", "llminferenceservices")
    hook = next(h for h in configuration["webhooks"] if h["name"] == name)
    conditions = " ".join(c["expression"] for c in hook.get("matchConditions", ()))
    assert "object.spec.annotations" in conditions
    assert "object.spec.prefill.annotations" in conditions


def test_an_llminferenceservice_annotated_on_its_metadata_is_warned(
    operator_plane: OperatorPlane,
    api: Api,
    webhook: GpushareWebhook,
    policies: PolicySet,
    namespace: str,
) -> None:
    """An annotation on the object's own metadata does not reach the pods (facts §10):
    admitted, with check_workload's warning saying where it goes."""
    document, _ = build("LLMInferenceService", operator_plane)
    document["spec"].pop("annotations")
    document["metadata"]["annotations"] = {"gpu-fraction": "0.5"}

    created = api.create(document, namespace)

    verdict = verdict_of(created.pod, namespace, api, policies)
    assert created.warnings == clean_warnings(verdict.warnings)
    assert created.warnings[0].startswith(
        "gpu-fraction on the LLMInferenceService itself does nothing"
    )


def test_the_metadata_warning_of_an_llminferenceservice_names_its_workload_annotations() -> None:
    """Offline: the warning for gpu-fraction on an LLMInferenceService's own metadata says
    where its pods do take it from (facts §10: the workload's `annotations`)."""
    policies = load_policies(REPO / "policies")
    kind = workload_kind("serving.kserve.io", "LLMInferenceService", policies)
    assert kind is not None
    document = {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "LLMInferenceService",
        "metadata": {"name": "llm", "annotations": {"gpu-fraction": "0.5"}},
        "spec": {"template": {"containers": [{"name": "main", "image": "busybox"}]}},
    }
    verdict = check_workload(document, kind, "team", policies)
    assert verdict is not None
    (warning,) = verdict.warnings
    assert "spec.annotations" in warning, warning


# -- JAXJob: no CRD here, so offline only ---------------------------------------------------


def jaxjob(fraction: str) -> dict[str, Any]:
    """A JAXJob as training-operator documents it after v1.8.1 (facts §4, TO-J: replica type
    Worker, default container jax, spec.jaxReplicaSpecs[*].template)."""
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "JAXJob",
        "metadata": {"name": "jax-simple", "namespace": "team"},
        "spec": {
            "jaxReplicaSpecs": {
                "Worker": {
                    "replicas": 2,
                    "restartPolicy": "OnFailure",
                    "template": {
                        "metadata": {"annotations": {"gpu-fraction": fraction}},
                        "spec": {
                            "containers": [
                                {
                                    "name": "jax",
                                    "image": "docker.io/kubeflow/jaxjob-simple:latest",
                                    "command": ["python3", "train.py"],
                                }
                            ]
                        },
                    },
                }
            }
        },
    }


def test_a_jaxjob_offline() -> None:
    """JAXJob is in gpushare's table but has no CRD in the pinned training-operator
    (v1.8.1): a good one gives the GPU to its `jax` container, a bad one is refused, and
    the pod of the bad template gets the same core reasons, through the core alone."""
    policies = load_policies(REPO / "policies")
    kind = workload_kind("kubeflow.org", "JAXJob", policies)
    assert kind is not None
    good = check_workload(jaxjob("0.5"), kind, "team", policies)
    assert good is not None and good.allowed
    assert good.warnings[0].startswith("Worker replicas: each pod will get nvidia.com/gpu.shared")
    assert 'in container "jax"' in good.warnings[0]
    bad_document = jaxjob("1.5")
    bad = check_workload(bad_document, kind, "team", policies)
    assert bad is not None and not bad.allowed
    (template,) = bad.denied
    pod = template_pod(bad_document, kind, template.at, "team")
    assert pod is not None
    as_pod = mutate(pod, "team", policies)
    assert not as_pod.allowed
    assert as_pod.reasons == template.reasons
    assert bad.admission_reasons == (
        "pod template of JAXJob 'jax-simple' (Worker replicas):",
        *as_pod.reasons,
    )
