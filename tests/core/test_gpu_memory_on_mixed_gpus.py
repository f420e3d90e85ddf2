"""gpu-memory on clusters of mixed GPU models, sized by GPU Feature Discovery's labels.

GFD labels a node ``nvidia.com/gpu.memory`` with one GPU's memory in MiB (NVML's total /
2^20: k8s-device-plugin v0.20.0, ``internal/lm/resource.go`` and
``internal/resource/nvml-device.go``). The values below are what NVML reports for each
model; note that an "80GB" H100 reports less than 80 GiB.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import jsonpatch
import pytest

from webhook.constants import APPLIED_ANNOTATION
from webhook.core import Planned, PolicySet, mutate, mutated_pod
from webhook.core.placement import Placement, place
from webhook.core.policy.model import Policy
from webhook.core.request import GpuRequest, read_request
from webhook.errors import PolicyError

from .support import assert_valid_kubernetes_pod, make_pod, policies_from, simple_policy

GPU_MEMORY_MIB = {
    "NVIDIA-L4": 23034,
    "NVIDIA-A10": 23028,
    "NVIDIA-A100-SXM4-80GB": 81920,
    "NVIDIA-H100-80GB-HBM3": 81559,
    "NVIDIA-H200": 143771,
}
GFD_MEMORY = "nvidia.com/gpu.memory"


def _policy(**spec: Any) -> Policy:
    return policies_from(simple_policy("p", **spec)).policies[0]


def _ask(text: str) -> GpuRequest:
    request = read_request({"gpu-memory": text})
    assert isinstance(request, GpuRequest), request
    return request


def _placed(policy: Policy, text: str) -> Placement:
    placement = place(policy, _ask(text))
    assert isinstance(placement, Placement), placement
    return placement


def _admit(pod: dict[str, Any], policies: PolicySet) -> dict[str, Any]:
    verdict = mutate(pod, "research", policies)
    assert verdict.allowed, verdict.reasons
    assert verdict.decision is not None
    result = mutated_pod(pod, verdict.decision)
    assert jsonpatch.apply_patch(copy.deepcopy(pod), verdict.patch) == result
    assert mutate(result, "research", policies).patch == [], "not idempotent"
    assert_valid_kubernetes_pod(result)
    return result


def _admits(affinity: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether required node affinity admits a node with these labels, as kube-scheduler
    decides it: terms ORed, expressions ANDed; Gt/Lt compare the label as an integer."""
    required = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]

    def holds(expression: dict[str, Any]) -> bool:
        value = labels.get(expression["key"])
        if expression["operator"] == "In":
            return value in expression["values"]
        assert expression["operator"] == "Gt"
        return value is not None and int(value) > int(expression["values"][0])

    return any(
        all(holds(e) for e in term.get("matchExpressions", ()))
        for term in required["nodeSelectorTerms"]
    )


@pytest.mark.parametrize("ask", ["8000", "5Gi", "10Gi", "20Gi", "20000", "30Gi", "40Gi", "70Gi"])
@pytest.mark.parametrize("product", sorted(GPU_MEMORY_MIB))
def test_the_node_affinity_admits_exactly_the_gpus_whose_slot_holds_the_ask(
    bundled: PolicySet, ask: str, product: str
) -> None:
    """The default policy (pools of 1/2 and 1/4, no gpuMemory): the pod may land on a GPU
    model iff one slot of its pool holds the ask, and the env share is at least the ask
    there and never more than the slot."""
    pod = _admit(make_pod({"gpu-memory": ask}), bundled)
    memory = GPU_MEMORY_MIB[product]
    replicas = int(pod["spec"]["nodeSelector"]["nvidia.com/gpu.replicas"])
    asked = _ask(ask).memory_mib
    assert asked is not None
    admitted = _admits(pod["spec"]["affinity"], {GFD_MEMORY: str(memory)})
    assert admitted == (memory / replicas >= asked)
    if admitted:  # the share env is computed from (framework fractions, MPS threads)
        share = float(json.loads(pod["metadata"]["annotations"][APPLIED_ANNOTATION])["fraction"])
        assert share <= 1 / replicas
        assert share * memory >= asked


def test_the_largest_slice_is_taken_and_the_node_must_hold_replicas_times_the_ask() -> None:
    policy = _policy()  # pools half (2) and quarter (4)
    placement = _placed(policy, "20Gi")
    assert (placement.pool.name, placement.slots, placement.fraction) == ("half", 1, 0.5)
    assert placement.node_gpu_memory_mib == 2 * 20480
    assert placement.memory_mib is None  # no pinned MPS limit from an unknown GPU
    assert "at least 40960Mi (nvidia.com/gpu.memory" in placement.reason


def test_ties_go_to_the_first_pool_listed() -> None:
    pools = [
        {"name": "a", "replicas": 4},
        {"name": "b", "replicas": 2},
        {"name": "c", "replicas": 2},
    ]
    assert _placed(_policy(pools=pools), "1Gi").pool.name == "b"


def test_the_policy_s_largest_share_raises_the_node_memory_and_lowers_the_share() -> None:
    policy = _policy(fraction={"max": 0.25})
    placement = _placed(policy, "8000")
    assert placement.fraction == 0.25
    assert placement.node_gpu_memory_mib == 32000


def test_a_bare_number_is_mib_end_to_end(bundled: PolicySet) -> None:
    """gpu-memory "8000" was 8000 bytes and denied as "0 of a GPU"; it is 8000 MiB."""
    pod = _admit(make_pod({"gpu-memory": "8000"}), bundled)
    (term,) = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term == {
        "matchExpressions": [{"key": GFD_MEMORY, "operator": "Gt", "values": ["15999"]}]
    }
    verdict = mutate(make_pod({"gpu-memory": "8000"}), "research", bundled)
    assert verdict.warnings == ()


def test_a_small_bare_number_is_admitted_with_a_warning(bundled: PolicySet) -> None:
    verdict = mutate(make_pod({"gpu-memory": "16"}), "research", bundled)
    assert verdict.allowed
    assert verdict.warnings == ('gpu-memory "16" is 16 MiB; for GiB write "16Gi"',)
    assert all(len(w) < 120 for w in verdict.warnings)


def test_the_requirement_joins_every_term_the_pod_already_has(bundled: PolicySet) -> None:
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    big = {"key": GFD_MEMORY, "operator": "Gt", "values": ["100000"]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [zone]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]},
                    {"matchExpressions": [big]},
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [zone]}}
            ],
        },
        "podAntiAffinity": {},
    }
    pod = _admit(make_pod({"gpu-memory": "10Gi"}, affinity=copy.deepcopy(affinity)), bundled)
    ours = {"key": GFD_MEMORY, "operator": "Gt", "values": ["20479"]}
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"] == [zone, ours]
    assert terms[1]["matchExpressions"] == [ours]
    assert (
        terms[1]["matchFields"]
        == affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ][1]["matchFields"]
    )
    assert terms[2]["matchExpressions"] == [big, ours]  # the user's own bound is kept: ANDed
    assert pod["spec"]["affinity"]["podAntiAffinity"] == {}
    assert (
        pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        == affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    )


def test_declared_pool_memory_still_decides_exactly_and_first() -> None:
    pools = [
        {"name": "gfd-half", "replicas": 2},
        {"name": "a100-quarter", "replicas": 4, "gpuMemory": "80Gi"},
    ]
    policy = _policy(pools=pools)
    exact = _placed(policy, "20Gi")
    assert (exact.pool.name, exact.node_gpu_memory_mib) == ("a100-quarter", None)
    # Too big for the declared pool: the pool sized by node labels takes it.
    by_nodes = _placed(policy, "30Gi")
    assert (by_nodes.pool.name, by_nodes.node_gpu_memory_mib) == ("gfd-half", 61440)


def test_every_pool_declaring_memory_keeps_today_s_refusal() -> None:
    policy = _policy(gpuMemory="24Gi")
    assert place(policy, _ask("20Gi")) == [
        "gpu-memory \"20Gi\" does not fit any GPU pool: the largest slice policy 'p' offers is "
        "1/2 of a GPU (pool 'half'). Ask for less, or for a whole GPU with gpu-fraction: \"1\"."
    ]


def test_an_ask_no_gpu_can_hold_is_refused() -> None:
    assert place(_policy(), _ask("9" * 20 + "Ti")) == [
        f'gpu-memory "{"9" * 20}Ti" is more than any GPU has: ask for less, or for whole GPUs '
        'with gpu-fraction: "1".'
    ]


def test_count_allocation_takes_one_slot_sized_by_the_nodes() -> None:
    pools = [{"name": "single", "replicas": 4, "gpusPerNode": 1}]
    placement = _placed(_policy(allocation="count", pools=pools), "10Gi")
    assert (placement.slots, placement.node_gpu_memory_mib) == (1, 40960)


def test_the_record_names_the_gpu_memory_a_node_needs(bundled: PolicySet) -> None:
    by_memory = mutate(make_pod({"gpu-memory": "10Gi"}), "research", bundled).decision
    by_fraction = mutate(make_pod({"gpu-fraction": "0.5"}), "research", bundled).decision
    assert isinstance(by_memory, Planned) and isinstance(by_fraction, Planned)
    assert by_memory.record["nodeGpuMemory"] == "20480Mi"
    assert by_memory.record["fraction"] == "0.5"
    assert "nodeGpuMemory" not in by_fraction.record


def test_fraction_asks_get_no_memory_affinity(bundled: PolicySet) -> None:
    pod = _admit(make_pod({"gpu-fraction": "0.5"}), bundled)
    assert "affinity" not in pod["spec"]


@pytest.mark.parametrize("replicas", [2, 3, 7])
def test_node_memory_is_the_smallest_integer_whose_slot_holds_the_ask(replicas: int) -> None:
    pools = [{"name": "only", "replicas": replicas}]
    for ask in ("1", "999", "1000", "4097", "10Gi", "1.5Gi", "16G"):
        asked = _ask(ask).memory_mib
        assert asked is not None
        node = _placed(_policy(pools=pools), ask).node_gpu_memory_mib
        assert node is not None
        assert node / replicas >= asked - 1e-9
        assert (node - 1) / replicas < asked
        assert node == math.ceil(asked * replicas - 1e-9)


def test_a_bare_number_in_a_policy_is_bytes_and_the_problem_says_so() -> None:
    """Policies are Kubernetes quantities (bare = bytes); 81920 copied from GFD's label
    would be 80 KiB, so the loader refuses it and names the fix."""
    with pytest.raises(PolicyError) as problem:
        policies_from(
            simple_policy("p", pools=[{"name": "a", "replicas": 2, "gpuMemory": "81920"}])
        )
    assert "'81920' is 81920 bytes (no unit: bytes); write 81920Mi for MiB" in str(problem.value)
