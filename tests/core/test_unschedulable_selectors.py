"""Pods that could never schedule: what gpushare makes a pod select against what the pod
selects itself (its nodeSelector, its required node affinity).

A GPU model's memory is what the policies declare for it (a pool's ``gpuMemory`` beside a
GPU model label in its ``nodeSelector``) or what GFD's ``nvidia.com/gpu.memory`` says; an
unknown model refuses nothing. The L4 figure is NVML's (23034 MiB, as GFD labels it).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from webhook.constants import GFD_MEMORY_LABEL, GFD_PRODUCT_LABEL, GKE_ACCELERATOR_LABEL
from webhook.core import PolicySet, mutate, mutated_pod, node_constraints
from webhook.core.verdict import Verdict

from .support import make_pod, policies_from, policy_doc, simple_policy

L4, H100, A10 = "NVIDIA-L4", "NVIDIA-H100-80GB-HBM3", "NVIDIA-A10"
L4_MIB = 23034
REPLICAS = "nvidia.com/gpu.replicas"
STRATEGY = "nvidia.com/gpu.sharing-strategy"


def _catalog(**extra: Any) -> dict[str, Any]:
    """A policy for another namespace whose pools declare their GPU models' memory: what
    tells the webhook the memory of a model the pod selects."""
    pools = [
        {"name": "l4-half", "replicas": 2, "gpuMemory": f"{L4_MIB}Mi"}
        | {"nodeSelector": {GFD_PRODUCT_LABEL: L4}},
        {"name": "h100-half", "replicas": 2, "gpuMemory": "80Gi"}
        | {"nodeSelector": {GFD_PRODUCT_LABEL: H100}},
        {"name": "gke-l4", "replicas": 2, "gpuMemory": "24Gi"}
        | {"nodeSelector": {GKE_ACCELERATOR_LABEL: "nvidia-l4"}},
    ]
    return policy_doc(
        "catalog", mode="time-slicing", match={"namespaces": ["catalog"]}, pools=pools, **extra
    )


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    # The pod's policy: pools without gpuMemory (as the bundled default): a gpu-memory ask
    # takes a 1/2 slot on nodes whose GPUs have twice the ask (nvidia.com/gpu.memory Gt).
    return policies_from(simple_policy("gfd"), _catalog())


def _required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    node_terms = [{"matchExpressions": expressions} for expressions in terms]
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": node_terms}
        }
    }


def _in(key: str, *values: str, operator: str = "In") -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


def _verdict(policies: PolicySet, ask: dict[str, str], **spec: Any) -> Verdict:
    return mutate(make_pod(ask, **copy.deepcopy(spec)), "research", policies)


def _denial(verdict: Verdict, code: int = 422) -> str:
    """The one reason; 422 for a pod that could never schedule (it contradicts itself)."""
    assert not verdict.allowed
    assert verdict.code == code, (verdict.code, verdict.reasons)
    (reason,) = verdict.reasons
    return reason


def _memory_affinity(pod: dict[str, Any]) -> list[list[dict[str, Any]]]:
    required = pod["spec"]["affinity"]["nodeAffinity"]
    terms = required["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [term["matchExpressions"] for term in terms]


# -- gpu-memory against the GPU model the pod selects -------------------------------------


def test_a_gfd_product_too_small_for_the_ask_is_refused_with_the_ask_that_fits(
    policies: PolicySet,
) -> None:
    reason = _denial(
        _verdict(policies, {"gpu-memory": "20Gi"}, nodeSelector={GFD_PRODUCT_LABEL: L4})
    )
    assert reason == (
        'gpu-memory "20Gi" needs a GPU with at least 40960Mi (nvidia.com/gpu.memory Gt 40959: '
        "one slot of pool 'half' is 0.5 of a GPU), but the pod selects "
        f"{GFD_PRODUCT_LABEL}={L4} ({L4_MIB}Mi: gpuMemory of pool 'l4-half' of policy "
        "'catalog') in its nodeSelector: ask for at most gpu-memory \"11517Mi\", or drop that "
        "selector."
    )


def test_the_ask_said_to_fit_fits_and_one_mib_more_does_not(policies: PolicySet) -> None:
    selector = {GFD_PRODUCT_LABEL: L4}
    verdict = _verdict(policies, {"gpu-memory": "11517Mi"}, nodeSelector=selector)
    assert verdict.allowed, verdict.reasons
    assert verdict.decision is not None
    pod = mutated_pod(make_pod({"gpu-memory": "11517Mi"}, nodeSelector=selector), verdict.decision)
    (expressions,) = _memory_affinity(pod)
    (gt,) = [e for e in expressions if e["key"] == GFD_MEMORY_LABEL]
    assert int(gt["values"][0]) < L4_MIB  # an L4 passes the affinity gpushare adds
    assert not _verdict(policies, {"gpu-memory": "11518Mi"}, nodeSelector=selector).allowed


def test_the_gfd_product_of_a_shared_resource_is_the_same_model(policies: PolicySet) -> None:
    selector = {GFD_PRODUCT_LABEL: f"{L4}-SHARED"}
    reason = _denial(_verdict(policies, {"gpu-memory": "20Gi"}, nodeSelector=selector))
    assert f"{L4}-SHARED ({L4_MIB}Mi" in reason


def test_gke_s_accelerator_label_is_refused_the_same_way(policies: PolicySet) -> None:
    selector = {GKE_ACCELERATOR_LABEL: "nvidia-l4"}
    reason = _denial(_verdict(policies, {"gpu-memory": "20Gi"}, nodeSelector=selector))
    assert f"pod selects {GKE_ACCELERATOR_LABEL}=nvidia-l4 (24576Mi: gpuMemory of pool " in reason
    assert 'ask for at most gpu-memory "12288Mi", or drop that selector.' in reason


def test_a_required_node_affinity_in_the_small_product_is_refused(policies: PolicySet) -> None:
    affinity = _required([_in(GFD_PRODUCT_LABEL, L4)])
    reason = _denial(_verdict(policies, {"gpu-memory": "20Gi"}, affinity=affinity))
    assert (
        "but the pod's required node affinity admits only "
        f"{GFD_PRODUCT_LABEL} In [{L4}] ({L4_MIB}Mi: gpuMemory of pool 'l4-half' of policy "
        "'catalog'): ask for at most gpu-memory \"11517Mi\", or let it admit a larger GPU."
    ) in reason


@pytest.mark.parametrize(
    "terms",
    [
        [[_in(GFD_PRODUCT_LABEL, L4)], [_in(GKE_ACCELERATOR_LABEL, "nvidia-l4")]],
        [[_in("topology.kubernetes.io/zone", "a"), _in(GFD_PRODUCT_LABEL, L4)]],
        [[_in(GFD_MEMORY_LABEL, "23034", "16384")]],
        [[_in(GFD_MEMORY_LABEL, "30000", operator="Lt")]],
    ],
    ids=["every-term-small", "anded-with-a-zone", "memory-in", "memory-lt"],
)
def test_every_term_admitting_only_smaller_gpus_is_refused(
    policies: PolicySet, terms: list[list[dict[str, Any]]]
) -> None:
    reason = _denial(_verdict(policies, {"gpu-memory": "20Gi"}, affinity=_required(*terms)))
    assert "required node affinity admits only" in reason


@pytest.mark.parametrize(
    "terms",
    [
        [[_in(GFD_PRODUCT_LABEL, L4, H100)]],  # an H100 holds it
        [[_in(GFD_PRODUCT_LABEL, L4)], [_in("topology.kubernetes.io/zone", "a")]],
        [[_in(GFD_PRODUCT_LABEL, L4, A10)]],  # the A10's memory is unknown
        [[_in(GFD_PRODUCT_LABEL, L4, operator="NotIn")]],
    ],
    ids=["one-value-fits", "another-term-is-free", "one-value-unknown", "not-in"],
)
def test_a_term_that_may_admit_a_large_enough_gpu_is_allowed(
    policies: PolicySet, terms: list[list[dict[str, Any]]]
) -> None:
    verdict = _verdict(policies, {"gpu-memory": "20Gi"}, affinity=_required(*terms))
    assert verdict.allowed, verdict.reasons


def test_a_product_that_fits_is_allowed(policies: PolicySet) -> None:
    selector = {GFD_PRODUCT_LABEL: H100}
    verdict = _verdict(policies, {"gpu-memory": "20Gi"}, nodeSelector=selector)
    assert verdict.allowed, verdict.reasons
    assert _verdict(policies, {"gpu-memory": "40Gi"}, nodeSelector=selector).allowed  # = 80Gi
    assert not _verdict(policies, {"gpu-memory": "41Gi"}, nodeSelector=selector).allowed


@pytest.mark.parametrize(
    "selector",
    [{GFD_PRODUCT_LABEL: A10}, {GKE_ACCELERATOR_LABEL: "nvidia-tesla-t4"}, {"team": "vision"}],
)
def test_an_unknown_product_is_allowed_and_left_to_the_node_labels(
    policies: PolicySet, selector: dict[str, str]
) -> None:
    verdict = _verdict(policies, {"gpu-memory": "70Gi"}, nodeSelector=selector)
    assert verdict.allowed, verdict.reasons
    assert verdict.decision is not None
    pod = mutated_pod(make_pod({"gpu-memory": "70Gi"}, nodeSelector=selector), verdict.decision)
    assert _memory_affinity(pod) == [[_in(GFD_MEMORY_LABEL, "143359", operator="Gt")]]


def test_the_gfd_memory_label_itself_needs_no_declaration() -> None:
    alone = policies_from(simple_policy("gfd"))  # no pool declares any GPU model
    selector = {GFD_MEMORY_LABEL: str(L4_MIB)}
    reason = _denial(_verdict(alone, {"gpu-memory": "20Gi"}, nodeSelector=selector))
    assert f"pod selects {GFD_MEMORY_LABEL}={L4_MIB} in its nodeSelector: ask for at most" in reason
    assert _verdict(alone, {"gpu-memory": "20Gi"}, nodeSelector={GFD_PRODUCT_LABEL: L4}).allowed


def test_pools_that_disagree_on_a_model_s_memory_count_the_largest() -> None:
    bigger = _catalog()
    bigger["metadata"]["name"] = "catalog-2"
    bigger["spec"]["match"] = {"namespaces": ["other"]}
    bigger["spec"]["pools"][0]["gpuMemory"] = "48Gi"
    both = policies_from(simple_policy("gfd"), _catalog(), bigger)
    selector = {GFD_PRODUCT_LABEL: L4}
    assert _verdict(both, {"gpu-memory": "20Gi"}, nodeSelector=selector).allowed  # 48Gi holds it


def test_the_shipped_examples_know_the_l4_of_the_mps_daemon_example(
    all_examples: PolicySet,
) -> None:
    """default.yaml beside policies/examples/mps-daemon.yaml (an L4 pool, gpuMemory 24Gi)."""
    selector = {GFD_PRODUCT_LABEL: L4}
    reason = _denial(_verdict(all_examples, {"gpu-memory": "20Gi"}, nodeSelector=selector))
    assert "pool 'l4-mps' of policy 'inference-mps-daemon'" in reason
    assert 'ask for at most gpu-memory "12288Mi"' in reason


def test_a_gpu_fraction_ask_is_not_sized_by_the_nodes_and_not_refused(
    policies: PolicySet,
) -> None:
    verdict = _verdict(policies, {"gpu-fraction": "0.5"}, nodeSelector={GFD_PRODUCT_LABEL: L4})
    assert verdict.allowed, verdict.reasons


# -- a label gpushare selects against the pod's own ----------------------------------------


def test_a_selected_label_the_pod_holds_with_another_value_is_refused_naming_both(
    policies: PolicySet,
) -> None:
    verdict = _verdict(policies, {"gpu-fraction": "0.5"}, nodeSelector={REPLICAS: "4"})
    assert _denial(verdict, 403) == (  # as before: forbidden, and it stays so
        f"nodeSelector {REPLICAS}=4 conflicts with {REPLICAS}=2 that the GPU pool chosen by "
        "policy 'gfd' needs: remove it from the pod."
    )


@pytest.mark.parametrize(
    ("expression", "named"),
    [
        (_in(REPLICAS, "4"), f"{REPLICAS} In [4]"),
        (_in(REPLICAS, "2", "1", operator="NotIn"), f"{REPLICAS} NotIn [2, 1]"),
        ({"key": REPLICAS, "operator": "DoesNotExist"}, f"{REPLICAS} DoesNotExist"),
        (_in(REPLICAS, "3", operator="Gt"), f"{REPLICAS} Gt 3"),
        (_in(REPLICAS, "2", operator="Lt"), f"{REPLICAS} Lt 2"),
    ],
)
def test_a_selected_label_the_required_affinity_rules_out_is_refused_naming_both(
    policies: PolicySet, expression: dict[str, Any], named: str
) -> None:
    affinity = _required([_in("topology.kubernetes.io/zone", "a"), expression])
    reason = _denial(_verdict(policies, {"gpu-fraction": "0.5"}, affinity=affinity))
    assert reason == (
        f"the pod's required node affinity ({named}) rules out {REPLICAS}=2, which the GPU "
        f"pool chosen by policy 'gfd' needs: let the affinity admit {REPLICAS}=2, or remove "
        f"{REPLICAS} from it."
    )


def test_with_a_conflict_policy_forbids_every_reason_is_given_under_403(
    policies: PolicySet,
) -> None:
    selector = {REPLICAS: "4", GFD_PRODUCT_LABEL: L4}
    verdict = _verdict(policies, {"gpu-memory": "20Gi"}, nodeSelector=selector)
    assert (verdict.allowed, verdict.code) == (False, 403)
    conflict, too_small = verdict.reasons
    assert conflict.startswith(f"nodeSelector {REPLICAS}=4 conflicts with {REPLICAS}=2")
    assert too_small.startswith('gpu-memory "20Gi" needs a GPU with at least 40960Mi')


def test_every_term_must_rule_it_out(policies: PolicySet) -> None:
    ask = {"gpu-fraction": "0.5"}
    four, eight = _in(REPLICAS, "4"), _in(REPLICAS, "8")
    reason = _denial(_verdict(policies, ask, affinity=_required([four], [eight])))
    assert f"(every nodeSelectorTerm: {REPLICAS} In [4]; {REPLICAS} In [8])" in reason
    for admitting in (
        [_in(REPLICAS, "2", "4")],
        [{"key": REPLICAS, "operator": "Exists"}],
        [_in("topology.kubernetes.io/zone", "a")],
    ):
        verdict = _verdict(policies, ask, affinity=_required([four], admitting))
        assert verdict.allowed, (admitting, verdict.reasons)


def test_a_pool_s_product_the_pod_s_affinity_excludes_is_refused() -> None:
    pools = [{"name": "h100", "replicas": 2, "nodeSelector": {GFD_PRODUCT_LABEL: H100}}]
    h100_only = policies_from(simple_policy("h100", pools=pools))
    affinity = _required([_in(GFD_PRODUCT_LABEL, L4)])
    reason = _denial(_verdict(h100_only, {"gpu-fraction": "0.5"}, affinity=affinity))
    assert f"({GFD_PRODUCT_LABEL} In [{L4}]) rules out {GFD_PRODUCT_LABEL}={H100}" in reason


def test_whole_gpus_select_nodes_the_same_way() -> None:
    whole = {"wholeGpus": {"nodeSelector": {STRATEGY: "none"}}}
    policies = policies_from(simple_policy("gfd", **whole))
    affinity = _required([_in(STRATEGY, "time-slicing")])
    reason = _denial(_verdict(policies, {"gpu-fraction": "1"}, affinity=affinity))
    assert f"rules out {STRATEGY}=none" in reason


# -- cost and hostile input -------------------------------------------------------------------


def test_pods_without_selectors_never_look_at_the_declared_memory(
    policies: PolicySet, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(_: PolicySet) -> node_constraints.DeclaredMemory:
        raise AssertionError("built for a pod without nodeSelector or affinity")

    monkeypatch.setattr(node_constraints, "_declared", refuse)
    fresh = policies_from(simple_policy("gfd"), _catalog())
    assert _verdict(fresh, {"gpu-memory": "20Gi"}).allowed
    assert _verdict(fresh, {"gpu-fraction": "0.5"}).allowed


def test_the_declared_memory_is_built_once_per_policy_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[PolicySet] = []
    real = node_constraints._declared

    def counting(policies: PolicySet) -> node_constraints.DeclaredMemory:
        built.append(policies)
        return real(policies)

    monkeypatch.setattr(node_constraints, "_declared", counting)
    fresh = policies_from(simple_policy("gfd"), _catalog())
    for ask in ("1Gi", "20Gi", "30Gi"):
        _verdict(fresh, {"gpu-memory": ask}, nodeSelector={GFD_PRODUCT_LABEL: L4})
    assert built == [fresh]


@pytest.mark.parametrize(
    "value",
    ["9" * 5000, "-5", "{x}", "12a", "", "٣"],
    ids=["huge", "neg", "brace", "mix", "empty", "digit"],
)
def test_odd_label_values_are_judged_or_left_alone_never_crash(
    policies: PolicySet, value: str
) -> None:
    for spec in (
        {"nodeSelector": {GFD_MEMORY_LABEL: value}},
        {"affinity": _required([_in(GFD_MEMORY_LABEL, value)])},
        {"affinity": _required([_in(GFD_MEMORY_LABEL, value, operator="Lt")])},
        {"affinity": _required([_in(REPLICAS, value, operator="Gt")])},
    ):
        verdict = _verdict(policies, {"gpu-memory": "20Gi"}, **spec)
        assert verdict.allowed or verdict.reasons


def test_long_lists_are_named_in_part(policies: PolicySet) -> None:
    values = [f"v{i}" for i in range(1000)]
    terms = [[_in(REPLICAS, *values)] for _ in range(50)]
    reason = _denial(_verdict(policies, {"gpu-fraction": "0.5"}, affinity=_required(*terms)))
    assert (
        f"(every nodeSelectorTerm: {REPLICAS} In [v0, v1, v2, v3, v4, v5, v6, v7, ...]) " in reason
    )
    assert len(reason) < 600
    many = [[_in(GFD_PRODUCT_LABEL, *[L4] * 1000)]]
    reason = _denial(_verdict(policies, {"gpu-memory": "20Gi"}, affinity=_required(*many)))
    assert len(reason) < 600
