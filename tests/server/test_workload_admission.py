"""Workloads at the validating endpoint: pod templates checked where they are written.

Through the WSGI test client with the bundled policies: a Deployment, StatefulSet,
DaemonSet, ReplicaSet, ReplicationController, Job, CronJob or PodTemplate whose template
the pods would be denied for is denied with the pods' reasons; an accepted one is allowed,
never patched, with warnings saying what each pod will get; the mutating endpoint and pods
behave as before.
"""

from __future__ import annotations

import copy
import io
import json
from typing import Any

import pytest
from werkzeug.test import Client

from tests.core.support import controller_pod
from webhook.core import WorkloadKind, builtin_kinds, check_workload, load_policies, mutate
from webhook.policy_store import PolicyStore
from webhook.server.app import create_app
from webhook.server.review import clean_warnings

from .support import BUNDLED_POLICIES, annotated_pod, review

# Kubernetes' own kinds (one template each, at one path).
KUBERNETES_KINDS = tuple(k for k in builtin_kinds() if k.group in {"", "apps", "batch"})

UID = "0a1b2c3d-0000-4000-8000-000000000001"
API_VERSIONS = {"apps": "apps/v1", "batch": "batch/v1", "": "v1"}
KIND_IDS = [k.kind for k in KUBERNETES_KINDS]


def workload(kind: WorkloadKind, fraction: str | None = "0.5") -> dict[str, Any]:
    """A workload of ``kind`` whose template is the server tests' annotated pod."""
    pod = annotated_pod(fraction or "0.5")
    if fraction is None:
        pod["metadata"]["annotations"] = {}
    template: dict[str, Any] = {
        "metadata": {
            "labels": pod["metadata"]["labels"],
            "annotations": pod["metadata"]["annotations"],
        },
        "spec": pod["spec"],
    }
    inner: dict[str, Any] = template
    for key in reversed(kind.path):
        inner = {key: inner}
    return {
        "apiVersion": API_VERSIONS[kind.group],
        "kind": kind.kind,
        "metadata": {"name": "trainer", "namespace": "ml"},
        **inner,
    }


def workload_review(
    kind: WorkloadKind, document: dict[str, Any] | None, **fields: Any
) -> dict[str, Any]:
    version = API_VERSIONS[kind.group].rpartition("/")[2]
    return review(document, kind=(kind.group, version, kind.kind), resource=kind.resource, **fields)


def answer(client: Client, path: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = client.post(path, data=json.dumps(payload), content_type="application/json")
    body = response.get_json()
    assert body["response"]["uid"] == UID
    assert "patch" not in body["response"], "templates are never patched"
    return response.status_code, body["response"]


def expected_pod_verdict(document: dict[str, Any], kind: WorkloadKind) -> Any:
    template = document
    for key in kind.path:
        template = template[key]
    pod = controller_pod(template, "ml", "trainer")
    return mutate(pod, "ml", load_policies(BUNDLED_POLICIES))


@pytest.mark.parametrize("kind", KUBERNETES_KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_an_accepted_template_is_allowed_with_what_each_pod_gets(
    client: Client, kind: WorkloadKind, operation: str
) -> None:
    document = workload(kind)
    old = workload(kind, "0.25") if operation == "UPDATE" else None
    payload = workload_review(kind, document, operation=operation, oldObject=old)

    status, response = answer(client, "/validate", payload)

    assert status == 200 and response["allowed"] is True
    checked = check_workload(document, kind, "ml", load_policies(BUNDLED_POLICIES))
    assert checked is not None
    assert response["warnings"] == clean_warnings(checked.warnings)
    # Too long for one warning (the apiserver cuts them at 120): the share on a line of its own.
    assert response["warnings"][:2] == [
        'each pod will get nvidia.com/gpu.shared: 1 in container "main"',
        "each pod's share: 0.5 of a GPU on pool ts-half, time-slicing, policy default",
    ]
    assert any(w.startswith("each pod will get nodeSelector ") for w in response["warnings"])


@pytest.mark.parametrize("kind", KUBERNETES_KINDS, ids=KIND_IDS)
def test_a_template_its_pods_would_be_denied_for_is_denied_with_their_message(
    client: Client, kind: WorkloadKind
) -> None:
    document = workload(kind, "1.5")
    status, response = answer(client, "/validate", workload_review(kind, document))
    pod_verdict = expected_pod_verdict(document, kind)
    assert status == 200 and response["allowed"] is False
    assert response["status"]["code"] == pod_verdict.code == 422
    assert response["status"]["message"] == (
        f"pod template of {kind.kind} 'trainer': " + " ".join(pod_verdict.reasons)
    )


def test_the_message_is_the_one_the_pod_would_get(client: Client) -> None:
    """The same template as a pod at /mutate: the workload's message only adds the prefix."""
    kind = next(k for k in KUBERNETES_KINDS if k.kind == "CronJob")
    document = workload(kind, "0.99")
    _, as_workload = answer(client, "/validate", workload_review(kind, document))
    template = document["spec"]["jobTemplate"]["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(template)}
    response = client.post("/mutate", json=review(pod)).get_json()["response"]
    assert response["allowed"] is False
    assert as_workload["status"]["code"] == response["status"]["code"]
    assert as_workload["status"]["message"] == (
        f"pod template of CronJob 'trainer': {response['status']['message']}"
    )


def test_an_update_that_leaves_the_template_alone_is_not_looked_at(client: Client) -> None:
    """Scaling, a controller's revision annotation or a finalizer never meet a policy that
    changed since the template was written."""
    kind = KUBERNETES_KINDS[0]
    stale = workload(kind, "abc")
    scaled = copy.deepcopy(stale)
    scaled["spec"]["replicas"] = 0
    scaled["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "2"}
    payload = workload_review(kind, scaled, operation="UPDATE", oldObject=stale)
    status, response = answer(client, "/validate", payload)
    assert (status, response) == (200, {"uid": UID, "allowed": True})


def test_templates_without_annotation_or_out_of_scope_requests_are_allowed_silently(
    client: Client,
) -> None:
    kind = KUBERNETES_KINDS[0]
    quiet = [
        workload_review(kind, workload(kind, None)),
        workload_review(kind, workload(kind, "abc"), operation="DELETE"),
        workload_review(kind, workload(kind, "abc"), subResource="scale"),
        workload_review(kind, {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {}}),
        review({"kind": "Service"}, kind=("", "v1", "Service"), resource="services"),
    ]
    for payload in quiet:
        assert answer(client, "/validate", payload) == (200, {"uid": UID, "allowed": True})


def test_excluded_namespaces_say_the_annotation_is_ignored(client: Client) -> None:
    kind = KUBERNETES_KINDS[0]
    payload = workload_review(kind, workload(kind, "abc"), namespace="kube-system")
    status, response = answer(client, "/validate", payload)
    assert status == 200 and response["allowed"] is True
    assert response["warnings"] == [
        "gpu-fraction ignored: namespace 'kube-system' is excluded from GPU sharing"
    ]


def test_the_mutating_endpoint_leaves_workloads_alone(client: Client) -> None:
    for kind in KUBERNETES_KINDS:
        status, response = answer(client, "/mutate", workload_review(kind, workload(kind, "abc")))
        assert (status, response) == (200, {"uid": UID, "allowed": True})


def test_pods_at_validate_are_answered_as_before(client: Client) -> None:
    """A pod UPDATE is no workload: allowed unchanged, as the pod path always did."""
    payload = review(annotated_pod("abc"), operation="UPDATE")
    assert answer(client, "/validate", payload) == (200, {"uid": UID, "allowed": True})


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("x", "request.object.spec.template must be an object."),
        (
            {"metadata": {"annotations": {"gpu-fraction": 0.5}}, "spec": {}},
            "request.object.spec.template.metadata.annotations['gpu-fraction'] must be a "
            "string, not a number.",
        ),
        (
            {"metadata": {"annotations": {"gpu-fraction": "0.5"}}, "spec": {"containers": {}}},
            "request.object.spec.template.spec.containers must be an array, not an object.",
        ),
    ],
)
def test_templates_of_the_wrong_shape_are_400_naming_the_field(
    client: Client, template: Any, message: str
) -> None:
    kind = KUBERNETES_KINDS[0]
    document = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"template": template}}
    status, response = answer(client, "/validate", workload_review(kind, document))
    assert status == 400 and response["status"]["message"] == message


def test_an_update_without_old_object_is_checked(client: Client) -> None:
    kind = KUBERNETES_KINDS[0]
    payload = workload_review(kind, workload(kind, "abc"), operation="UPDATE")
    status, response = answer(client, "/validate", payload)
    assert status == 200 and response["allowed"] is False


def test_an_old_object_of_the_wrong_type_is_400(client: Client) -> None:
    kind = KUBERNETES_KINDS[0]
    payload = workload_review(kind, workload(kind), operation="UPDATE", oldObject="x")
    status, response = answer(client, "/validate", payload)
    assert status == 400 and response["status"]["message"] == "request.oldObject must be an object."


def test_no_policies_loaded_is_503(tmp_path: Any) -> None:
    broken = tmp_path / "policies"
    broken.mkdir()
    (broken / "bad.yaml").write_text("kind: GpuSharingPolicy\n")
    client = Client(create_app(PolicyStore.loaded(broken)))
    kind = KUBERNETES_KINDS[0]
    response = client.post("/validate", json=workload_review(kind, workload(kind)))
    assert response.status_code == 503


def test_the_admission_log_names_the_workload_kind(
    client: Client, admission_log_stream: io.StringIO
) -> None:
    kind = next(k for k in KUBERNETES_KINDS if k.kind == "Job")
    answer(client, "/validate", workload_review(kind, workload(kind, "abc"), name="trainer"))
    (line,) = [json.loads(text) for text in admission_log_stream.getvalue().splitlines()]
    assert line["kind"] == "Job" and line["pod"] == "trainer"
    assert line["decision"] == "denied" and line["endpoint"] == "validate"
