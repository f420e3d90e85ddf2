"""Reinvocation: gpushare next to a second mutating webhook, in either order.

gpushare's configuration says `reinvocationPolicy: IfNeeded`, which Kubernetes answers by
calling the webhook again when a later webhook changed the pod after it. Kubernetes
requires such webhooks to be idempotent: called on its own output (plus another
webhook's change) gpushare must answer without a patch, and the pod must stay exactly
what gpushare planned.

The second webhook is test-only: a small TLS server in this process (admission_server.
AdmissionServer, with its own certificate from `gpushare certs`) that adds a label and an
env var to every container unless present, also with IfNeeded. Mutating webhooks run in
the order of their configurations' names, so "aa-..." runs before "gpushare" and
"zz-..." after it; the test registers it for its own namespace only.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from admission_server import AdmissionServer
from kubernetes import client as k8s
from pods import annotated_pod, plain_pod
from prediction import as_admitted, predict, webhook_input

from harness.api import create_pod
from harness.cli import write_certificates
from harness.processes import wait_for
from harness.registration import GpushareWebhook
from webhook.constants import (
    APPLIED_ANNOTATION,
)

SECOND_LABEL = "e2e.gpushare.io/second-mutator"
SECOND_ENV = {"name": "SECOND_MUTATOR", "value": "seen"}


def second_mutator_patch(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """What the second webhook adds: a label and an env var per container, each once."""
    patch: list[dict[str, Any]] = []
    labels = pod["metadata"].get("labels")
    if labels is None:
        patch.append({"op": "add", "path": "/metadata/labels", "value": {SECOND_LABEL: "yes"}})
    elif SECOND_LABEL not in labels:
        key = SECOND_LABEL.replace("~", "~0").replace("/", "~1")
        patch.append({"op": "add", "path": f"/metadata/labels/{key}", "value": "yes"})
    for index, container in enumerate(pod["spec"]["containers"]):
        env = container.get("env")
        if env is None:
            patch.append(
                {"op": "add", "path": f"/spec/containers/{index}/env", "value": [SECOND_ENV]}
            )
        elif not any(e["name"] == SECOND_ENV["name"] for e in env):
            patch.append(
                {"op": "add", "path": f"/spec/containers/{index}/env/-", "value": SECOND_ENV}
            )
    return patch


def second_mutator(request: dict[str, Any]) -> dict[str, Any]:
    patch = second_mutator_patch(request["object"])
    if not patch:
        return {"allowed": True}
    encoded = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"allowed": True, "patchType": "JSONPatch", "patch": encoded}


def with_second_mutation(pod: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(pod), second_mutator_patch(pod))
    return result


def second_configuration(name: str, server: AdmissionServer, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "second.e2e.gpushare.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
                "reinvocationPolicy": "IfNeeded",
                "clientConfig": {
                    "url": f"{server.url}/mutate",
                    "caBundle": base64.b64encode(server.ca_file.read_bytes()).decode(),
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            }
        ],
    }


@pytest.fixture(scope="module")
def second_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_certificates(tmp_path_factory.mktemp("second-mutator"), service="second")


@dataclass
class SecondMutator:
    server: AdmissionServer
    order: str

    def calls_for(self, name: str) -> list[dict[str, Any]]:
        return [r for r in self.server.seen() if r["object"]["metadata"].get("name") == name]


@pytest.fixture(params=["before", "after"])
def second_mutator_registered(
    request: pytest.FixtureRequest,
    gpushare_webhook: GpushareWebhook,
    second_certs: Path,
    namespace: str,
) -> Iterator[SecondMutator]:
    """The second webhook, registered to run before ("aa-...") or after ("zz-...") ours."""
    order: str = request.param
    name = ("aa-" if order == "before" else "zz-") + "e2e-second-mutator"
    api = gpushare_webhook.api
    with AdmissionServer(second_certs, second_mutator) as server:
        gpushare_webhook.registration.apply([second_configuration(name, server, namespace)])
        try:

            def in_force() -> bool | None:
                admitted = create_pod(api, namespace, plain_pod("probe"), dry_run=True).pod
                return True if SECOND_LABEL in admitted["metadata"]["labels"] else None

            wait_for("the second mutating webhook to be in force", in_force, timeout=30)
            yield SecondMutator(server, order)
        finally:
            gpushare_webhook.registration.delete(name, validating=False)


def test_reinvocation_leaves_our_mutation_exact_and_stable(
    second_mutator_registered: SecondMutator,
    gpushare_webhook: GpushareWebhook,
    core_v1: k8s.CoreV1Api,
    namespace: str,
) -> None:
    """Either order ends in the same place: our planned pod plus the other webhook's change.

    After: gpushare patches, the second webhook adds its label and env, and the apiserver
    calls gpushare again (IfNeeded), which answers without a patch. Before: the second
    webhook runs first, gpushare patches the pod it left, and the second webhook is called
    again and finds nothing to add; gpushare is not called again.
    """
    second = second_mutator_registered
    api = gpushare_webhook.api
    pod = annotated_pod("reinvoked", "0.5", env=[{"name": "APP", "value": "serve"}])
    pod["metadata"]["namespace"] = namespace
    policies = gpushare_webhook.policies

    admitted = create_pod(api, namespace, pod).pod

    if second.order == "after":
        prediction = predict(webhook_input(api, pod), policies, namespace)
        assert prediction.pod is not None
        expected = as_admitted(api, with_second_mutation(prediction.pod))
        expected_mutations = ["patched", "allowed"]  # the reinvocation: no patch
        expected_second_calls = 1
    else:
        prediction = predict(webhook_input(api, with_second_mutation(pod)), policies, namespace)
        assert prediction.pod is not None
        expected = as_admitted(api, prediction.pod)
        expected_mutations = ["patched"]
        expected_second_calls = 2
    assert admitted["spec"] == expected["spec"]
    assert admitted["metadata"]["labels"] == expected["metadata"]["labels"]
    assert admitted["metadata"]["annotations"] == expected["metadata"]["annotations"]
    assert SECOND_LABEL in admitted["metadata"]["labels"]
    assert APPLIED_ANNOTATION in admitted["metadata"]["annotations"]

    ours = [
        (e["endpoint"], e["decision"])
        for e in gpushare_webhook.server.admissions(namespace, "reinvoked")
    ]
    # The safety-net policy checks the result inside the apiserver: no validate call.
    assert ours == [("mutate", d) for d in expected_mutations]
    calls = second.calls_for("reinvoked")
    assert len(calls) == expected_second_calls
    if second.order == "before":
        # Its second call saw gpushare's work, and added nothing to it.
        assert APPLIED_ANNOTATION in calls[1]["object"]["metadata"]["annotations"]
        assert second_mutator_patch(calls[1]["object"]) == []
