"""Pod templates checked as the pods their controllers create (webhook.core.workloads)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from tests.core.support import controller_pod, pod_template
from webhook.core import (
    Planned,
    PolicySet,
    Untouched,
    WorkloadKind,
    api_group,
    builtin_kinds,
    check_workload,
    mutate,
    mutated_pod,
    template_changed,
    workload_kind,
)
from webhook.core.template_summary import MAX_WARNING_LENGTH, pod_summary

from .support import policies_from, simple_policy

# Kubernetes' own kinds (one template each, at one path).
KUBERNETES_KINDS = tuple(k for k in builtin_kinds() if k.group in {"", "apps", "batch"})

API_VERSIONS = {"apps": "apps/v1", "batch": "batch/v1", "": "v1"}


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    settings = {
        "apiVersion": "gpushare.io/v1alpha1",
        "kind": "GpuSharingSettings",
        "metadata": {"name": "settings"},
        "spec": {"excludeNamespaces": ["kube-system", "quiet"]},
    }
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    return policies_from(settings, simple_policy("p", tolerations=[toleration]))


def template(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"labels": {"app": "train"}}
    if annotations is not None:
        metadata["annotations"] = annotations
    body = {"containers": [{"name": "main", "image": "python:3.12"}], **spec}
    return {"metadata": metadata, "spec": body}


def workload(kind: WorkloadKind, pod_template_: dict[str, Any]) -> dict[str, Any]:
    """A workload of ``kind`` with ``pod_template_`` at the kind's template path."""
    inner: dict[str, Any] = pod_template_
    for key in reversed(kind.path):
        inner = {key: inner}
    return {
        "apiVersion": API_VERSIONS[kind.group],
        "kind": kind.kind,
        "metadata": {"name": "train", "namespace": "ml", "labels": {"owner": "x"}},
        **inner,
    }


KIND_IDS = [k.kind for k in KUBERNETES_KINDS]


def test_the_kinds_and_where_their_templates_sit() -> None:
    paths = {(k.group, k.kind): k.where for k in KUBERNETES_KINDS}
    assert paths == {
        ("apps", "Deployment"): "spec.template",
        ("apps", "StatefulSet"): "spec.template",
        ("apps", "DaemonSet"): "spec.template",
        ("apps", "ReplicaSet"): "spec.template",
        ("batch", "Job"): "spec.template",
        ("", "ReplicationController"): "spec.template",
        ("batch", "CronJob"): "spec.jobTemplate.spec.template",
        ("", "PodTemplate"): "template",
    }
    assert {k.resource for k in KUBERNETES_KINDS} >= {"deployments", "cronjobs", "podtemplates"}


@pytest.mark.parametrize(
    ("api_version", "kind", "expected"),
    [
        ("apps/v1", "Deployment", "Deployment"),
        ("apps/v1beta2", "Deployment", "Deployment"),  # same path in every version
        ("batch/v1", "CronJob", "CronJob"),
        ("v1", "PodTemplate", "PodTemplate"),
        ("v1", "Pod", None),
        ("extensions/v1beta1", "Deployment", None),
        ("v1", "Service", None),
        (None, "Deployment", None),
        ("apps/v1", 3, None),
    ],
)
def test_workload_kind_by_group_and_kind(api_version: Any, kind: Any, expected: str | None) -> None:
    found = workload_kind(api_group(api_version), kind)
    assert (found.kind if found else None) == expected


def test_the_controller_pod_is_the_template_in_the_workloads_namespace() -> None:
    source = template({"gpu-fraction": "0.5"})
    source["metadata"]["name"] = "ignored"
    pod = controller_pod(source, "ml", "train")
    assert pod == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "labels": {"app": "train"},
            "annotations": {"gpu-fraction": "0.5"},
            "namespace": "ml",
            "generateName": "train-",
        },
        "spec": source["spec"],
    }
    assert source["metadata"]["name"] == "ignored"  # the template itself is left alone


@pytest.mark.parametrize("kind", KUBERNETES_KINDS, ids=KIND_IDS)
def test_an_accepted_template_gets_what_its_pods_get(
    kind: WorkloadKind, policies: PolicySet
) -> None:
    document = workload(kind, template({"gpu-fraction": "0.5"}))
    before = copy.deepcopy(document)

    checked = check_workload(document, kind, "ml", policies)

    assert checked is not None and checked.allowed
    assert document == before, "the workload is never changed in place"
    pod = controller_pod(pod_template(document, kind), "ml", "train")
    expected = mutate(pod, "ml", policies)
    assert expected.decision is not None
    as_pod = mutated_pod(pod, expected.decision)
    planned = pod_template(checked.result or {}, kind)
    assert planned["spec"] == as_pod["spec"]
    assert planned["metadata"]["annotations"] == as_pod["metadata"]["annotations"]
    assert "namespace" not in planned["metadata"] and "generateName" not in planned["metadata"]
    assert jsonpatch.apply_patch(copy.deepcopy(document), checked.patch) == checked.result
    assert all(op["path"].startswith("/" + "/".join(kind.path) + "/") for op in checked.patch)
    assert {k: v for k, v in (checked.result or {}).items() if k != kind.path[0]} == {
        k: v for k, v in document.items() if k != kind.path[0]
    }
    assert checked.warnings[: len(checked.summary)] == checked.summary
    assert checked.policy == "p"


@pytest.mark.parametrize("kind", KUBERNETES_KINDS, ids=KIND_IDS)
def test_a_template_its_pods_would_be_denied_for_is_denied_with_their_reasons(
    kind: WorkloadKind, policies: PolicySet
) -> None:
    document = workload(kind, template({"gpu-fraction": "abc"}))
    checked = check_workload(document, kind, "ml", policies)
    pod = controller_pod(pod_template(document, kind), "ml", "train")
    expected = mutate(pod, "ml", policies)
    assert checked is not None and not checked.allowed
    assert checked.reasons == expected.reasons and checked.reasons
    assert checked.code == expected.code == 422
    assert checked.admission_reasons == (
        f"pod template of {kind.kind} 'train':",
        *expected.reasons,
    )
    assert checked.result is None and checked.patch == []


def test_policy_denials_come_with_the_policy_and_403(policies: PolicySet) -> None:
    kind = workload_kind("apps", "Deployment")
    assert kind is not None
    checked = check_workload(
        workload(kind, template({"gpu-fraction": "0.9"})), kind, "ml", policies
    )
    assert checked is not None and not checked.allowed
    assert checked.code == 403 and checked.policy == "p"


def test_templates_without_annotation_or_in_excluded_namespaces_are_untouched(
    policies: PolicySet,
) -> None:
    kind = workload_kind("batch", "Job")
    assert kind is not None
    plain = workload(kind, template())
    checked = check_workload(plain, kind, "ml", policies)
    assert checked is not None and checked.allowed
    assert isinstance(checked.decision, Untouched)
    assert (checked.result, checked.patch, checked.warnings) == (plain, [], ())

    quiet = workload(kind, template({"gpu-fraction": "0.5"}))
    checked = check_workload(quiet, kind, "quiet", policies)
    assert checked is not None and isinstance(checked.decision, Untouched)
    assert checked.result == quiet and checked.patch == []
    assert checked.warnings == (
        "gpu-fraction ignored: namespace 'quiet' is excluded from GPU sharing",
    )


def test_the_template_labels_choose_the_policy_not_the_workloads(policies: PolicySet) -> None:
    labelled = policies_from(
        simple_policy("fallback"),
        simple_policy(
            "vision", default=False, match={"namespaces": ["*"], "podLabels": {"team": "vision"}}
        ),
    )
    kind = workload_kind("apps", "Deployment")
    assert kind is not None
    document = workload(kind, template({"gpu-fraction": "0.5"}))
    document["metadata"]["labels"] = {"team": "vision"}
    checked = check_workload(document, kind, "ml", labelled)
    assert checked is not None and checked.policy == "fallback"
    document["spec"]["template"]["metadata"]["labels"]["team"] = "vision"
    checked = check_workload(document, kind, "ml", labelled)
    assert checked is not None and checked.policy == "vision"


def test_a_workload_without_a_template_has_nothing_to_check(policies: PolicySet) -> None:
    kind = workload_kind("apps", "Deployment")
    assert kind is not None
    patch_only = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 3}}
    assert check_workload(patch_only, kind, "ml", policies) is None
    assert check_workload({"spec": {"template": "x"}}, kind, "ml", policies) is None


def test_a_template_without_spec_is_denied_as_its_pods_would_be(policies: PolicySet) -> None:
    kind = workload_kind("", "PodTemplate")
    assert kind is not None
    document = {
        "kind": "PodTemplate",
        "template": {"metadata": {"annotations": {"gpu-fraction": "0.5"}}},
    }
    checked = check_workload(document, kind, "ml", policies)
    assert checked is not None and not checked.allowed
    assert checked.reasons == ("The pod has no containers to give a GPU to.",)


def test_the_summary_says_what_each_pod_gets(policies: PolicySet) -> None:
    kind = workload_kind("apps", "Deployment")
    assert kind is not None
    document = workload(kind, template({"gpu-fraction": "0.3"}))
    checked = check_workload(document, kind, "ml", policies)
    assert checked is not None and isinstance(checked.decision, Planned)
    summary = checked.summary
    assert summary[0] == (
        'each pod will get nvidia.com/gpu.shared: 1 in container "main" '
        "(0.3 of a GPU on pool half, time-slicing, policy p)"
    )
    assert summary[1] == (
        "each pod will get nodeSelector nvidia.com/gpu.replicas=2, "
        "nvidia.com/gpu.sharing-strategy=time-slicing"
    )
    assert summary[-1] == "each pod will also get toleration nvidia.com/gpu"
    planned = pod_template(checked.result or {}, kind)
    env = planned["spec"]["containers"][0].get("env") or []
    said = " ".join(line for line in summary if line.startswith("each pod will get env "))
    assert all(f"{e['name']}={e['value']}" in said for e in env)
    assert all(len(line) <= MAX_WARNING_LENGTH for line in summary)


def test_whole_gpus_are_said_as_such(policies: PolicySet) -> None:
    record = {
        "container": "main",
        "gpus": 2,
        "mode": "whole-gpu",
        "policy": "p",
        "resource": "nvidia.com/gpu",
    }
    pod = template({"gpu-fraction": "2"})
    assert pod_summary(record, pod, pod) == (
        'each pod will get nvidia.com/gpu: 2 in container "main" (whole GPUs, policy p)',
    )


def test_long_summaries_are_packed_into_short_lines() -> None:
    record = {"container": "main", "gpus": 1, "mode": "whole-gpu", "resource": "nvidia.com/gpu"}
    before = template()
    after = copy.deepcopy(before)
    after["spec"]["containers"][0]["env"] = [
        {"name": f"A_RATHER_LONG_VARIABLE_NAME_{i}", "value": "0.123456"} for i in range(9)
    ]
    after["spec"]["containers"][0]["env"].append({"name": "FROM_SECRET", "valueFrom": {}})
    after["spec"]["hostIPC"] = True
    after["spec"]["volumes"] = [{"name": "mps-pipe"}]
    after["metadata"]["labels"]["gpushare.io/mode"] = "mps"
    lines = pod_summary(record, before, after)
    env_lines = [line for line in lines if line.startswith("each pod will get env ")]
    assert len(env_lines) > 1
    assert all(len(line) <= MAX_WARNING_LENGTH for line in lines)
    listed = ", ".join(line.removeprefix("each pod will get env ") for line in env_lines)
    assert listed.split(", ") == [
        *(f"A_RATHER_LONG_VARIABLE_NAME_{i}=0.123456" for i in range(9)),
        "FROM_SECRET",
    ]
    assert (
        lines[-1] == "each pod will also get hostIPC, volume mps-pipe, label gpushare.io/mode=mps"
    )


def test_template_changed_only_when_the_template_does() -> None:
    kind = workload_kind("batch", "CronJob")
    assert kind is not None
    old = workload(kind, template({"gpu-fraction": "0.5"}))
    scaled = copy.deepcopy(old)
    scaled["spec"]["schedule"] = "*/5 * * * *"
    scaled["metadata"]["finalizers"] = ["example.com/x"]
    assert not template_changed(old, scaled, kind)
    edited = copy.deepcopy(old)
    edited["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"]["gpu-fraction"] = (
        "0.25"
    )
    assert template_changed(old, edited, kind)
    assert template_changed(None, old, kind)
