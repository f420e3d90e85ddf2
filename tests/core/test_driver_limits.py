"""The driver-enforced memory limit (policy ``enforcement``, docs/enforcement.md): the pool
modes write NVIDIA_GPU_MEMORY_REQUEST/LIMIT in whole MiB, a share of what a GPU leaves once
the driver and the CUDA context keep theirs; ``require`` places pods only on enforcing nodes;
a fraction of unknown memory is refused where the limit must be written; ``off`` writes none.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import jsonpatch
import pytest

from webhook.constants import DRIVER_LIMIT_LABEL
from webhook.core.policy.model import PolicySet
from webhook.core.verdict import Verdict, mutate, mutated_pod

from .support import env_values, make_pod, policies_from, simple_policy

H100 = "NVIDIA-H100-80GB-HBM3"
L40S = "NVIDIA-L40S"
PRODUCT = "nvidia.com/gpu.product"


def _policies(enforcement: dict[str, Any] | None = None, **overrides: Any) -> PolicySet:
    spec: dict[str, Any] = {"gpuMemory": "80Gi", **overrides}
    if enforcement is not None:
        spec["enforcement"] = enforcement
    return policies_from(simple_policy(**spec))


def _by_product(reserved: dict[str, Any]) -> PolicySet:
    pools = [
        {"name": name, "replicas": replicas, "gpuMemory": memory, "nodeSelector": {PRODUCT: model}}
        for name, replicas, memory, model in (("h100", 4, "80Gi", H100), ("l40s", 2, "48Gi", L40S))
    ]
    return policies_from(
        simple_policy(pools=pools, enforcement={"reservedMemory": reserved}, fraction={"max": 0.5})
    )


def _admit(policies: PolicySet, annotations: dict[str, str], **pod: Any) -> dict[str, Any]:
    source = make_pod(annotations, **pod)
    outcome = mutate(source, "team", policies)
    assert outcome.allowed, outcome.reasons
    assert outcome.decision is not None
    result = mutated_pod(source, outcome.decision)
    assert jsonpatch.apply_patch(copy.deepcopy(source), outcome.patch) == result
    assert mutate(result, "team", policies).patch == [], "not idempotent"
    return result


def _limits(pod: dict[str, Any]) -> tuple[str | None, str | None]:
    env = env_values(pod)
    return env.get("NVIDIA_GPU_MEMORY_REQUEST"), env.get("NVIDIA_GPU_MEMORY_LIMIT")


def _deny(policies: PolicySet, annotations: dict[str, str]) -> Verdict:
    outcome = mutate(make_pod(annotations), "team", policies)
    assert not outcome.allowed
    return outcome


@pytest.mark.parametrize(
    ("fraction", "mib"),
    [("0.5", "40960"), ("0.25", "20480"), ("0.3", "24576"), ("0.1", "8192")],
)
def test_a_fraction_is_limited_to_its_share_of_the_gpu(fraction: str, mib: str) -> None:
    pod = _admit(_policies(), {"gpu-fraction": fraction})
    assert _limits(pod) == (mib, mib)


def test_the_limit_of_a_fraction_rounds_down_to_a_whole_mib() -> None:
    # 0.3 x (81920 - 1000) = 24276 exactly; 0.33 x 80920 = 26703.6 -> 26703
    policies = _policies({"reservedMemory": {"default": "1000Mi"}})
    assert _limits(_admit(policies, {"gpu-fraction": "0.3"})) == ("24276", "24276")
    assert _limits(_admit(policies, {"gpu-fraction": "0.33"})) == ("26703", "26703")


def test_a_memory_ask_is_its_own_limit_rounded_up_to_a_mib() -> None:
    policies = _policies()
    assert _limits(_admit(policies, {"gpu-memory": "10Gi"})) == ("10240", "10240")
    # 1500M (decimal megabytes) = 1430.5 MiB: never less than asked.
    assert _limits(_admit(policies, {"gpu-memory": "1500M"})) == ("1431", "1431")


def test_a_memory_ask_on_pools_without_gpu_memory_is_still_limited(bundled: PolicySet) -> None:
    """The bundled default declares no gpuMemory (pools sized by the nodes' labels): the
    ask is the limit all the same (auto)."""
    pod = _admit(bundled, {"gpu-memory": "10Gi"})
    assert _limits(pod) == ("10240", "10240")


def test_auto_writes_no_limit_for_a_fraction_of_unknown_memory(bundled: PolicySet) -> None:
    pod = _admit(bundled, {"gpu-fraction": "0.5"})
    assert _limits(pod) == (None, None)
    assert DRIVER_LIMIT_LABEL not in pod["spec"]["nodeSelector"]


def test_reserved_memory_is_kept_per_gpu_model_and_by_default() -> None:
    policies = _by_product({"default": "512Mi", "products": {H100: "1Gi"}})
    h100 = _admit(policies, {"gpu-fraction": "0.25"})
    assert h100["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == H100
    assert _limits(h100) == ("20224", "20224")  # 0.25 x (81920 - 1024)
    l40s = _admit(policies, {"gpu-fraction": "0.5"})
    assert l40s["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == L40S
    assert _limits(l40s) == ("24320", "24320")  # 0.5 x (49152 - 512): the default


def test_a_memory_ask_takes_slots_that_hold_it_once_the_reservation_is_kept() -> None:
    """20Gi is a quarter of 80Gi, but not of the 79Gi an H100 leaves to pods: it takes the
    half slot, and the limit is the ask."""
    policies = _policies({"reservedMemory": {"default": "1Gi"}})
    source = make_pod({"gpu-memory": "20Gi"})
    outcome = mutate(source, "team", policies)
    assert outcome.allowed, outcome.reasons
    record = outcome.decision.record  # type: ignore[union-attr]
    assert (record["pool"], record["fraction"]) == ("half", "0.2531")  # 20480 / 80896
    assert _limits(_admit(policies, {"gpu-memory": "20Gi"})) == ("20480", "20480")
    quarter = mutate(make_pod({"gpu-memory": "19Gi"}), "team", policies)
    assert quarter.decision.record["pool"] == "quarter"  # type: ignore[union-attr]


def test_under_count_a_memory_ask_takes_one_more_slot_rather_than_being_refused() -> None:
    pools = [{"name": "one-gpu", "replicas": 10, "gpusPerNode": 1}]
    policies = _policies(
        {"reservedMemory": {"default": "2Gi"}},
        gpuMemory="24Gi",
        allocation="count",
        pools=pools,
        fraction={"max": 0.9},
    )
    # 7 slots hold 0.7 x (24576 - 2048) = 15769 MiB: 15770Mi needs an eighth.
    record = mutate(make_pod({"gpu-memory": "15770Mi"}), "team", policies).decision.record  # type: ignore[union-attr]
    assert record["slots"] == 8
    assert _limits(_admit(policies, {"gpu-memory": "15769Mi"})) == ("15769", "15769")
    record = mutate(make_pod({"gpu-memory": "15769Mi"}), "team", policies).decision.record  # type: ignore[union-attr]
    assert record["slots"] == 7


def _without_pool_memory(policies: PolicySet, index: int) -> PolicySet:
    """The set with one pool's gpuMemory taken away: the loader refuses that under
    inject/require (test_enforcement_rules), admission must refuse it all the same."""
    (policy,) = policies.policies
    pools = list(policy.pools)
    pools[index] = dataclasses.replace(pools[index], gpu_memory_mib=None)
    return PolicySet((dataclasses.replace(policy, pools=tuple(pools)),))


@pytest.mark.parametrize("setting", ["inject", "require"])
def test_a_fraction_of_unknown_memory_is_refused_where_the_limit_must_be_written(
    setting: str,
) -> None:
    policies = _without_pool_memory(_policies({"driverMemoryLimit": setting}), 1)
    outcome = _deny(policies, {"gpu-fraction": "0.25"})
    assert outcome.code == 403
    assert outcome.reasons == (
        f"gpu-fraction \"0.25\" needs a driver memory limit in MiB (policy 'p': "
        f"enforcement.driverMemoryLimit: {setting}), but pool 'quarter' declares no "
        "gpuMemory, so that share's size is unknown: declare the pool's gpuMemory (or "
        "spec.gpuMemory), or ask with gpu-memory instead.",
    )
    assert _limits(_admit(policies, {"gpu-fraction": "0.5"})) == ("40960", "40960")


def test_require_places_pods_only_on_nodes_that_enforce_the_limit() -> None:
    pod = _admit(_policies({"driverMemoryLimit": "require"}), {"gpu-fraction": "0.5"})
    assert pod["spec"]["nodeSelector"][DRIVER_LIMIT_LABEL] == "true"
    assert _limits(pod) == ("40960", "40960")
    for setting in ("auto", "inject", "off"):
        pod = _admit(_policies({"driverMemoryLimit": setting}), {"gpu-fraction": "0.5"})
        assert DRIVER_LIMIT_LABEL not in pod["spec"]["nodeSelector"]


def test_require_says_where_the_pod_may_run_in_a_short_warning() -> None:
    """A Pending pod's scheduler event only says its node selector matched no free node: the
    admission warning names the label and the limit."""
    pod = make_pod({"gpu-fraction": "0.5"})
    outcome = mutate(pod, "team", _policies({"driverMemoryLimit": "require"}))
    assert outcome.warnings == (
        f"runs only on nodes labelled {DRIVER_LIMIT_LABEL}=true (driver enforces its 40960Mi)",
    )
    assert mutate(pod, "team", _policies({"driverMemoryLimit": "inject"})).warnings == ()


def test_require_refuses_a_pod_that_selects_nodes_without_enforcement() -> None:
    policies = _policies({"driverMemoryLimit": "require"})
    pod = make_pod({"gpu-fraction": "0.5"}, nodeSelector={DRIVER_LIMIT_LABEL: "false"})
    outcome = mutate(pod, "team", policies)
    assert not outcome.allowed
    assert outcome.reasons == (
        f"nodeSelector {DRIVER_LIMIT_LABEL}=false conflicts with {DRIVER_LIMIT_LABEL}=true that "
        "the GPU pool chosen by policy 'p' needs: remove it from the pod.",
    )


def test_off_writes_no_limit_and_refuses_nothing() -> None:
    policies = _policies({"driverMemoryLimit": "off"})
    assert _limits(_admit(policies, {"gpu-fraction": "0.5"})) == (None, None)
    assert _limits(_admit(policies, {"gpu-memory": "10Gi"})) == (None, None)


def test_whole_gpus_get_no_driver_limit() -> None:
    pod = _admit(_policies({"driverMemoryLimit": "require"}), {"gpu-fraction": "1"})
    assert _limits(pod) == (None, None)
    assert DRIVER_LIMIT_LABEL not in pod["spec"].get("nodeSelector", {})


def test_mps_modes_write_the_driver_limit_beside_their_client_limits(
    mps_example: PolicySet, mps_daemon_example: PolicySet
) -> None:
    source = make_pod({"gpu-fraction": "0.25"})
    pod = mutated_pod(source, mutate(source, "ml-x", mps_example).decision)  # type: ignore[arg-type]
    env = env_values(pod)
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert _limits(pod) == ("20480", "20480")
    outcome = mutate(source, "inference", mps_daemon_example)
    pod = mutated_pod(source, outcome.decision)  # type: ignore[arg-type]
    assert _limits(pod) == ("5632", "5632")  # 0.25 x (24576 - 2048 reserved for an L4)


def test_the_user_value_of_a_limit_is_replaced_with_a_warning() -> None:
    user = [
        {"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "81920"},
        {"name": "NVIDIA_GPU_MEMORY_REQUEST", "valueFrom": {"configMapKeyRef": {"key": "k"}}},
    ]
    source = make_pod(
        {"gpu-fraction": "0.5"}, containers=[{"name": "a", "image": "x", "env": user}]
    )
    outcome = mutate(source, "team", _policies())
    assert outcome.allowed
    assert outcome.warnings == (
        "NVIDIA_GPU_MEMORY_REQUEST in 'a' set to 40960 by policy (user value replaced)",
        "NVIDIA_GPU_MEMORY_LIMIT in 'a' set to 40960 by policy (user value replaced)",
    )
    assert all(len(w) < 120 for w in outcome.warnings)
    pod = mutated_pod(source, outcome.decision)  # type: ignore[arg-type]
    assert pod["spec"]["containers"][0]["env"] == [
        {"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "40960"},
        {"name": "NVIDIA_GPU_MEMORY_REQUEST", "value": "40960"},
    ]
    assert mutate(pod, "team", _policies()).patch == []


def test_explain_says_what_the_limit_is_and_where_the_pod_may_run() -> None:
    source = make_pod({"gpu-fraction": "0.5"})
    decision = mutate(source, "team", _policies({"driverMemoryLimit": "require"}), explain=True)
    lines = decision.decision.explanation  # type: ignore[union-attr]
    assert (
        "driver memory limit: 40960Mi in NVIDIA_GPU_MEMORY_REQUEST and NVIDIA_GPU_MEMORY_LIMIT, "
        "which nvidia-container-toolkit's CDI hook has the driver enforce where the node "
        "supports it (enforcement.driverMemoryLimit: require of policy 'p')"
    ) in lines
    assert (
        f"placement: only nodes labelled {DRIVER_LIMIT_LABEL}=true, where the node agent found "
        "the driver limit enforced (enforcement.driverMemoryLimit: require of policy 'p': with "
        "no such node the pod stays Pending rather than run uncapped)"
    ) in lines
    assert f"nodeSelector: {DRIVER_LIMIT_LABEL}=true" in lines


def test_explain_says_why_there_is_no_limit(bundled: PolicySet) -> None:
    decision = mutate(make_pod({"gpu-fraction": "0.5"}), "team", bundled, explain=True)
    assert (
        "driver memory limit: none, since pool 'ts-half' declares no gpuMemory and the share's "
        "size is unknown (enforcement.driverMemoryLimit: auto of policy 'default'; declare "
        "gpuMemory to have the driver cap the pod)"
    ) in decision.decision.explanation  # type: ignore[union-attr]
    off = _policies({"driverMemoryLimit": "off"})
    decision = mutate(make_pod({"gpu-fraction": "0.5"}), "team", off, explain=True)
    assert (
        "driver memory limit: none (enforcement.driverMemoryLimit: off of policy 'p')"
        in decision.decision.explanation  # type: ignore[union-attr]
    )
