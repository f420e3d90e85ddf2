"""gpushare's webhook behind a real kube-apiserver: what a client really gets back.

`gpushare serve` runs as a subprocess (gunicorn over TLS, certificates from `gpushare certs`)
and is registered with exactly what `gpushare webhook-config` prints (fixtures in
conftest.py). Every pod here goes through the apiserver's whole admission chain: decoding
and defaulting, our mutating webhook (JSON Patch applied by the apiserver), re-validation of
the patched pod, our safety-net policy, and storage in etcd. The expectation is always the
offline `gpushare mutate` of the same pod with the same policies, never a hand-written copy.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from conftest import REPO, unique_name
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pods import annotated_pod, plain_pod
from prediction import Prediction, as_admitted, predict, webhook_input

from harness.api import as_json, create_pod, ensure_namespace, status_message
from harness.controlplane import ControlPlane
from harness.registration import (
    MUTATING_WEBHOOK,
    SAFETY_NET_DENIAL,
    SHARED_RESOURCE,
    GpushareWebhook,
    excluded_namespaces,
)
from webhook.constants import (
    APPLIED_ANNOTATION,
    FRACTION_ANNOTATION,
    REQUEST_ANNOTATIONS,
)

CORPUS = REPO / "tests/corpus"
CORPUS_CASES = sorted(p.name for p in CORPUS.iterdir() if (p / "pod.yaml").is_file())


def corpus_case(name: str) -> tuple[dict[str, Any], str]:
    """A corpus pod and the namespace it is admitted in (README of tests/corpus)."""
    folder = CORPUS / name
    pod: dict[str, Any] = yaml.safe_load((folder / "pod.yaml").read_text())
    namespace_file = folder / "namespace"
    if namespace_file.is_file():
        namespace = namespace_file.read_text().strip()
    else:
        namespace = pod.get("metadata", {}).get("namespace") or "default"
    pod["metadata"]["namespace"] = namespace
    return pod, namespace


def comparable_spec(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's spec with tolerations in a canonical order.

    The DefaultTolerationSeconds admission plugin runs before webhooks and appends the
    not-ready/unreachable tolerations, so the webhook appends ours after them; on the
    normalized prediction the order is the other way round. Tolerations are a set to the
    scheduler, so only their order is let go of.
    """
    spec: dict[str, Any] = copy.deepcopy(pod["spec"])
    if "tolerations" in spec:
        spec["tolerations"] = sorted(
            spec["tolerations"], key=lambda t: json.dumps(t, sort_keys=True)
        )
    return spec


def relevant(pod: dict[str, Any]) -> dict[str, Any]:
    """The fields gpushare may change, laid out so that a failure diff reads well."""
    spec = comparable_spec(pod)
    metadata = pod["metadata"]
    return {
        "applied": (metadata.get("annotations") or {}).get(APPLIED_ANNOTATION),
        "labels": metadata.get("labels"),
        "annotations": metadata.get("annotations"),
        "nodeSelector": spec.get("nodeSelector"),
        "tolerations": spec.get("tolerations"),
        "hostIPC": spec.get("hostIPC"),
        "volumes": spec.get("volumes"),
        "containers": {
            c["name"]: {
                "resources": c.get("resources"),
                "env": c.get("env"),
                "volumeMounts": c.get("volumeMounts"),
            }
            for c in [*spec.get("initContainers", []), *spec["containers"]]
        },
    }


def denial_message(reasons: tuple[str, ...], webhook: str = MUTATING_WEBHOOK) -> str:
    """What the apiserver says when a webhook answers allowed: false with these reasons."""
    return f'admission webhook "{webhook}" denied the request: {" ".join(reasons)}'


def delete_pod(core_v1: k8s.CoreV1Api, namespace: str, name: str) -> None:
    try:
        core_v1.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture
def created_pods(core_v1: k8s.CoreV1Api) -> Iterator[list[tuple[str, str]]]:
    """(namespace, name) of pods a test creates outside its own namespace; deleted after."""
    created: list[tuple[str, str]] = []
    try:
        yield created
    finally:
        for namespace, name in created:
            delete_pod(core_v1, namespace, name)


def assert_admitted_as_predicted(
    api: k8s.ApiClient, prediction: Prediction, admitted: dict[str, Any]
) -> None:
    """The stored pod equals the prediction after the apiserver's defaulting, field for field."""
    assert prediction.pod is not None, f"predicted a denial: {prediction.denied}"
    expected = as_admitted(api, prediction.pod)
    assert relevant(admitted) == relevant(expected)
    assert admitted["spec"] == expected["spec"]
    assert admitted["metadata"].get("labels") == expected["metadata"].get("labels")
    assert admitted["metadata"].get("annotations") == expected["metadata"].get("annotations")


def reaches_webhook(webhook: GpushareWebhook, namespace: str, pod: dict[str, Any]) -> bool:
    """Whether the registration sends this pod to the mutating webhook at all."""
    annotations = pod["metadata"].get("annotations") or {}
    return namespace not in excluded_namespaces(webhook.documents) and any(
        key in annotations for key in REQUEST_ANNOTATIONS
    )


# -- every corpus pod, through the real apiserver ----------------------------------------


@pytest.mark.parametrize("case", CORPUS_CASES)
def test_corpus_pod_is_admitted_exactly_as_gpushare_mutate_predicts(
    case: str,
    gpushare_webhook: GpushareWebhook,
    core_v1: k8s.CoreV1Api,
    created_pods: list[tuple[str, str]],
) -> None:
    """Each realistic corpus pod is created for real; the stored pod is the prediction.

    The prediction is `gpushare mutate` (same policies) of the pod the webhook receives,
    i.e. after the apiserver's defaulting, and then defaulted again: so spec, labels and
    annotations must be equal, not merely similar. Covers time-slicing (bundled default),
    mps (ml-*), mps-daemon (inference), a team policy, whole GPUs, native sidecars, envFrom,
    already-mutated and untouched pods, kube-system, and every denial (with our exact
    message). The apiserver's validation of the patched pod (extended resources: integers,
    requests == limits), the safety-net policy on the result (no drift) and storage in
    etcd are part of the check. Warnings are those the offline command prints, except where
    the registration keeps the webhook away (excluded namespaces, no annotation): there
    the apiserver never asks, so there are none.
    """
    pod, namespace = corpus_case(case)
    ensure_namespace(core_v1, namespace)
    api = gpushare_webhook.api
    prediction = predict(webhook_input(api, pod), gpushare_webhook.policies, namespace)

    if prediction.pod is None:
        with pytest.raises(ApiException) as caught:
            create_pod(api, namespace, pod)
        assert status_message(caught.value) == denial_message(prediction.denied)
        assert caught.value.status in (403, 422)
        return

    admitted = create_pod(api, namespace, pod)
    name = admitted.pod["metadata"]["name"]
    created_pods.append((namespace, name))

    assert_admitted_as_predicted(api, prediction, admitted.pod)
    # What etcd holds, not only what the create call answered.
    assert (
        as_json(api, core_v1.read_namespaced_pod(name, namespace))["spec"] == (admitted.pod["spec"])
    )
    expected_warnings = (
        list(prediction.warnings) if reaches_webhook(gpushare_webhook, namespace, pod) else []
    )
    assert admitted.warnings == expected_warnings


@pytest.mark.parametrize("case", CORPUS_CASES)
def test_gpushare_mutate_of_the_manifest_predicts_what_the_apiserver_stores(
    case: str,
    gpushare_webhook: GpushareWebhook,
    core_v1: k8s.CoreV1Api,
    created_pods: list[tuple[str, str]],
) -> None:
    """What a user sees running `gpushare mutate -f pod.yaml` is what the cluster stores.

    Here the prediction is made from the manifest as written, as a user would. The fields
    gpushare owns must match; tolerations are compared as a set, since the webhook appends
    ours after the ones DefaultTolerationSeconds added, which the offline command cannot
    know about.
    """
    pod, namespace = corpus_case(case)
    ensure_namespace(core_v1, namespace)
    api = gpushare_webhook.api
    prediction = predict(pod, gpushare_webhook.policies, namespace)

    if prediction.pod is None:
        with pytest.raises(ApiException) as caught:
            create_pod(api, namespace, pod)
        assert status_message(caught.value) == denial_message(prediction.denied)
        return

    admitted = create_pod(api, namespace, pod)
    created_pods.append((namespace, admitted.pod["metadata"]["name"]))
    expected = as_admitted(api, prediction.pod)
    assert relevant(admitted.pod) == relevant(expected)
    assert comparable_spec(admitted.pod) == comparable_spec(expected)


# -- controllers' pods ------------------------------------------------------------------


def training_template(fraction: str) -> dict[str, Any]:
    """A PyTorch training pod template asking for a share of a GPU."""
    return {
        "metadata": {
            "labels": {"app": "trainer"},
            "annotations": {FRACTION_ANNOTATION: fraction},
        },
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
                    "command": ["python", "/app/train.py"],
                    "env": [{"name": "EPOCHS", "value": "10"}],
                    "resources": {
                        "requests": {"cpu": "2", "memory": "8Gi"},
                        "limits": {"memory": "8Gi"},
                    },
                }
            ]
        },
    }


def test_pods_of_a_deployment_are_mutated(
    gpushare_webhook: GpushareWebhook, core_v1: k8s.CoreV1Api, namespace: str
) -> None:
    """A Deployment's pod, created the way the ReplicaSet controller creates it, is mutated.

    What is real and what is not: no kube-controller-manager runs here, so neither the
    Deployment nor the ReplicaSet controller creates anything. The test stores a real
    Deployment (admitted as written: the webhooks match pods only, so its template keeps
    just the annotation), then does what the two controllers would: a ReplicaSet from the
    Deployment's stored template with the pod-template-hash label and a controller owner
    reference, and a pod from the ReplicaSet's template with `generateName` and a
    controller owner reference (controller.GetPodFromTemplate). That pod request goes
    through the real admission chain; only the client identity differs (admin instead of
    system:serviceaccount:kube-system:replicaset-controller), which the registration does
    not select on. The prediction here is made by the `gpushare` command in a subprocess.
    """
    api = gpushare_webhook.api
    apps = k8s.AppsV1Api(api)
    name = unique_name("trainer")
    selector = {"app": "trainer"}
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": training_template("0.25"),
        },
    }
    # The generated methods take plain dicts too (their annotations name only the models).
    stored = as_json(api, apps.create_namespaced_deployment(namespace, deployment))  # type: ignore[arg-type]
    template = stored["spec"]["template"]
    assert APPLIED_ANNOTATION not in template["metadata"]["annotations"]
    assert SHARED_RESOURCE not in json.dumps(template)

    pod_template_hash = "5d8f7c9b6d"
    labels = {**selector, "pod-template-hash": pod_template_hash}
    replica_set_body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": f"{name}-{pod_template_hash}",
            "labels": labels,
            "ownerReferences": [owner_reference(stored, "apps/v1", "Deployment")],
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    **template["metadata"],
                    "labels": {**template["metadata"]["labels"], **labels},
                },
                "spec": template["spec"],
            },
        },
    }
    replica_set = as_json(
        api,
        apps.create_namespaced_replica_set(namespace, replica_set_body),  # type: ignore[arg-type]
    )
    rs_template = replica_set["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{replica_set['metadata']['name']}-",
            "namespace": namespace,
            "labels": rs_template["metadata"]["labels"],
            "annotations": rs_template["metadata"]["annotations"],
            "ownerReferences": [owner_reference(replica_set, "apps/v1", "ReplicaSet")],
        },
        "spec": rs_template["spec"],
    }
    prediction = predict(
        webhook_input(api, pod), gpushare_webhook.policies, namespace, in_process=False
    )

    dry_run = create_pod(api, namespace, pod, dry_run=True)
    admitted = create_pod(api, namespace, pod)

    assert_admitted_as_predicted(api, prediction, admitted.pod)
    assert_admitted_as_predicted(api, prediction, dry_run.pod)
    applied = json.loads(admitted.pod["metadata"]["annotations"][APPLIED_ANNOTATION])
    assert applied["fraction"] == "0.25"
    assert admitted.pod["metadata"]["name"].startswith(pod["metadata"]["generateName"])
    assert admitted.pod["metadata"]["ownerReferences"] == pod["metadata"]["ownerReferences"]
    # The webhook logged it under the generateName prefix (the pod has no name yet).
    decisions = [
        entry["decision"]
        for entry in gpushare_webhook.server.admissions(namespace, pod["metadata"]["generateName"])
        if entry["endpoint"] == "mutate"
    ]
    assert decisions == ["patched", "patched"]  # the dry run, then the real create


def owner_reference(owner: dict[str, Any], api_version: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


# -- dry run ----------------------------------------------------------------------------


def test_dry_run_gets_the_same_mutation_and_stores_nothing(
    gpushare_webhook: GpushareWebhook, core_v1: k8s.CoreV1Api, namespace: str
) -> None:
    api = gpushare_webhook.api
    pod = annotated_pod("dry-run")

    dry_run = create_pod(api, namespace, pod, dry_run=True)

    with pytest.raises(ApiException) as missing:
        core_v1.read_namespaced_pod("dry-run", namespace)
    assert missing.value.status == 404
    admitted = create_pod(api, namespace, pod)
    assert APPLIED_ANNOTATION in dry_run.pod["metadata"]["annotations"]
    assert dry_run.pod["spec"] == admitted.pod["spec"]
    assert dry_run.pod["metadata"]["annotations"] == admitted.pod["metadata"]["annotations"]
    assert dry_run.warnings == admitted.warnings
    # The webhook was told which call was the dry run (and has no side effects to skip).
    mutations = [
        entry
        for entry in gpushare_webhook.server.admissions(namespace, "dry-run")
        if entry["endpoint"] == "mutate"
    ]
    assert [m.get("dry_run", False) for m in mutations] == [True, False]
    assert [m["decision"] for m in mutations] == ["patched", "patched"]


# -- denials and warnings ---------------------------------------------------------------


@pytest.mark.parametrize("fraction", ["1.5", "abc"])
def test_policy_violation_is_rejected_with_our_message(
    gpushare_webhook: GpushareWebhook,
    control_plane: ControlPlane,
    core_v1: k8s.CoreV1Api,
    namespace: str,
    fraction: str,
) -> None:
    """The client sees the webhook's own sentence, through the Python client and kubectl."""
    api = gpushare_webhook.api
    pod = annotated_pod(unique_name("bad"), fraction)
    prediction = predict(webhook_input(api, pod), gpushare_webhook.policies, namespace)
    assert prediction.denied and f'"{fraction}"' in prediction.denied[0]

    with pytest.raises(ApiException) as caught:
        create_pod(api, namespace, pod)

    status = json.loads(caught.value.body or "{}")
    assert status["message"] == denial_message(prediction.denied)
    # An unusable annotation value is "Invalid" (422), as the apiserver's own field errors.
    assert status["code"] == caught.value.status == 422
    assert status["reason"] == "Invalid"
    result = control_plane.kubectl(
        "create", "--namespace", namespace, "-f", "-", input=json.dumps(pod), check=False
    )
    assert result.returncode != 0
    assert denial_message(prediction.denied) in result.stderr
    assert core_v1.list_namespaced_pod(namespace).items == []


def test_warnings_reach_the_python_client_and_kubectl(
    gpushare_webhook: GpushareWebhook,
    control_plane: ControlPlane,
    core_v1: k8s.CoreV1Api,
    created_pods: list[tuple[str, str]],
) -> None:
    """Under the mps policy a user-set CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is overwritten, and
    the user is told: the apiserver passes our warning on as a `Warning: 299` header, which
    kubectl prints on stderr and the Python client leaves in the raw response headers."""
    namespace = unique_name("ml")  # the example mps policy serves ml-*
    ensure_namespace(core_v1, namespace)
    api = gpushare_webhook.api
    pod = annotated_pod(
        "mps-user-limit",
        "0.25",
        env=[{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"}],
    )
    prediction = predict(webhook_input(api, pod), gpushare_webhook.policies, namespace)
    (warning,) = [w for w in prediction.warnings if "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in w]

    result = control_plane.kubectl(
        "create", "--namespace", namespace, "--dry-run=server", "-o", "json", "-f", "-",
        input=json.dumps(pod),
    )  # fmt: skip
    admitted = create_pod(api, namespace, pod)
    created_pods.append((namespace, "mps-user-limit"))

    assert f"Warning: {warning}" in result.stderr.splitlines()
    assert warning in admitted.warnings
    assert admitted.warnings == list(prediction.warnings)
    (container,) = admitted.pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert json.loads(result.stdout)["spec"] == admitted.pod["spec"]


def test_direct_shared_gpu_request_is_denied_by_the_safety_net(
    gpushare_webhook: GpushareWebhook, core_v1: k8s.CoreV1Api, namespace: str
) -> None:
    """No annotation, but nvidia.com/gpu.shared by hand: the default policy says deny.

    The mutating webhook never sees this pod (its matchConditions want the annotation);
    the safety-net policy does (its matchConditions also match the resource) and refuses
    it inside the apiserver, with the webhook's sentence that says what to do instead.
    """
    shared = {SHARED_RESOURCE: "1"}
    pod = plain_pod("by-hand", resources={"requests": shared, "limits": shared})
    before = gpushare_webhook.server.admission_counts()

    with pytest.raises(ApiException) as caught:
        create_pod(gpushare_webhook.api, namespace, pod)

    message = status_message(caught.value)
    assert message.startswith(f'pods "by-hand" is forbidden: {SAFETY_NET_DENIAL}')
    assert f"asks for {SHARED_RESOURCE} directly" in message
    assert f"annotate the pod with {FRACTION_ANNOTATION}" in message
    assert caught.value.status == 403
    assert gpushare_webhook.server.admission_counts().minus(before) == {}
    assert core_v1.list_namespaced_pod(namespace).items == []


# -- what never reaches the webhook -------------------------------------------------------


def test_pod_without_annotation_never_reaches_the_webhook(
    gpushare_webhook: GpushareWebhook, core_v1: k8s.CoreV1Api, namespace: str
) -> None:
    """matchConditions keep ordinary pods away: the webhook's counters and log stay still.

    The annotated pod created afterwards is the control: the same counters do move.
    """
    server = gpushare_webhook.server
    api = gpushare_webhook.api
    pod = plain_pod("ordinary", resources={"limits": {"cpu": "1", "memory": "1Gi"}})
    reference = as_admitted(api, {**pod, "metadata": {**pod["metadata"], "namespace": namespace}})
    before = server.admission_counts()

    admitted = create_pod(api, namespace, pod)

    assert server.admission_counts().minus(before) == {}
    assert server.admissions(namespace, "ordinary") == []
    assert admitted.pod["spec"] == reference["spec"]
    assert admitted.pod["metadata"]["labels"] == {"app": "plain"}
    assert "annotations" not in admitted.pod["metadata"]
    assert admitted.warnings == []

    create_pod(api, namespace, annotated_pod("control"))
    assert server.admission_counts().minus(before) == {("mutate", "patched"): 1.0}
    assert [e["endpoint"] for e in server.admissions(namespace, "control")] == ["mutate"]


def restricted(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod made to pass the restricted Pod Security Standard, which deploy/ sets on
    gpushare-system (test_deploy.py may have created that namespace already)."""
    pod["spec"]["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    for container in pod["spec"]["containers"]:
        container["securityContext"] = {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
    return pod


@pytest.mark.parametrize("excluded", ["kube-system", "gpushare-system"])
def test_excluded_namespace_is_never_touched(
    gpushare_webhook: GpushareWebhook,
    core_v1: k8s.CoreV1Api,
    created_pods: list[tuple[str, str]],
    excluded: str,
) -> None:
    """kube-system, and the webhook's own namespace, stay out of reach even when annotated.

    The registration's namespaceSelector keeps them from the webhook, so even a pod that
    asks for the shared resource by hand (which the safety-net policy would deny
    elsewhere) is admitted as written, and the webhook never hears of either.
    """
    assert excluded in excluded_namespaces(gpushare_webhook.documents)
    ensure_namespace(core_v1, excluded)
    server = gpushare_webhook.server
    api = gpushare_webhook.api
    annotated = restricted(annotated_pod(unique_name("annotated")))
    shared = {SHARED_RESOURCE: "1"}
    by_hand = restricted(
        plain_pod(unique_name("by-hand"), resources={"requests": shared, "limits": shared})
    )
    before = server.admission_counts()

    for pod in (annotated, by_hand):
        pod["metadata"]["namespace"] = excluded
        reference = as_admitted(api, pod)
        admitted = create_pod(api, excluded, pod)
        created_pods.append((excluded, pod["metadata"]["name"]))
        assert admitted.pod["spec"] == reference["spec"]
        assert admitted.pod["metadata"].get("annotations") == pod["metadata"].get("annotations")
        assert admitted.warnings == []

    assert server.admission_counts().minus(before) == {}
    assert server.admissions(excluded) == []
