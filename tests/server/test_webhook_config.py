"""The webhook configurations: valid objects, sane CEL, and filters that keep pods away."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml

from webhook.cli import main
from webhook.core import WorkloadKind, builtin_kinds
from webhook.install.certs import write_certificates
from webhook.install.webhook_config import (
    ServiceTarget,
    UrlTarget,
    WebhookConfigError,
    WebhookSettings,
    webhook_configurations,
)

from .support import annotated_pod, plain_pod

KUBERNETES_VERSION = "1.30.0"  # matchConditions are GA from 1.30


@pytest.fixture
def ca_file(tmp_path: Path) -> Path:
    return write_certificates(tmp_path / "certs", ["gpushare"]).ca_cert


def settings_for(ca_file: Path, **overrides: Any) -> WebhookSettings:
    """Settings with the opt-in pod validating webhook, which most tests here look at; the
    default (workload templates only, the safety-net policy for pods) is tested below and in
    tests/install/test_safety_net_policy.py."""
    values: dict[str, Any] = {
        "target": ServiceTarget("gpushare", "gpushare-system"),
        "ca_bundle_pem": ca_file.read_bytes(),
        "validating_webhook": "pods",
    }
    values.update(overrides)
    return WebhookSettings(**values)


def test_both_configurations_validate_against_the_kubernetes_schema(ca_file: Path) -> None:
    for document in webhook_configurations(settings_for(ca_file)):
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_url_target_validates(ca_file: Path) -> None:
    settings = settings_for(ca_file, target=UrlTarget("https://127.0.0.1:8443"))
    mutating, validating = webhook_configurations(settings)
    for document in (mutating, validating):
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    assert mutating["webhooks"][0]["clientConfig"]["url"] == "https://127.0.0.1:8443/mutate"
    assert validating["webhooks"][0]["clientConfig"]["url"] == "https://127.0.0.1:8443/validate"


def test_settings_the_issue_asks_for(ca_file: Path) -> None:
    mutating, validating = webhook_configurations(settings_for(ca_file))
    assert mutating["kind"] == "MutatingWebhookConfiguration"
    assert validating["kind"] == "ValidatingWebhookConfiguration"
    # The pods' webhook, and the one that charges Kueue-managed workloads their share.
    assert [w["name"] for w in mutating["webhooks"]] == ["mutate.gpushare.io", "kueue.gpushare.io"]
    kueue = mutating["webhooks"][1]
    assert kueue["clientConfig"] == mutating["webhooks"][0]["clientConfig"]
    assert kueue["failurePolicy"] == mutating["webhooks"][0]["failurePolicy"]
    assert kueue["matchConditions"][0]["name"] == "managed-by-kueue"
    assert {"jobs", "jobsets", "rayjobs", "pytorchjobs"} <= {
        r for rule in kueue["rules"] for r in rule["resources"]
    }
    for document in (mutating, validating):
        webhook = document["webhooks"][0]
        assert webhook["sideEffects"] == "None"
        assert webhook["admissionReviewVersions"] == ["v1"]
        assert 1 <= webhook["timeoutSeconds"] <= 10
        assert base64.b64decode(webhook["clientConfig"]["caBundle"]) == ca_file.read_bytes()
        assert webhook["rules"][0]["operations"] == ["CREATE"]
        assert webhook["rules"][0]["resources"] == ["pods"]
        expression = webhook["namespaceSelector"]["matchExpressions"][0]
        assert expression["key"] == "kubernetes.io/metadata.name"
        assert expression["operator"] == "NotIn"
        assert {"kube-system", "gpushare-system"} <= set(expression["values"])
    assert mutating["webhooks"][0]["reinvocationPolicy"] == "IfNeeded"
    assert "reinvocationPolicy" not in validating["webhooks"][0]


def test_glob_exclusions_are_left_to_the_webhook(ca_file: Path) -> None:
    """A namespaceSelector takes exact names; a pattern there would match no namespace."""
    settings = settings_for(ca_file, excluded_namespaces=("team-*", "ml", "lab-?"))
    for document in webhook_configurations(settings):
        for webhook in document["webhooks"]:
            expression = webhook["namespaceSelector"]["matchExpressions"][0]
            assert expression["values"] == ["kube-system", "gpushare-system", "ml"]


def cel_results(document: dict[str, Any], pod: dict[str, Any]) -> bool:
    """Whether the apiserver would call the webhook: every matchCondition true."""
    environment = celpy.Environment()
    activation = {"object": celpy.json_to_cel(pod)}
    results = []
    for condition in document["webhooks"][0]["matchConditions"]:
        program = environment.program(environment.compile(condition["expression"]))
        results.append(bool(program.evaluate(activation)))
    return all(results)


def test_mutating_match_conditions_select_only_annotated_pods(ca_file: Path) -> None:
    mutating, _ = webhook_configurations(settings_for(ca_file))
    assert cel_results(mutating, annotated_pod())
    memory_pod = plain_pod()
    memory_pod["metadata"]["annotations"] = {"gpu-memory": "4Gi"}
    assert cel_results(mutating, memory_pod)
    assert not cel_results(mutating, plain_pod())
    bare = plain_pod()
    del bare["metadata"]["annotations"]
    assert not cel_results(mutating, bare)


def test_validating_match_conditions_add_direct_resource_requests(ca_file: Path) -> None:
    _, validating = webhook_configurations(settings_for(ca_file))
    assert cel_results(validating, annotated_pod())
    assert not cel_results(validating, plain_pod())
    direct = plain_pod()
    direct["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] = "1"
    assert cel_results(validating, direct)
    init = plain_pod()
    init["spec"]["initContainers"] = [
        {"name": "i", "image": "x", "resources": {"requests": {"nvidia.com/gpu.shared": "1"}}}
    ]
    assert cel_results(validating, init)
    no_resources = plain_pod()
    del no_resources["spec"]["containers"][0]["resources"]
    assert not cel_results(validating, no_resources)


def test_mirror_pods_never_reach_either_webhook(ca_file: Path) -> None:
    pod = annotated_pod()
    pod["metadata"]["annotations"]["kubernetes.io/config.mirror"] = "hash"
    for document in webhook_configurations(settings_for(ca_file)):
        assert not cel_results(document, pod)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"failure_policy": "Sometimes"}, "failurePolicy"),
        ({"timeout_seconds": 31}, "1..30"),
        ({"target": UrlTarget("http://127.0.0.1:8443")}, "https"),
        ({"target": UrlTarget("https://127.0.0.1:8443/?x=1")}, "query"),
        ({"ca_bundle_pem": b"not a certificate"}, "PEM"),
    ],
)
def test_bad_settings_are_explained(ca_file: Path, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(WebhookConfigError, match=message):
        webhook_configurations(settings_for(ca_file, **overrides))


def test_cli_prints_yaml_with_both_cas_during_rotation(
    tmp_path: Path, ca_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new_ca = write_certificates(tmp_path / "new", ["gpushare"]).ca_cert
    code = main(
        [
            "webhook-config",
            "--ca",
            str(ca_file),
            "--ca",
            str(new_ca),
            "--service",
            "gpushare",
            "--namespace",
            "gpushare-system",
            "--failure-policy",
            "Ignore",
            "--timeout",
            "3",
        ]
    )
    assert code == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in documents] == [
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingWebhookConfiguration",
    ]
    assert documents[1]["spec"]["failurePolicy"] == "Ignore"
    webhook = documents[0]["webhooks"][0]
    assert webhook["failurePolicy"] == "Ignore" and webhook["timeoutSeconds"] == 3
    bundle = base64.b64decode(webhook["clientConfig"]["caBundle"])
    assert bundle == ca_file.read_bytes() + new_ca.read_bytes()
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_cli_takes_resources_and_namespaces_from_policies(
    ca_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from .support import BUNDLED_POLICIES

    code = main(
        [
            "webhook-config",
            "--ca",
            str(ca_file),
            "--url",
            "https://127.0.0.1:8443",
            "--policies",
            str(BUNDLED_POLICIES),
        ]
    )
    assert code == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    values = documents[0]["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"]
    assert {"kube-system", "kube-public", "gpushare-system"} <= set(values)


def test_cli_service_needs_namespace(ca_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["webhook-config", "--ca", str(ca_file), "--service", "gpushare"]) == 2
    assert "--namespace" in capsys.readouterr().err


def test_cli_unreadable_ca(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["webhook-config", "--ca", str(tmp_path / "no.crt"), "--url", "https://x:1"])
    assert code == 2
    assert "cannot read" in capsys.readouterr().err


# -- workloads: pod templates checked where they are written -----------------------------------

# Kubernetes' own kinds (one template each, at one path).
KUBERNETES_KINDS = tuple(k for k in builtin_kinds() if k.group in {"", "apps", "batch"})
FIRST_TEMPLATE_NAMES = ["workloads.gpushare.io", "cronjobs.gpushare.io", "podtemplates.gpushare.io"]
API_VERSIONS = {"apps": "apps/v1", "batch": "batch/v1", "": "v1"}


def template_webhooks(ca_file: Path, **overrides: Any) -> dict[str, dict[str, Any]]:
    _, validating = webhook_configurations(settings_for(ca_file, **overrides))
    return {w["name"]: w for w in validating["webhooks"][1:]}


def condition_holds(webhook: dict[str, Any], document: dict[str, Any]) -> bool:
    """Whether the apiserver calls ``webhook`` for ``document``; a CEL error fails the test
    (the failurePolicy, not the filter, would decide such a request)."""
    environment = celpy.Environment()
    activation = {"object": celpy.json_to_cel(document)}
    results = []
    for condition in webhook["matchConditions"]:
        program = environment.program(environment.compile(condition["expression"]))
        result = program.evaluate(activation)
        assert not isinstance(result, celpy.CELEvalError), (condition["name"], result)
        results.append(bool(result))
    return all(results)


def workload_with(kind: WorkloadKind, template: Any) -> dict[str, Any]:
    inner: Any = template
    for key in reversed(kind.path):
        inner = {key: inner}
    return {"apiVersion": API_VERSIONS[kind.group], "kind": kind.kind, **inner}


def test_the_validating_configuration_registers_every_workload_kind(ca_file: Path) -> None:
    webhooks = template_webhooks(ca_file)
    assert list(webhooks)[:3] == FIRST_TEMPLATE_NAMES
    registered = [
        (group, resource, version, rule["scope"])
        for webhook in webhooks.values()
        for rule in webhook["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for version in rule["apiVersions"]
    ]
    expected = [
        (k.group, k.resource, version, "Cluster" if k.cluster_scoped else "Namespaced")
        for k in builtin_kinds()
        for version in k.versions
    ]
    assert sorted(registered) == sorted(expected)  # each kind and version exactly once
    spec_template = webhooks["workloads.gpushare.io"]
    assert {r for rule in spec_template["rules"] for r in rule["resources"]} == {
        "deployments",
        "statefulsets",
        "daemonsets",
        "replicasets",
        "jobs",
        "replicationcontrollers",
    }
    for webhook in webhooks.values():
        assert webhook["clientConfig"]["service"]["path"] == "/validate"
        for rule in webhook["rules"]:
            assert rule["operations"] == ["CREATE", "UPDATE"]
        assert "reinvocationPolicy" not in webhook


def test_template_webhooks_keep_the_pods_namespace_selector_and_always_ignore_failures(
    ca_file: Path,
) -> None:
    _, validating = webhook_configurations(settings_for(ca_file, failure_policy="Fail"))
    pods, *templates = validating["webhooks"]
    assert pods["failurePolicy"] == "Fail"
    for webhook in templates:
        assert webhook["namespaceSelector"] == pods["namespaceSelector"]
        assert webhook["failurePolicy"] == "Ignore"
        assert webhook["timeoutSeconds"] == pods["timeoutSeconds"]


@pytest.mark.parametrize("kind", KUBERNETES_KINDS, ids=[k.kind for k in KUBERNETES_KINDS])
def test_only_annotated_templates_reach_the_webhook(ca_file: Path, kind: WorkloadKind) -> None:
    (webhook,) = [
        w
        for w in template_webhooks(ca_file).values()
        if any(kind.resource in rule["resources"] for rule in w["rules"])
    ]
    annotated = {"metadata": {"annotations": {"gpu-fraction": "0.5"}}, "spec": {}}
    memory = {"metadata": {"annotations": {"gpu-memory": "8Gi"}}}
    other = {"metadata": {"annotations": {"team": "vision"}, "labels": {"a": "b"}}}
    assert condition_holds(webhook, workload_with(kind, annotated))
    assert condition_holds(webhook, workload_with(kind, memory))
    assert not condition_holds(webhook, workload_with(kind, other))
    # Every step may be missing (a kustomize-style partial object, a template without
    # metadata): false, never an evaluation error.
    for partial in ({}, {"metadata": {}}, {"metadata": {"labels": {"a": "b"}}}):
        assert not condition_holds(webhook, workload_with(kind, partial))
    assert not condition_holds(webhook, {"apiVersion": "v1", "kind": kind.kind})
    for depth in range(1, len(kind.path)):
        document: dict[str, Any] = {"kind": kind.kind}
        inner = document
        for key in kind.path[:depth]:
            inner[key] = {}
            inner = inner[key]
        assert not condition_holds(webhook, document)


def test_an_annotation_on_the_workloads_own_metadata_is_sent_to_be_warned_about(
    ca_file: Path,
) -> None:
    """A Deployment annotated on its own metadata (where the annotation does nothing) is
    sent, so that ``kubectl apply`` says where the annotation must go; one annotated
    nowhere is not."""
    webhook = template_webhooks(ca_file)["workloads.gpushare.io"]
    deployment = workload_with(KUBERNETES_KINDS[0], {"metadata": {"labels": {"a": "b"}}})
    assert not condition_holds(webhook, deployment)
    deployment["metadata"] = {"annotations": {"gpu-fraction": "0.5"}}
    assert condition_holds(webhook, deployment)
