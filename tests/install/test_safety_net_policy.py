"""The safety-net ValidatingAdmissionPolicy as generated: valid objects, a stable layout, the
policies' facts baked right, and the selection CEL choosing what the webhook chooses.

The CEL of the checks themselves uses Kubernetes' own libraries (optional fields, regex
``find``, list ``indexOf``), which no Python CEL implements: tests/e2e/test_safety_net_policy.py
runs every check in the real kube-apiserver. Here celpy evaluates the selection expression,
which is plain CEL, against ``select_policy`` on many namespaces and label sets.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml

from webhook.cli import main
from webhook.core import load_policies, load_policy_text
from webhook.core.policy.model import PolicySet
from webhook.core.policy.selection import select_policy
from webhook.install.certs import write_certificates
from webhook.install.device_checks import DEVICE_FILTER
from webhook.install.policy_facts import (
    EnvLimit,
    glob_regex,
    policy_facts,
    selection_expression,
)
from webhook.install.validating_policy import (
    SafetyNetError,
    SafetyNetSettings,
    check_actions,
    safety_net,
)
from webhook.install.webhook_config import not_mirror_pod_expression, shared_gpu_pod_expression

REPO = Path(__file__).resolve().parents[2]
KUBERNETES_VERSION = "1.30.0"  # ValidatingAdmissionPolicy is GA (v1) from 1.30

SELECTION_POLICIES = """
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingSettings
metadata: {name: settings}
spec:
  excludeNamespaces: [kube-system, "sandbox-*"]
---
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: fallback}
spec: {default: true, mode: time-slicing, pools: [{name: half, replicas: 2}]}
---
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: low-default}
spec: {default: true, priority: -5, mode: time-slicing, pools: [{name: half, replicas: 2}]}
---
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: ml-glob}
spec:
  match: {namespaces: ["ml-*"], excludeNamespaces: ["ml-legacy"]}
  mode: time-slicing
  pools: [{name: half, replicas: 2}]
---
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: ml-exact}
spec:
  match: {namespaces: ["ml-prod", "team-[ab]?"]}
  mode: time-slicing
  pools: [{name: half, replicas: 2}]
---
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: urgent}
spec:
  priority: 10
  match: {namespaces: ["*"], podLabels: {tier: urgent}}
  mode: time-slicing
  pools: [{name: half, replicas: 2}]
  directResourceRequests: allow
"""

NAMESPACES = [
    "default", "kube-system", "sandbox-1", "ml-prod", "ml-dev", "ml-legacy", "team-a1",
    "team-c1", "team-ab", "ml-", "prod-ml-x",
]  # fmt: skip
LABEL_SETS: list[dict[str, str]] = [{}, {"tier": "urgent"}, {"tier": "batch"}]


@pytest.fixture
def ca_file(tmp_path: Path) -> Path:
    return write_certificates(tmp_path / "certs", ["gpushare"]).ca_cert


def printed(ca_file: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> list[Any]:
    code = main(["webhook-config", "--ca", str(ca_file), "--url", "https://127.0.0.1:8443", *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return [d for d in yaml.safe_load_all(captured.out) if d]


def policies_for_selection() -> PolicySet:
    return load_policy_text(SELECTION_POLICIES)


# -- the selection: which policy governs ----------------------------------------------------


@pytest.mark.parametrize(
    "pattern", ["ml-*", "team-[ab]?", "team-[!ab]*", "a?c", "x.y", "[", "lab-[x", "*"]
)
def test_glob_regex_matches_what_fnmatch_matches(pattern: str) -> None:
    names = ["ml-", "ml-x", "team-a1", "team-c1", "team-ab", "abc", "aXc", "x.y", "xzy", "["]
    names += ["lab-[x", "lab-x"]
    regex = re.compile(glob_regex(pattern))
    for name in names:
        assert bool(regex.search(name)) == fnmatch.fnmatchcase(name, pattern), (pattern, name)


def test_the_selection_cel_chooses_what_the_webhook_chooses() -> None:
    policies = policies_for_selection()
    environment = celpy.Environment()
    program = environment.program(environment.compile(selection_expression(policies)))
    for namespace, labels in itertools.product(NAMESPACES, LABEL_SETS):
        activation = {"variables": celpy.json_to_cel({"podNamespace": namespace, "labels": labels})}
        chosen = select_policy(policies, namespace, labels).policy
        assert str(program.evaluate(activation)) == (chosen.name if chosen else ""), (
            namespace,
            labels,
        )


# -- the facts baked in ---------------------------------------------------------------------


def test_the_facts_are_those_of_the_webhooks_plan() -> None:
    policies = load_policies(REPO / "policies/examples/mps.yaml")
    (policy,) = policies.policies
    facts = policy_facts(policies)

    key = f"ml-mps@{policy.version}"
    assert facts.versions == (key,)
    assert facts.denied_resources == {"ml-mps": "nvidia.com/gpu.shared"}
    assert facts.node_selectors[f"{key}/mps-4"] == {
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "mps",
    }
    # One slot of mps-4 is a quarter of an 80 GiB GPU: the most a pod there may be given.
    # The driver's limit (enforcement.driverMemoryLimit: auto, the pool declares its memory)
    # is bare MiB, checked as a bound like the MPS thread percentage.
    assert facts.env_limits[f"{key}/mps-4/1"] == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": EnvLimit(bound=25),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": EnvLimit("0=", "M", 20480),
        "NVIDIA_GPU_MEMORY_REQUEST": EnvLimit(bound=20480),
        "NVIDIA_GPU_MEMORY_LIMIT": EnvLimit(bound=20480),
    }
    assert facts.env_limits[f"{key}/mps-2/2"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"].bound == 100
    assert facts.device_denied == ("ml-mps",)


ENFORCED_POLICY = """
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: enforced}
spec:
  default: true
  mode: time-slicing
  gpuMemory: 16Gi
  pools:
    - {name: t4, replicas: 4, nodeSelector: {nvidia.com/gpu.product: Tesla-T4}}
    - {name: any, replicas: 2}
  enforcement:
    driverMemoryLimit: require
    reservedMemory: {default: 256Mi, products: {Tesla-T4: 450Mi}}
---
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: open}
spec:
  match: {namespaces: [open]}
  mode: time-slicing
  pools: [{name: half, replicas: 2}]
  enforcement: {deviceVariables: allow, driverMemoryLimit: "off"}
"""


def test_the_driver_limit_is_bounded_by_the_usable_share_and_require_selects_enforcing_nodes() -> (
    None
):
    """What a GPU leaves to pods (its memory less the reservation of its model) is shared
    out: one T4 slot is a quarter of 16384 - 450 MiB; the enforcing-node label is part of
    every pool's selector under require, and the device variables are refused but where a
    policy allows them."""
    policies = load_policy_text(ENFORCED_POLICY)
    facts = policy_facts(policies)
    enforced, _ = policies.policies
    key = f"enforced@{enforced.version}"

    assert facts.env_limits[f"{key}/t4/1"] == {
        "NVIDIA_GPU_MEMORY_REQUEST": EnvLimit(bound=(16384 - 450) // 4),
        "NVIDIA_GPU_MEMORY_LIMIT": EnvLimit(bound=(16384 - 450) // 4),
    }
    assert facts.env_limits[f"{key}/any/1"]["NVIDIA_GPU_MEMORY_LIMIT"].bound == (16384 - 256) // 2
    for pool in ("t4", "any"):
        assert facts.node_selectors[f"{key}/{pool}"]["gpushare.io/driver-memory-limit"] == "true"
    assert not [k for k in facts.env_limits if k.startswith("open@")]
    assert facts.device_denied == ("enforced",)


def test_time_slicing_has_no_env_limits_and_a_policy_allowing_hand_asks_is_not_denied() -> None:
    facts = policy_facts(policies_for_selection())
    assert facts.env_limits == {}
    assert "urgent" not in facts.denied_resources
    assert set(facts.denied_resources) == {"fallback", "low-default", "ml-glob", "ml-exact"}


# -- the printed objects --------------------------------------------------------------------


def test_webhook_config_prints_the_policy_and_binding_in_a_stable_order(
    ca_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The layout other tools (the Helm chart) rely on: kinds in apply order, one name."""
    documents = printed(ca_file, "--policies", str(REPO / "policies"), capsys=capsys)

    assert [(d["kind"], d["metadata"]["name"]) for d in documents] == [
        ("MutatingWebhookConfiguration", "gpushare"),
        ("ValidatingAdmissionPolicy", "gpushare"),
        ("ValidatingAdmissionPolicyBinding", "gpushare"),
        ("ValidatingWebhookConfiguration", "gpushare"),
    ]
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    policy, binding = documents[1], documents[2]
    assert binding["spec"] == {"policyName": "gpushare", "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert ["messageExpression" in v for v in policy["spec"]["validations"]] == [
        False, True, True, True, True, True, True,
    ]  # fmt: skip
    # No declared variables: the apiserver builds an accessor for each on every evaluation,
    # the matchCondition's too; each validation binds what it needs.
    assert "variables" not in policy["spec"]
    for validation in policy["spec"]["validations"]:
        for field in ("expression", "messageExpression"):
            assert "variables." not in validation.get(field, "")
    # The policy's filters are the webhooks': same namespaces, same pods.
    mutating = documents[0]["webhooks"][0]
    assert policy["spec"]["matchConstraints"]["namespaceSelector"] == mutating["namespaceSelector"]
    # One condition: the webhooks' pod filters, or (the bundled policy refusing the device
    # variables in every pod it governs) a device variable set, then the checks, so only a
    # pod some check refuses reaches the checks and their messages.
    conditions = policy["spec"]["matchConditions"]
    assert [c["name"] for c in conditions] == ["fails-a-check"]
    filters = (
        f"((({not_mirror_pod_expression()}) && "
        f"({shared_gpu_pod_expression(('nvidia.com/gpu.shared',))})) || ({DEVICE_FILTER})) && "
    )
    assert conditions[0]["expression"].startswith(filters)
    assert "variables." not in conditions[0]["expression"]
    webhooks = [w["name"] for w in documents[3]["webhooks"]]
    assert webhooks[:3] == [
        "workloads.gpushare.io",
        "cronjobs.gpushare.io",
        "podtemplates.gpushare.io",
    ]
    assert printed(ca_file, "--policies", str(REPO / "policies"), capsys=capsys) == documents


def test_under_ignore_the_policy_lets_unmutated_pods_through_but_not_hand_asks(
    ca_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--failure-policy Ignore: the apiserver admits an annotated pod unmutated while the
    webhook does not answer, and the net printed with it no longer refuses it for that; the
    rest of the checks are those printed for Fail. (The CEL runs in the real apiserver in
    tests/e2e/test_webhook_failure.py.)"""
    policies = ("--policies", str(REPO / "policies"))
    fail = printed(ca_file, *policies, capsys=capsys)[1]["spec"]
    ignore = printed(ca_file, *policies, "--failure-policy", "Ignore", capsys=capsys)[1]["spec"]

    assert (fail["failurePolicy"], ignore["failurePolicy"]) == ("Fail", "Ignore")
    assert "was never mutated by gpushare" in fail["validations"][0]["message"]
    assert fail["validations"][1:] != ignore["validations"]
    assert [v["message"] for v in fail["validations"][1:]] == [
        v["message"] for v in ignore["validations"]
    ]
    assert not [v for v in ignore["validations"] if "never mutated" in v["message"]]
    # The hand-ask check reads annotated pods too, but for mutated ones and KAI's.
    assert "'kai-scheduler'" in ignore["validations"][1]["expression"]
    assert "did not mutate this pod" in ignore["validations"][1]["messageExpression"]
    assert ignore["matchConstraints"] == fail["matchConstraints"]
    assert ignore["matchConditions"] != fail["matchConditions"]


def test_the_pod_validating_webhook_is_opt_in(
    ca_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    both = printed(ca_file, "--validating-webhook", "pods", capsys=capsys)
    assert next(w["name"] for w in both[-1]["webhooks"]) == "validate.gpushare.io"
    assert [d["kind"] for d in both][1:3] == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]

    webhook_only = printed(
        ca_file, "--validating-webhook", "pods", "--no-safety-net-policy", capsys=capsys
    )
    assert [d["kind"] for d in webhook_only] == [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ]

    nothing_validating = printed(ca_file, "--validating-webhook", "none", capsys=capsys)
    assert [d["kind"] for d in nothing_validating] == [
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]


def test_warn_and_audit_try_the_policy_out(
    ca_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    documents = printed(
        ca_file, "--validation-action", "Warn", "--validation-action", "Audit", capsys=capsys
    )
    assert documents[2]["spec"]["validationActions"] == ["Warn", "Audit"]


def test_nothing_checking_pods_after_mutation_is_refused(
    ca_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "webhook-config", "--ca", str(ca_file), "--url", "https://127.0.0.1:8443",
            "--no-safety-net-policy",
        ]
    )  # fmt: skip
    assert code == 2
    assert capsys.readouterr().err == (
        "gpushare webhook-config: Without the safety-net policy nothing re-checks pods after "
        "mutation: keep it, or pass --validating-webhook pods.\n"
    )


@pytest.mark.parametrize(
    ("actions", "message"),
    [
        (["Deny", "Warn"], "validationActions Deny and Warn together are refused"),
        (["Block"], "validation action 'Block' is not one of Deny, Warn, Audit."),
        ([], "Name at least one validation action"),
    ],
)
def test_validation_actions_the_apiserver_refuses_are_refused_here(
    actions: list[str], message: str
) -> None:
    with pytest.raises(SafetyNetError, match=re.escape(message)):
        check_actions(actions)
    assert check_actions(["Deny", "Audit", "Deny"]) == ("Deny", "Audit")


def test_device_variables_reach_the_checks_only_where_a_policy_refuses_them() -> None:
    """Pods the webhooks never see (no annotation, no shared resource) enter the one
    matchCondition only for a device variable, and only where some policy refuses them;
    KAI's pods are left alone (its binder sets NVIDIA_VISIBLE_DEVICES from a ConfigMap)."""
    settings = SafetyNetSettings(
        name="gpushare",
        failure_policy="Ignore",
        namespace_selector={},
        match_conditions=[{"name": "uses-gpu-share", "expression": "false"}],
        refuse_unmutated=False,
    )
    refusing = safety_net(settings, load_policy_text(ENFORCED_POLICY))[0]["spec"]
    (gate,) = refusing["matchConditions"]
    assert gate["expression"].startswith(f"(((false)) || ({DEVICE_FILTER})) && ")
    # Before the hand ask, as the webhook's validate reports it first.
    assert "NVIDIA_VISIBLE_DEVICES" in refusing["validations"][0]["expression"]
    assert refusing["validations"][0]["reason"] == "Forbidden"
    assert "enforcement.deviceVariables: deny" in refusing["validations"][0]["messageExpression"]
    setters = refusing["validations"][0]["expression"]
    assert "'kai-scheduler'" in setters and "['enforced']" in setters

    (_, allowing) = load_policy_text(ENFORCED_POLICY).policies
    only_open = load_policy_text(ENFORCED_POLICY.split("---")[1])
    assert only_open.policies[0].name == allowing.name
    spec = safety_net(settings, only_open)[0]["spec"]
    assert spec["matchConditions"][0]["expression"].startswith("(false) && ")
    assert "NVIDIA_VISIBLE_DEVICES" not in spec["matchConditions"][0]["expression"]


def test_a_policy_handing_its_pods_to_kai_refuses_no_device_variables() -> None:
    """KAI-Scheduler's pod mutator sets NVIDIA_VISIBLE_DEVICES itself, from a ConfigMap."""
    policies = load_policies(REPO / "policies/examples/kai.yaml")
    assert [p.mode.value for p in policies.policies] == ["kai"]
    assert policy_facts(policies).device_denied == ()
