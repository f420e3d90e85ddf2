"""Workloads behind a real kube-apiserver: pod templates checked where they are written.

gpushare is registered with what `gpushare webhook-config` prints (conftest.py): besides the
mutating pod webhook and the pods' safety-net policy, the validating configuration holds
`workloads.gpushare.io` (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job,
ReplicationController), `cronjobs.gpushare.io` and `podtemplates.gpushare.io`, whose
matchConditions send only templates carrying a gpushare annotation. There is no
controller-manager here, so no pod is ever created from these workloads: what is proved is
the workload's own admission.

- A good Deployment, Job, CronJob and PodTemplate are created as written (templates are
  never mutated), with Warning headers saying what each pod will get: exactly the warnings
  `gpushare mutate -o json` predicts for the workload as the webhook receives it.
- A bad one is refused with the message the pod itself gets from the mutating webhook, after
  a prefix naming the workload's pod template.
- A workload without the annotation on its template never reaches the webhook (its counters
  and admission log stay still); an update that leaves the template alone reaches it and is
  not looked at; one that breaks the template is refused.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import unique_name
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from harness.api import Admitted, create_pod, parse_warnings, status_message
from harness.registration import MUTATING_WEBHOOK, GpushareWebhook
from webhook.constants import APPLIED_ANNOTATION, FRACTION_ANNOTATION, SHARED_GPU_RESOURCE
from webhook.server.review import clean_warnings

# Where each kind is served, and the webhook of the registration that checks it.
RESOURCES = {
    "Deployment": ("/apis/apps/v1", "deployments", "workloads.gpushare.io"),
    "Job": ("/apis/batch/v1", "jobs", "workloads.gpushare.io"),
    "CronJob": ("/apis/batch/v1", "cronjobs", "cronjobs.gpushare.io"),
    "PodTemplate": ("/api/v1", "podtemplates", "podtemplates.gpushare.io"),
}
KINDS = list(RESOURCES)
NORMALIZE_NAMESPACE = "kube-system"  # excluded by the registration: defaulting only


def request_object(
    api: k8s.ApiClient,
    method: str,
    namespace: str,
    document: Mapping[str, Any],
    *,
    name: str = "",
    dry_run: bool = False,
) -> Admitted:
    """POST (create) or PUT (replace) a workload as raw JSON, keeping the Warning headers."""
    prefix, resource, _ = RESOURCES[document["kind"]]
    path = f"{prefix}/namespaces/{{namespace}}/{resource}" + (f"/{name}" if name else "")
    method_, url, headers, body, post = api.param_serialize(
        method,
        path,
        path_params={"namespace": namespace},
        query_params=[("dryRun", "All")] if dry_run else [],
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        body=dict(document),
        auth_settings=["BearerToken"],
    )
    response = api.call_api(method_, url, headers, body, post)
    data: bytes = response.read()  # type: ignore[no-untyped-call]
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return Admitted(json.loads(data), parse_warnings(response.headers.getlist("Warning")))


def template_of(kind: str, template: dict[str, Any], name: str) -> dict[str, Any]:
    """A workload of `kind` called `name` around `template`."""
    if kind == "PodTemplate":
        return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}, "template": template}
    if kind == "Deployment":
        spec: dict[str, Any] = {
            "replicas": 1,
            "selector": {"matchLabels": template["metadata"]["labels"]},
            "template": template,
        }
        api_version = "apps/v1"
    else:
        template = copy.deepcopy(template)
        template["spec"]["restartPolicy"] = "Never"
        spec = {"template": template}
        api_version = "batch/v1"
        if kind == "CronJob":
            spec = {"schedule": "0 3 * * *", "jobTemplate": {"spec": spec}}
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "spec": spec}


def pod_template(fraction: str | None, name: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"labels": {"app": name}}
    if fraction is not None:
        metadata["annotations"] = {FRACTION_ANNOTATION: fraction}
    container = {
        "name": "main",
        "image": "tensorflow/tensorflow:2.17.0-gpu",
        "command": ["python", "/app/train.py"],
    }
    return {"metadata": metadata, "spec": {"containers": [container]}}


def template_in(document: Mapping[str, Any]) -> dict[str, Any]:
    if document["kind"] == "PodTemplate":
        pod_template_: dict[str, Any] = document["template"]
        return pod_template_
    spec = document["spec"]
    if document["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    template: dict[str, Any] = spec["template"]
    return template


def workload(kind: str, fraction: str | None) -> dict[str, Any]:
    name = unique_name(kind.lower())
    return template_of(kind, pod_template(fraction, name), name)


def as_received(api: k8s.ApiClient, document: dict[str, Any]) -> dict[str, Any]:
    """The workload as the webhook receives it: decoded and defaulted by the apiserver (a
    server-side dry run in kube-system, which the registration keeps from the webhook)."""
    probe = copy.deepcopy(document)
    probe["metadata"] = {"name": document["metadata"]["name"], "namespace": NORMALIZE_NAMESPACE}
    defaulted = request_object(api, "POST", NORMALIZE_NAMESPACE, probe, dry_run=True).pod
    defaulted.pop("status", None)
    defaulted["metadata"] = dict(document["metadata"])
    return defaulted


def predict(document: dict[str, Any], policies: Path, namespace: str) -> dict[str, Any]:
    """The entry `gpushare mutate -o json` gives for the workload (the CLI a user runs)."""
    from webhook.cli import main

    with tempfile.TemporaryDirectory(prefix="gpushare-workload-") as scratch:
        manifest = Path(scratch) / "workload.json"
        manifest.write_text(json.dumps(document))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            argv = ["mutate", "-f", str(manifest), "--policies", str(policies)]
            code = main([*argv, "-n", namespace, "-o", "json"])
    assert code in (0, 3), err.getvalue()
    (entry,) = json.loads(out.getvalue())["documents"]
    assert entry["template"] is not None
    entry_: dict[str, Any] = entry
    return entry_


def the_pod_of(document: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A pod made of the workload's template, as its controller would create it."""
    template = copy.deepcopy(template_in(document))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": name},
        "spec": template["spec"],
    }


# -- good and bad, through the real apiserver ---------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_good_workload_is_created_as_written_with_what_each_pod_gets(
    gpushare_webhook: GpushareWebhook, namespace: str, kind: str
) -> None:
    api, server = gpushare_webhook.api, gpushare_webhook.server
    document = workload(kind, "0.5")
    name = document["metadata"]["name"]
    prediction = predict(as_received(api, document), gpushare_webhook.policies, namespace)
    assert prediction["verdict"] == "allowed"
    before = server.admission_counts()

    created = request_object(api, "POST", namespace, document)

    assert created.warnings == clean_warnings(prediction["warnings"])
    assert created.warnings[0].startswith(f"each pod will get {SHARED_GPU_RESOURCE}: 1 in ")
    stored = template_in(created.pod)
    assert stored["metadata"]["annotations"] == {FRACTION_ANNOTATION: "0.5"}
    assert APPLIED_ANNOTATION not in stored["metadata"]["annotations"]
    assert "resources" not in stored["spec"]["containers"][0] or SHARED_GPU_RESOURCE not in (
        stored["spec"]["containers"][0]["resources"].get("limits") or {}
    )
    assert "env" not in stored["spec"]["containers"][0]
    assert "nodeSelector" not in stored["spec"]
    assert server.admission_counts().minus(before) == {("validate", "allowed"): 1.0}
    (entry,) = server.admissions(namespace, name)
    assert (entry["endpoint"], entry["kind"], entry["operation"]) == ("validate", kind, "CREATE")


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_workload_is_refused_with_the_message_its_pods_would_get(
    gpushare_webhook: GpushareWebhook, namespace: str, kind: str
) -> None:
    api, server = gpushare_webhook.api, gpushare_webhook.server
    document = workload(kind, "1.5")
    name = document["metadata"]["name"]
    before = server.admission_counts()

    with pytest.raises(ApiException) as caught:
        request_object(api, "POST", namespace, document)

    with pytest.raises(ApiException) as as_pod:
        create_pod(api, namespace, the_pod_of(document, name))
    pod_message = status_message(as_pod.value)
    prefix = f'admission webhook "{MUTATING_WEBHOOK}" denied the request: '
    assert pod_message.startswith(prefix)
    webhook_name = RESOURCES[kind][2]
    assert status_message(caught.value) == (
        f'admission webhook "{webhook_name}" denied the request: pod template of {kind} '
        f"'{name}': {pod_message.removeprefix(prefix)}"
    )
    assert caught.value.status == as_pod.value.status == 422
    prediction = predict(as_received(api, document), gpushare_webhook.policies, namespace)
    assert prediction["verdict"] == "denied"
    assert pod_message.removeprefix(prefix) == " ".join(prediction["reasons"])
    counts = server.admission_counts().minus(before)
    assert counts == {("validate", "denied"): 1.0, ("mutate", "denied"): 1.0}


def test_workloads_without_an_annotated_template_never_reach_the_webhook(
    gpushare_webhook: GpushareWebhook, namespace: str
) -> None:
    """matchConditions keep them away: counters and log stay still. The annotation on the
    workload's own metadata, where it does nothing, is sent: ``kubectl apply`` says where it
    must go, and the workload is admitted."""
    api, server = gpushare_webhook.api, gpushare_webhook.server
    plain = [workload(kind, None) for kind in KINDS]
    before = server.admission_counts()

    for document in plain:
        created = request_object(api, "POST", namespace, document)
        assert created.warnings == []

    assert server.admission_counts().minus(before) == {}
    assert server.admissions(namespace) == []
    control = workload("Job", "0.25")
    request_object(api, "POST", namespace, control)
    assert server.admission_counts().minus(before) == {("validate", "allowed"): 1.0}

    on_the_workload = workload("Deployment", None)
    on_the_workload["metadata"]["annotations"] = {FRACTION_ANNOTATION: "0.5"}
    created = request_object(api, "POST", namespace, on_the_workload)
    (warning,) = created.warnings
    assert warning == (
        "gpu-fraction on the Deployment itself does nothing: put it in "
        "spec.template.metadata.annotations"
    )


def test_updates_are_checked_only_when_they_change_the_template(
    gpushare_webhook: GpushareWebhook, namespace: str
) -> None:
    """Scaling reaches the webhook (the template is annotated) and is let through without a
    look (the apiserver sends oldObject); breaking the template is refused."""
    api, server = gpushare_webhook.api, gpushare_webhook.server
    document = workload("Deployment", "0.5")
    name = document["metadata"]["name"]
    stored = request_object(api, "POST", namespace, document).pod
    before = server.admission_counts()

    scaled = copy.deepcopy(stored)
    scaled["spec"]["replicas"] = 3
    scaled = request_object(api, "PUT", namespace, scaled, name=name).pod
    assert scaled["spec"]["replicas"] == 3
    assert server.admission_counts().minus(before) == {("validate", "skipped"): 1.0}

    broken = copy.deepcopy(scaled)
    template_in(broken)["metadata"]["annotations"][FRACTION_ANNOTATION] = "abc"
    with pytest.raises(ApiException) as caught:
        request_object(api, "PUT", namespace, broken, name=name)
    assert status_message(caught.value).startswith(
        'admission webhook "workloads.gpushare.io" denied the request: pod template of '
        f"Deployment '{name}': gpu-fraction \"abc\" is not a plain decimal"
    )
    entries = [e for e in server.admissions(namespace, name) if e["operation"] == "UPDATE"]
    assert [e["decision"] for e in entries] == ["skipped", "denied"]


def test_the_registration_holds_the_template_webhooks(gpushare_webhook: GpushareWebhook) -> None:
    validating = next(
        d for d in gpushare_webhook.documents if d["kind"] == "ValidatingWebhookConfiguration"
    )
    # By default the pods' own checks are the safety-net policy's: the validating
    # configuration holds the template webhooks only (--validating-webhook pods adds it).
    names = [w["name"] for w in validating["webhooks"]]
    assert names[:3] == [
        "workloads.gpushare.io",
        "cronjobs.gpushare.io",
        "podtemplates.gpushare.io",
    ]
    assert {"rayclusters.gpushare.io", "workflows.gpushare.io"} <= set(names)
