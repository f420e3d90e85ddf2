"""GPU shares in quota (policy ``quota``): the share resource, the record, the showback labels,
the policy rules, and the templates of workloads Kueue manages."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.core.support import (
    assert_valid_kubernetes_pod,
    make_pod,
    policies_from,
    policy_doc,
    simple_policy,
)
from webhook.core import (
    Planned,
    check_workload,
    kueue_charge,
    mutate,
    workload_kind,
)
from webhook.core.planning import plan_pod
from webhook.core.policy.loader import load_policy_texts
from webhook.errors import PolicyError

SHARE = "gpushare.io/milligpu"
SHARES_ON = {"shareResource": True, "showbackLabels": True}
EXAMPLES = Path(__file__).resolve().parents[2] / "policies/examples"


def mutated(policy: dict[str, Any], annotations: dict[str, str], **pod: Any) -> dict[str, Any]:
    original = make_pod(annotations, **pod)
    verdict = mutate(original, "team-a", policies_from(policy))
    assert verdict.allowed, verdict.reasons
    result = jsonpatch.apply_patch(copy.deepcopy(original), verdict.patch)
    assert isinstance(result, dict)
    return result


def resources(pod: dict[str, Any], index: int = 0) -> dict[str, Any]:
    return dict(pod["spec"]["containers"][index]["resources"])


@pytest.mark.parametrize(
    ("fraction", "milli", "pool"),
    [
        ("0.5", 500, "half"),
        ("0.3", 500, "half"),  # the slot held, not the ask: a half slot
        ("0.25", 250, "quarter"),
        ("0.1", 250, "quarter"),
    ],
)
def test_the_share_held_in_thousandths(fraction: str, milli: int, pool: str) -> None:
    pod = mutated(simple_policy(quota=SHARES_ON), {"gpu-fraction": fraction})
    assert resources(pod)["limits"][SHARE] == str(milli)
    assert resources(pod)["requests"][SHARE] == str(milli)
    assert pod["metadata"]["labels"]["gpushare.io/milligpu"] == str(milli)
    assert pod["metadata"]["labels"]["gpushare.io/pool"] == pool
    applied = yaml.safe_load(pod["metadata"]["annotations"]["gpushare.io/applied"])
    assert applied["milliGpus"] == milli
    assert "gpuMemoryMiB" not in applied  # no pool declares its GPUs' memory
    assert_valid_kubernetes_pod(pod)


def test_sixths_round_down_so_a_gpu_holds_its_slots() -> None:
    policy = simple_policy(pools=[{"name": "sixth", "replicas": 6}], quota=SHARES_ON)
    pod = mutated(policy, {"gpu-fraction": "0.1"})
    assert resources(pod)["limits"][SHARE] == "166"  # six of them: 996 <= 1000 per GPU


def test_whole_gpus_count_a_thousand_each() -> None:
    pod = mutated(simple_policy(quota=SHARES_ON), {"gpu-fraction": "2"})
    assert resources(pod)["limits"][SHARE] == "2000"
    assert resources(pod)["limits"]["nvidia.com/gpu"] == "2"


def test_off_by_default_nothing_added() -> None:
    pod = mutated(simple_policy(), {"gpu-fraction": "0.5"})
    assert SHARE not in resources(pod)["limits"]
    assert "labels" not in pod["metadata"]
    assert "milliGpus" not in pod["metadata"]["annotations"]["gpushare.io/applied"]


def test_labels_without_the_resource() -> None:
    pod = mutated(simple_policy(quota={"showbackLabels": True}), {"gpu-fraction": "0.5"})
    assert SHARE not in resources(pod)["limits"]
    assert pod["metadata"]["labels"]["gpushare.io/milligpu"] == "500"


def test_a_value_the_pod_brings_is_overwritten_not_trusted() -> None:
    containers = [{"name": "app", "image": "python:3.12", "resources": {"limits": {SHARE: "1"}}}]
    pod = mutated(
        simple_policy(quota=SHARES_ON),
        {"gpu-fraction": "0.5"},
        containers=containers,
    )
    assert resources(pod)["limits"][SHARE] == "500"
    labelled = make_pod({"gpu-fraction": "0.5"})
    labelled["metadata"]["labels"] = {"gpushare.io/milligpu": "1"}
    verdict = mutate(labelled, "team-a", policies_from(simple_policy(quota=SHARES_ON)))
    result = jsonpatch.apply_patch(labelled, verdict.patch)
    assert result["metadata"]["labels"]["gpushare.io/milligpu"] == "500"


def test_the_share_resource_by_hand_elsewhere_is_refused() -> None:
    containers = [
        {"name": "app", "image": "python:3.12"},
        {"name": "side", "image": "busybox", "resources": {"limits": {SHARE: "900"}}},
    ]
    pod = make_pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "app"}, containers)
    verdict = mutate(pod, "team-a", policies_from(simple_policy(quota=SHARES_ON)))
    assert not verdict.allowed
    assert "container 'side' asks for gpushare.io/milligpu: 900" in verdict.reasons[0]


def test_gpu_model_from_the_pool_selector_for_showback() -> None:
    policy = simple_policy(
        pools=[
            {
                "name": "a100",
                "replicas": 2,
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED"},
            }
        ],
        quota=SHARES_ON,
    )
    pod = mutated(policy, {"gpu-fraction": "0.5"})
    assert pod["metadata"]["labels"]["gpushare.io/gpu-model"] == "NVIDIA-A100-SXM4-80GB"


def test_gpu_memory_where_the_pool_declares_it() -> None:
    policy = simple_policy(
        pools=[{"name": "half", "replicas": 2, "gpuMemory": "80Gi"}], quota=SHARES_ON
    )
    pod = mutated(policy, {"gpu-fraction": "0.5"})
    assert pod["metadata"]["labels"]["gpushare.io/gpu-memory-mib"] == "40960"
    applied = yaml.safe_load(pod["metadata"]["annotations"]["gpushare.io/applied"])
    assert applied["gpuMemoryMiB"] == 40960


@pytest.mark.parametrize(
    ("example", "annotations", "milli"),
    [
        ("hami.yaml", {"gpu-fraction": "0.5"}, 500),
        ("aws-vgpu.yaml", {"gpu-fraction": "0.5"}, 500),
        ("tencent-vcuda.yaml", {"gpu-fraction": "0.25"}, 250),
        ("aliyun-gpushare.yaml", {"gpu-fraction": "0.5"}, 500),
        ("dra.yaml", {"gpu-fraction": "0.5"}, 500),
        ("kai.yaml", {"gpu-fraction": "0.5"}, 500),
        ("mps.yaml", {"gpu-fraction": "0.5"}, 500),
        ("mps-daemon.yaml", {"gpu-fraction": "0.25"}, 300),  # allocation count: 3 tenths
    ],
)
def test_every_scheme_counts_in_gpu_share(
    example: str, annotations: dict[str, str], milli: int
) -> None:
    """The same unit whatever the scheme's own (memory units, vGPUs, vcuda cores, claims)."""
    documents = list(yaml.safe_load_all((EXAMPLES / example).read_text()))
    for document in documents:
        if document.get("kind") == "GpuSharingPolicy":
            document["spec"]["quota"] = {"shareResource": True}
    text = yaml.safe_dump_all(documents)
    policies = load_policy_texts([(example, text)])
    decision = plan_pod(make_pod(annotations), "default", policies)
    if not isinstance(decision, Planned):
        # An example scoped to its own namespaces: ask in the first one it names.
        namespace = policies.policies[0].match.namespaces[0]
        decision = plan_pod(make_pod(annotations), namespace, policies)
    assert isinstance(decision, Planned), decision
    assert decision.record["milliGpus"] == milli


def test_rules_declared_quotas_need_the_share_resource() -> None:
    with pytest.raises(PolicyError, match=r"only with quota\.shareResource: true"):
        policies_from(simple_policy(quota={"namespaces": {"team-a": "4"}}))
    policies = policies_from(
        simple_policy(quota={"shareResource": True, "namespaces": {"a": "1.5"}})
    )
    assert policies.policies[0].quota.namespaces == {"a": 1500}


def test_rules_a_namespace_quota_declared_once() -> None:
    first = simple_policy("one", quota={"shareResource": True, "namespaces": {"a": "1"}})
    second = policy_doc(
        "two",
        mode="time-slicing",
        pools=[{"name": "half", "replicas": 2}],
        match={"namespaces": ["a"]},
        quota={"shareResource": True, "namespaces": {"a": "2"}},
    )
    with pytest.raises(PolicyError, match="has its quota declared by policy 'one' too"):
        policies_from(first, second)


@pytest.mark.parametrize("gpus", ["-1", "1.2345", "abc", "1e3"])
def test_rules_gpus_are_decimal_to_the_thousandth(gpus: str) -> None:
    with pytest.raises(PolicyError):
        policies_from(simple_policy(quota={"shareResource": True, "namespaces": {"a": gpus}}))


# -- Kueue ----------------------------------------------------------------------------------


def kueue_job(fraction: str = "0.5", queue: str | None = "team-a") -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "team-a", "labels": labels},
        "spec": {
            "suspend": True,
            "template": {
                "metadata": {"annotations": {"gpu-fraction": fraction}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "pytorch/pytorch:2.10.0-cuda12.8-cudnn9-runtime"}
                    ],
                },
            },
        },
    }


def charge_of(job: dict[str, Any], policy: dict[str, Any]) -> Any:
    kind = workload_kind(job["apiVersion"].rpartition("/")[0], job["kind"])
    assert kind is not None
    checked = check_workload(job, kind, "team-a", policies_from(policy))
    assert checked is not None
    return kueue_charge(checked)


def test_kueue_job_template_gets_the_share() -> None:
    job = kueue_job()
    charge = charge_of(job, simple_policy(quota={"shareResource": True}))
    patched = jsonpatch.apply_patch(copy.deepcopy(job), charge.patch)
    container = patched["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"limits": {SHARE: "500"}, "requests": {SHARE: "500"}}
    # Nothing else of the template changes: the pods get the rest at creation.
    container.pop("resources")
    assert patched == job
    assert charge.warnings == ()


def test_kueue_template_charge_is_idempotent_and_the_pod_agrees() -> None:
    policy = simple_policy(quota={"shareResource": True})
    job = jsonpatch.apply_patch(kueue_job(), charge_of(kueue_job(), policy).patch)
    assert charge_of(job, policy).patch == []
    # The pod the Job controller makes from the charged template gets the same value.
    template = job["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template["metadata"],
        "spec": template["spec"],
    }
    verdict = mutate(pod, "team-a", policies_from(policy))
    assert verdict.allowed
    result = jsonpatch.apply_patch(copy.deepcopy(pod), verdict.patch)
    assert result["spec"]["containers"][0]["resources"]["limits"][SHARE] == "500"


def test_kueue_without_share_resource_warns() -> None:
    charge = charge_of(kueue_job(), simple_policy())
    assert charge.patch == []
    assert "charges this template no GPU share" in charge.warnings[0]
    assert "quota.shareResource" in charge.warnings[0]


def test_not_kueue_managed_untouched() -> None:
    charge = charge_of(kueue_job(queue=None), simple_policy(quota={"shareResource": True}))
    assert charge.patch == [] and charge.warnings == ()


def test_kueue_denied_template_not_charged() -> None:
    charge = charge_of(kueue_job("0.9"), simple_policy(quota={"shareResource": True}))
    assert charge.patch == []


def test_kueue_template_share_set_by_hand_is_overwritten() -> None:
    """A template cannot ask Kueue for less than its pods will hold."""
    job = kueue_job()
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"limits": {SHARE: "1"}, "requests": {SHARE: "1"}}
    charge = charge_of(job, simple_policy(quota={"shareResource": True}))
    patched = jsonpatch.apply_patch(copy.deepcopy(job), charge.patch)
    resources = patched["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"limits": {SHARE: "500"}, "requests": {SHARE: "500"}}
