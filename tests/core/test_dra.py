"""The dra mode: shares as claims on consumable GPU memory, and the templates they name.

The webhook names a template (``template_name``) and ``gpushare dra-templates`` makes the
set (``namespace_templates``); the tests hold the two to each other over every ask a policy
allows, and check what each template asks, selects and configures, what the policy rules
refuse, and that a planned pod planned again changes nothing (reinvocation).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.core.support import POLICIES_DIR, make_pod, policies_from, policy_doc
from webhook import cli
from webhook.constants import APPLIED_ANNOTATION
from webhook.core import Denied, Planned, PolicySet
from webhook.core.modes.dra import (
    CLAIM_NAME,
    claim_template,
    namespace_templates,
    share_mib,
    share_sizes,
    template_name,
)
from webhook.core.planning import plan_pod
from webhook.core.policy.loader import load_policies
from webhook.core.verdict import mutate, mutated_pod
from webhook.errors import PolicyError

DRA_EXAMPLE = POLICIES_DIR / "examples" / "dra.yaml"


def dra_policy(name: str = "gpus", **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "default": True,
        "mode": "dra",
        "gpuMemory": "80Gi",
        "fraction": {"min": 0.1, "max": 1},
    }
    spec.update(overrides)
    return policy_doc(name, **spec)


def planned(pod: dict[str, Any], policies: PolicySet, namespace: str = "team") -> Planned:
    decision = plan_pod(pod, namespace, policies)
    assert isinstance(decision, Planned), decision
    return decision


def admitted(pod: dict[str, Any], policies: PolicySet, namespace: str = "team") -> dict[str, Any]:
    outcome = mutate(pod, namespace, policies)
    assert isinstance(outcome.decision, Planned), outcome.decision
    return mutated_pod(pod, outcome.decision)


def claim_of(pod: dict[str, Any]) -> str:
    (claim,) = pod["spec"]["resourceClaims"]
    assert claim["name"] == CLAIM_NAME
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": CLAIM_NAME}]
    return str(claim["resourceClaimTemplateName"])


# -- shares and template names -----------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "template"),
    [
        ({"gpu-fraction": "0.25"}, "gpushare-gpus-20gi"),
        ({"gpu-fraction": "0.3"}, "gpushare-gpus-24gi"),  # 24Gi exactly
        ({"gpu-fraction": "0.33"}, "gpushare-gpus-27gi"),  # 26.4Gi rounds UP
        ({"gpu-memory": "10500Mi"}, "gpushare-gpus-11gi"),
        ({"gpu-memory": "16Gi"}, "gpushare-gpus-16gi"),
        ({"gpu-memory": "20000"}, "gpushare-gpus-20gi"),  # a bare number is MiB
        ({"gpu-fraction": "1"}, None),  # one whole GPU: nvidia.com/gpu, no claim
        ({"gpu-fraction": "0.25", "gpu-memory": "20Gi"}, "gpushare-gpus-20gi"),
    ],
)
def test_each_ask_names_the_template_of_its_share_rounded_up(
    annotations: dict[str, str], template: str | None
) -> None:
    pod = admitted(make_pod(annotations), policies_from(dra_policy()))
    if template is None:
        assert "resourceClaims" not in pod["spec"]
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        return
    assert claim_of(pod) == template


def test_a_finer_granularity_names_mib_templates_and_never_rounds_down() -> None:
    policies = policies_from(
        dra_policy(dra={"granularity": "256Mi"}, fraction={"min": 0.1, "max": 0.5})
    )
    pod = admitted(make_pod({"gpu-memory": "10500Mi"}), policies)
    assert claim_of(pod) == "gpushare-gpus-10752mi"  # 42 x 256Mi >= 10500Mi > 41 x 256Mi
    record = json.loads(pod["metadata"]["annotations"][APPLIED_ANNOTATION])
    assert record["memory"] == "10752Mi"
    assert record["claimTemplate"] == "gpushare-gpus-10752mi"


def test_the_largest_share_is_capped_at_the_declared_memory() -> None:
    """81559Mi (an H100 as NVML reports it) rounded up to 1Gi would be 80Gi, more than the
    GPU has: the share stays at the declared memory."""
    policies = policies_from(dra_policy(gpuMemory="81559Mi"))
    (policy,) = policies.policies
    assert share_sizes(policy)[-1] == 81559
    assert share_mib(policy.dra, 81559) == 81559


def test_every_ask_the_policy_allows_names_a_template_the_generator_makes() -> None:
    """The webhook and the generator agree by construction: over every MiB ask from the
    smallest to the largest share, and every hundredth of a GPU, the named template is in
    the generated set, and every generated template is named by some ask."""
    policies = policies_from(dra_policy(fraction={"min": 0.05, "max": 0.9}))
    (policy,) = policies.policies
    generated = {t["metadata"]["name"] for t in namespace_templates(policies, "team")}
    assert len(generated) == len(share_sizes(policy)) == 72 - 4 + 1  # 5Gi..73Gi (72.9 up)
    named: set[str] = set()
    asks = [{"gpu-memory": f"{mib}Mi"} for mib in range(4096, 73729, 97)]
    asks += [{"gpu-fraction": f"{hundredths / 100}"} for hundredths in range(5, 91)]
    for ask in asks:
        decision = plan_pod(make_pod(ask), "team", policies)
        if isinstance(decision, Denied):
            continue
        named.add(decision.record["claimTemplate"])
    assert named <= generated
    assert generated - named == set()


def test_templates_go_only_where_the_policy_may_govern() -> None:
    policies = policies_from(
        dra_policy(
            "gpus", default=False, match={"namespaces": ["ml-*"], "excludeNamespaces": ["ml-x"]}
        ),
        policy_doc(
            "rest",
            default=True,
            mode="time-slicing",
            pools=[{"name": "half", "replicas": 2}],
        ),
    )
    assert namespace_templates(policies, "ml-a")
    assert namespace_templates(policies, "ml-x") == []
    assert namespace_templates(policies, "web") == []
    assert namespace_templates(policies, "kube-system") == []


# -- what a template asks for --------------------------------------------------------------


def test_a_template_asks_the_share_as_capacity_on_the_policy_class_with_its_selectors() -> None:
    policies = policies_from(
        dra_policy(
            dra={
                "deviceClassName": "gpu.nvidia.com",
                "selectors": {
                    "productNames": ["NVIDIA H100 80GB HBM3", "it's \\ odd"],
                    "architectures": ["Hopper", "Blackwell"],
                    "minGpuMemory": "40Gi",
                },
            }
        )
    )
    (policy,) = policies.policies
    template = claim_template(policy, 20 * 1024, "team")
    assert template["metadata"] == {
        "name": "gpushare-gpus-20gi",
        "namespace": "team",
        "labels": {"app.kubernetes.io/managed-by": "gpushare", "gpushare.io/policy": "gpus"},
        "annotations": {"gpushare.io/share": "20Gi"},
    }
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["name"] == "gpu"
    exactly = request["exactly"]
    assert exactly["deviceClassName"] == "gpu.nvidia.com"
    assert exactly["capacity"] == {"requests": {"memory": "20Gi"}}
    expressions = [s["cel"]["expression"] for s in exactly["selectors"]]
    attributes = "device.attributes['gpu.nvidia.com']"
    assert expressions == [
        f"'productName' in {attributes} && {attributes}.productName in "
        "['NVIDIA H100 80GB HBM3', 'it\\'s \\\\ odd']",
        f"'architecture' in {attributes} && {attributes}.architecture in ['Hopper', 'Blackwell']",
        "'memory' in device.capacity['gpu.nvidia.com'] && "
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
    ]
    assert "config" not in template["spec"]["spec"]["devices"]  # strategy None: no GpuConfig


@pytest.mark.parametrize(
    ("sharing", "mps", "expected"),
    [
        ({"strategy": "TimeSlicing"}, {}, {"strategy": "TimeSlicing"}),
        (
            {"strategy": "TimeSlicing", "timeSlicingInterval": "Long"},
            {},
            {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
        ),
        (
            {"strategy": "MPS"},
            {},
            {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 25,
                    "defaultPinnedDeviceMemoryLimit": "20Gi",
                },
            },
        ),
        (
            {"strategy": "MPS"},
            {"threadOverprovision": 2, "enforceMemoryLimit": False},
            {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
        ),
    ],
)
def test_the_sharing_config_is_nvidia_gpuconfig(
    sharing: dict[str, str], mps: dict[str, Any], expected: dict[str, Any]
) -> None:
    policies = policies_from(dra_policy(dra={"sharing": sharing}, mps=mps))
    (policy,) = policies.policies
    (config,) = claim_template(policy, 20 * 1024, "team")["spec"]["spec"]["devices"]["config"]
    assert config == {
        "requests": ["gpu"],
        "opaque": {
            "driver": "gpu.nvidia.com",
            "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": expected,
            },
        },
    }


def test_mps_on_nvidia_consumable_shares_is_admitted_with_a_warning() -> None:
    decision = planned(
        make_pod({"gpu-fraction": "0.5"}),
        policies_from(dra_policy(dra={"sharing": {"strategy": "MPS"}})),
    )
    assert any("refuse when preparing the claim" in w for w in decision.warnings)


# -- reinvocation and refusals ----------------------------------------------------------------


def test_a_planned_pod_planned_again_changes_nothing() -> None:
    policies = policies_from(dra_policy())
    pod = make_pod({"gpu-fraction": "0.25"})
    once = admitted(pod, policies)
    outcome = mutate(once, "team", policies)
    assert outcome.patch == []
    assert mutated_pod(once, outcome.decision) == once


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {"gpu-fraction": "0.05"},
            "gpu-fraction \"0.05\" is below the smallest share policy 'gpus' allows (0.1): "
            "ask for at least that much.",
        ),
        (
            {"gpu-memory": "4Gi"},
            "gpu-memory \"4Gi\" (0.05 of the 80Gi GPU policy 'gpus' declares) is below the "
            "smallest share policy 'gpus' allows (0.1): ask for at least that much.",
        ),
        (
            {"gpu-fraction": "0.25", "gpu-memory": "30Gi"},
            "gpu-fraction \"0.25\" means 20480Mi of the 80Gi policy 'gpus' declares per GPU, "
            'but gpu-memory says "30Gi": keep only one of the two.',
        ),
    ],
)
def test_asks_the_mode_cannot_give_are_denied_with_the_reason(
    annotations: dict[str, str], message: str
) -> None:
    decision = plan_pod(make_pod(annotations), "team", policies_from(dra_policy()))
    assert isinstance(decision, Denied)
    assert decision.reasons == (message,)


def test_the_policy_max_is_enforced_on_memory_asks() -> None:
    policies = policies_from(dra_policy(fraction={"min": 0.1, "max": 0.5}))
    decision = plan_pod(make_pod({"gpu-memory": "41Gi"}), "team", policies)
    assert isinstance(decision, Denied)
    assert "is above the largest share policy 'gpus' allows (0.5)" in decision.reasons[0]


# -- policy rules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (
            {"gpuMemory": None},
            "mode dra asks for each share as GPU memory, so it needs the memory of one GPU "
            "that gpu-fraction is a share of: set gpuMemory (e.g. 80Gi)",
        ),
        (
            {"pools": [{"name": "half", "replicas": 2}]},
            "spec.pools: mode dra shares GPUs through the scheduler's DRA allocation, not "
            "device-plugin pools: remove pools",
        ),
        (
            {"dra": {"granularity": "1Mi"}},
            "spec.dra.granularity: about 73729 share sizes between fraction.min and "
            "fraction.max at this granularity, each a ResourceClaimTemplate in every "
            "namespace (at most 256): raise dra.granularity to at least 288Mi or narrow "
            "fraction",
        ),
        (
            {"dra": {"granularity": "100Gi"}},
            "spec.dra.granularity: granularity '100Gi' is more than a whole GPU (80Gi): make "
            "it a part of gpuMemory, such as 1Gi",
        ),
        (
            {"dra": {"driver": "hami.io", "sharing": {"strategy": "MPS"}}},
            "spec.dra.sharing.strategy: sharing.strategy MPS is sent as NVIDIA's GpuConfig, "
            "which driver 'hami.io' does not read: use strategy None",
        ),
        (
            {"dra": {"sharing": {"timeSlicingInterval": "Long"}}},
            "spec.dra.sharing.timeSlicingInterval: timeSlicingInterval needs "
            "sharing.strategy TimeSlicing",
        ),
        (
            {"dra": {"selectors": {"minGpuMemory": "40000"}}},
            "spec.dra.selectors.minGpuMemory: '40000' is 40000 bytes (no unit: bytes); "
            "write 40000Mi for MiB",
        ),
        ({"dra": {"sharing": {"strategy": "Exclusive"}}}, "'Exclusive' is not one of None"),
    ],
)
def test_the_rules_refuse_what_the_mode_cannot_express(
    overrides: dict[str, Any], problem: str
) -> None:
    document = dra_policy(**overrides)
    document["spec"] = {k: v for k, v in document["spec"].items() if v is not None}
    with pytest.raises(PolicyError) as error:
        policies_from(document)
    assert any(problem in line for line in error.value.problems), error.value.problems


def test_dra_settings_belong_to_the_dra_mode_only() -> None:
    document = policy_doc(
        "p", default=True, mode="time-slicing", pools=[{"name": "h", "replicas": 2}], dra={}
    )
    with pytest.raises(PolicyError) as error:
        policies_from(document)
    assert any(
        "dra settings apply only to mode dra: remove them" in p for p in error.value.problems
    )


def test_the_example_policy_loads_and_its_templates_print(
    capsys: pytest.CaptureFixture[str],
) -> None:
    (policy,) = load_policies(DRA_EXAMPLE).policies
    assert len(share_sizes(policy)) == 77  # 4Gi .. 80Gi
    assert template_name(policy, 4096) == "gpushare-dra-h100-4gi"
    code = cli.main(["dra-templates", "--policies", str(DRA_EXAMPLE), "-n", "gpu-dra-a,web"])
    assert code == 0
    out, err = capsys.readouterr()
    documents = list(yaml.safe_load_all(out))
    assert [d["metadata"]["name"] for d in documents][:2] == [
        "gpushare-dra-h100-4gi",
        "gpushare-dra-h100-5gi",
    ]
    assert {d["metadata"]["namespace"] for d in documents} == {"gpu-dra-a"}
    assert "# no dra policy may govern namespace 'web'" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["dra-templates"], "name the namespaces with --namespace NS, or use --apply"),
        (["dra-templates", "--watch", "-n", "a"], "--watch needs --apply"),
        (["dra-templates", "--apply", "--listen", ":9402"], "--listen needs --watch"),
        (
            ["dra-templates", "--apply", "--watch", "--listen", "9402"],
            "--listen '9402' is not HOST:PORT (e.g. 0.0.0.0:9402)",
        ),
    ],
)
def test_dra_templates_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--policies", str(DRA_EXAMPLE)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
