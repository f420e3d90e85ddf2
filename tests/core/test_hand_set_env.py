"""What a pod may not set by hand (policy ``enforcement``): limit variables in the GPU
container under ``handSetLimits: deny``, device variables in any container under
``deviceVariables: deny`` (the default), through the mutating path for annotated pods and
through ``validate`` for every pod the policy governs.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from webhook.core.policy.model import PolicySet
from webhook.core.verdict import mutate, mutated_pod, validate

from .support import make_pod, policies_from, simple_policy


def _policies(**enforcement: str) -> PolicySet:
    return policies_from(simple_policy(gpuMemory="40Gi", enforcement=enforcement))


def _container(env: list[dict[str, Any]], name: str = "app") -> dict[str, Any]:
    return {"name": name, "image": "python:3.12", "env": env}


def _value(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _from_config_map(name: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "k"}}}


def _device_refusal(name: str, where: str, policy: str = "p") -> str:
    harmless = " (or set it to void or none, which expose no GPU)"
    return (
        f"{name} is set by hand in {where}, which policy {policy!r} does not allow "
        "(enforcement.deviceVariables: deny): it selects GPUs by env, so a container could "
        "reach GPUs the device plugin did not give it and bypass the limits gpushare sets. "
        f"Remove it{harmless if name == 'NVIDIA_VISIBLE_DEVICES' else ''}, and ask for a GPU "
        'share with the gpu-fraction annotation (e.g. gpu-fraction: "0.5").'
    )


# -- limits set by hand ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "shown"),
    [
        (_value("NVIDIA_GPU_MEMORY_LIMIT", "40960"), " to '40960'"),
        (_from_config_map("NVIDIA_GPU_MEMORY_LIMIT"), " from valueFrom"),
    ],
)
def test_deny_refuses_a_limit_set_by_hand_naming_variable_container_and_fix(
    entry: dict[str, Any], shown: str
) -> None:
    pod = make_pod({"gpu-fraction": "0.5"}, containers=[_container([entry], "job")])
    outcome = mutate(pod, "team", _policies(handSetLimits="deny"))
    assert not outcome.allowed
    assert outcome.code == 403
    assert outcome.reasons == (
        f"NVIDIA_GPU_MEMORY_LIMIT is set by hand{shown} in container 'job', which policy 'p' "
        "does not allow (enforcement.handSetLimits: deny): remove NVIDIA_GPU_MEMORY_LIMIT "
        "from the container's env; gpushare sets it to 20480 from the pod's GPU share.",
    )


def test_deny_refuses_a_limit_gpushare_does_not_set_for_the_pod() -> None:
    env = [_value("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100")]  # time-slicing sets none
    pod = make_pod({"gpu-fraction": "0.5"}, containers=[_container(env)])
    outcome = mutate(pod, "team", _policies(handSetLimits="deny"))
    assert outcome.reasons == (
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is set by hand to '100' in container 'app', which "
        "policy 'p' does not allow (enforcement.handSetLimits: deny): remove "
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE from the container's env; gpushare sets no "
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for this pod.",
    )
    whole = make_pod({"gpu-fraction": "1"}, containers=[_container(env)])
    assert not mutate(whole, "team", _policies(handSetLimits="deny")).allowed


def test_deny_accepts_the_value_gpushare_plans_so_reinvocation_is_never_denied() -> None:
    policies = _policies(handSetLimits="deny")
    pod = make_pod({"gpu-fraction": "0.5"}, containers=[_container([_value("OTHER", "1")])])
    outcome = mutate(pod, "team", policies)
    assert outcome.allowed
    planned = mutated_pod(pod, outcome.decision)  # type: ignore[arg-type]
    again = mutate(planned, "team", policies)
    assert again.allowed, again.reasons
    assert again.patch == []
    assert validate(planned, "team", policies).allowed
    same = [_value("NVIDIA_GPU_MEMORY_LIMIT", "20480")]
    assert mutate(make_pod({"gpu-fraction": "0.5"}, [_container(same)]), "team", policies).allowed


def test_deny_leaves_limits_in_other_containers_alone() -> None:
    containers = [
        {"name": "app", "image": "x"},
        _container([_value("NVIDIA_GPU_MEMORY_LIMIT", "1")], "side"),
    ]
    pod = make_pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "app"}, containers)
    assert mutate(pod, "team", _policies(handSetLimits="deny")).allowed


def test_override_replaces_every_hand_set_entry_with_a_short_warning() -> None:
    env = [
        _from_config_map("NVIDIA_GPU_MEMORY_LIMIT"),
        _value("NVIDIA_GPU_MEMORY_LIMIT", "99999"),
    ]
    pod = make_pod({"gpu-fraction": "0.5"}, containers=[_container(env)])
    outcome = mutate(pod, "team", _policies())
    assert outcome.allowed
    assert outcome.warnings == (
        "NVIDIA_GPU_MEMORY_LIMIT in 'app' set to 20480 by policy (user value replaced)",
    )
    result = mutated_pod(pod, outcome.decision)  # type: ignore[arg-type]
    limits = [e for e in result["spec"]["containers"][0]["env"] if "LIMIT" in e["name"]]
    assert limits == [_value("NVIDIA_GPU_MEMORY_LIMIT", "20480")] * 2


# -- device variables ------------------------------------------------------------------------


def test_device_variables_in_any_container_are_refused_on_annotated_pods() -> None:
    pod = make_pod(
        {"gpu-fraction": "0.5"},
        containers=[
            _container([_value("NVIDIA_VISIBLE_DEVICES", "all")]),
            _container([_from_config_map("CUDA_VISIBLE_DEVICES")], "side"),
        ],
        initContainers=[_container([_value("CUDA_VISIBLE_DEVICES", "1")], "init")],
    )
    outcome = mutate(pod, "team", _policies())
    assert not outcome.allowed
    assert outcome.code == 403
    assert outcome.patch == []
    assert outcome.reasons == (
        _device_refusal("NVIDIA_VISIBLE_DEVICES", "container 'app'"),
        _device_refusal("CUDA_VISIBLE_DEVICES", "container 'side'"),
        _device_refusal("CUDA_VISIBLE_DEVICES", "init container 'init'"),
    )


@pytest.mark.parametrize("annotations", [None, {"gpu-fraction": "0.5"}])
def test_validate_refuses_device_variables_on_every_pod_the_policy_governs(
    annotations: dict[str, str] | None,
) -> None:
    init = [_container([_value("NVIDIA_VISIBLE_DEVICES", "0")], "init")]
    pod = make_pod(annotations, initContainers=init)
    verdict = validate(pod, "team", _policies())
    assert not verdict.allowed
    assert verdict.code == 403
    assert verdict.policy == "p"
    assert verdict.reasons == (_device_refusal("NVIDIA_VISIBLE_DEVICES", "init container 'init'"),)


@pytest.mark.parametrize("value", ["void", "none", ""])
def test_nvidia_visible_devices_that_expose_no_gpu_are_allowed(value: str) -> None:
    policies = _policies()
    containers = [
        {"name": "app", "image": "x"},
        _container([_value("NVIDIA_VISIBLE_DEVICES", value)], "side"),
    ]
    pod = make_pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "app"}, containers)
    assert mutate(pod, "team", policies).allowed
    assert validate(make_pod(None, containers), "team", policies).allowed
    cuda = [_container([_value("CUDA_VISIBLE_DEVICES", value)])]
    assert not validate(make_pod(None, cuda), "team", policies).allowed


def test_nvidia_visible_devices_from_value_from_is_refused_whatever_it_holds() -> None:
    pod = make_pod(None, [_container([_from_config_map("NVIDIA_VISIBLE_DEVICES")])])
    assert not validate(pod, "team", _policies()).allowed


def test_device_variables_are_allowed_where_the_policy_says_so() -> None:
    pod = make_pod({"gpu-fraction": "0.5"}, [_container([_value("CUDA_VISIBLE_DEVICES", "0")])])
    policies = _policies(deviceVariables="allow")
    assert mutate(pod, "team", policies).allowed
    unannotated = make_pod(None, [_container([_value("CUDA_VISIBLE_DEVICES", "0")])])
    assert validate(unannotated, "team", policies).allowed


def test_pods_no_policy_governs_are_not_checked() -> None:
    policies = policies_from(
        simple_policy(default=False, match={"namespaces": ["gpu-team"]}),
    )
    pod = make_pod(None, [_container([_value("NVIDIA_VISIBLE_DEVICES", "all")])])
    assert validate(pod, "elsewhere", policies).allowed
    assert validate(pod, "kube-system", _policies()).allowed
    assert not validate(pod, "gpu-team", policies).allowed


def test_pods_handed_to_kai_scheduler_keep_the_visible_devices_kai_gives_them() -> None:
    """KAI's pod mutator gives the GPU container NVIDIA_VISIBLE_DEVICES from its ConfigMap."""
    kai_env = [_from_config_map("NVIDIA_VISIBLE_DEVICES")]
    pod = make_pod({"gpu-fraction": "0.5"}, [_container(kai_env)], schedulerName="kai-scheduler")
    assert mutate(pod, "team", _policies()).allowed
    assert validate(pod, "team", _policies()).allowed


def test_validate_checks_device_variables_before_direct_requests() -> None:
    container = _container([_value("CUDA_VISIBLE_DEVICES", "0")])
    container["resources"] = {"limits": {"nvidia.com/gpu.shared": "1"}}
    verdict = validate(make_pod(None, [container]), "team", _policies())
    assert verdict.reasons == (_device_refusal("CUDA_VISIBLE_DEVICES", "container 'app'"),)
    plain = make_pod(None, [{"name": "app", "image": "x"}])
    assert validate(plain, "team", _policies()) == validate(
        copy.deepcopy(plain), "team", _policies()
    )
    assert validate(plain, "team", _policies()).allowed


def test_malformed_env_entries_are_skipped_not_crashed_on() -> None:
    pod = make_pod(None, [{"name": "app", "image": "x", "env": ["x", {"name": ["NVIDIA"]}, 3]}])
    assert validate(pod, "team", _policies()).allowed
    weird = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": ["void"]}]
    assert not validate(make_pod(None, [_container(weird)]), "team", _policies()).allowed


def test_a_privileged_container_may_set_device_variables_it_reaches_every_device_anyway() -> None:
    """The GPU Operator's own containers that set NVIDIA_VISIBLE_DEVICES=all are privileged
    (gpu-operator v26.7.0 assets/state-device-plugin/0500_daemonset.yaml and the others);
    privilege already gives a container every device node, so the variable adds nothing."""
    privileged = _container([_value("NVIDIA_VISIBLE_DEVICES", "all")])
    privileged["securityContext"] = {"privileged": True}
    assert validate(make_pod(None, [privileged]), "team", _policies()).allowed
    unprivileged = _container([_value("NVIDIA_VISIBLE_DEVICES", "all")])
    unprivileged["securityContext"] = {"privileged": False, "runAsNonRoot": True}
    verdict = validate(make_pod(None, [privileged, unprivileged]), "team", _policies())
    assert verdict.reasons == (_device_refusal("NVIDIA_VISIBLE_DEVICES", "container 'app'"),)
