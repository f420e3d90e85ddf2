"""Planning a pod: env merging, MPS limits, the daemon's mounts, whole GPUs, denials."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import jsonpatch
import pytest
import yaml

from webhook.constants import (
    APPLIED_ANNOTATION,
)
from webhook.core.planning import (
    Denied,
    Planned,
    Untouched,
    plan_pod,
)
from webhook.core.policy.loader import load_policy_text
from webhook.core.policy.model import PolicySet
from webhook.core.verdict import Verdict, mutate, mutated_pod, validate

from .support import (
    assert_valid_kubernetes_pod,
    env_of,
    env_values,
    make_pod,
    policies_from,
    simple_policy,
)


def _admit(
    pod: dict[str, Any], namespace: str, policies: PolicySet
) -> tuple[Verdict, dict[str, Any]]:
    before = copy.deepcopy(pod)
    outcome = mutate(pod, namespace, policies)
    assert outcome.allowed, outcome.reasons
    assert outcome.decision is not None
    result = mutated_pod(pod, outcome.decision)
    assert pod == before
    assert jsonpatch.apply_patch(copy.deepcopy(pod), outcome.patch) == result
    assert mutate(result, namespace, policies).patch == [], "not idempotent"
    assert_valid_kubernetes_pod(result)
    return outcome, result


def _deny(pod: dict[str, Any], namespace: str, policies: PolicySet) -> Verdict:
    outcome = mutate(pod, namespace, policies)
    assert not outcome.allowed
    assert outcome.patch == []
    return outcome


# -- env ---------------------------------------------------------------------------------------


def test_user_env_is_kept_and_ours_appended_after_it(bundled: PolicySet) -> None:
    user = [
        {
            "name": "TF_FORCE_GPU_ALLOW_GROWTH",
            "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}},
        },
        {"name": "HOME", "value": "/work"},
    ]
    pod = make_pod(
        {"gpu-fraction": "0.25"},
        containers=[{"name": "a", "image": "ghcr.io/nvidia/jax:jax-2024-10-01", "env": user}],
    )
    _, result = _admit(pod, "research", bundled)
    assert env_of(result) == [*user, {"name": "XLA_PYTHON_CLIENT_MEM_FRACTION", "value": "0.23"}]


def test_user_duplicates_are_kept_and_nothing_is_added_twice(bundled: PolicySet) -> None:
    user = [
        {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "true"},
        {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "false"},
        {"name": "XLA_PYTHON_CLIENT_MEM_FRACTION", "value": "0.1"},
    ]
    pod = make_pod(
        {"gpu-fraction": "0.5"},
        containers=[{"name": "a", "image": "tensorflow/tensorflow:2.17.0-gpu", "env": user}],
    )
    _, result = _admit(pod, "research", bundled)
    assert env_of(result) == user


def test_mps_limits_overwrite_every_user_value_and_warn(mps_example: PolicySet) -> None:
    user = [
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"},
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=80G"},
        {
            "name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
        },
    ]
    pod = make_pod({"gpu-fraction": "0.125"}, containers=[{"name": "t", "image": "x", "env": user}])
    outcome, result = _admit(pod, "ml-a", mps_example)
    env = env_of(result)
    assert env[:3] == [
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "12"},
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=10240M"},
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "12"},
    ]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in [e["name"] for e in env[3:]]
    assert set(outcome.warnings) == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in 't' set to 12 by policy (user value replaced)",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in 't' set to 0=10240M by policy (user value replaced)",
    }
    assert all(len(w) < 120 for w in outcome.warnings)


def test_user_mps_values_equal_to_ours_are_neither_replaced_nor_warned(
    mps_example: PolicySet,
) -> None:
    user = [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "25"}]
    pod = make_pod({"gpu-fraction": "0.25"}, containers=[{"name": "t", "image": "x", "env": user}])
    outcome, _ = _admit(pod, "ml-a", mps_example)
    assert outcome.warnings == ()
    assert not [op for op in outcome.patch if op["op"] == "replace"]


def test_time_slicing_leaves_user_mps_variables_alone(bundled: PolicySet) -> None:
    user = [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"}]
    pod = make_pod({"gpu-fraction": "0.25"}, containers=[{"name": "a", "image": "x", "env": user}])
    outcome, result = _admit(pod, "research", bundled)
    assert env_of(result)[0] == user[0]
    assert outcome.warnings == ()


@pytest.mark.parametrize(
    ("fraction", "threads", "memory"),
    [
        ("0.5", "50", "0=40960M"),
        ("0.25", "25", "0=20480M"),
        ("0.1", "10", "0=8192M"),
        ("0.333", "33", "0=27279M"),
    ],
)
def test_mps_limits_follow_the_asked_fraction_not_the_slot(
    mps_example: PolicySet, fraction: str, threads: str, memory: str
) -> None:
    _, result = _admit(make_pod({"gpu-fraction": fraction}), "ml-x", mps_example)
    values = env_values(result)
    assert values["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == threads
    assert values["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == memory


def test_thread_overprovision_is_capped_at_100_percent() -> None:
    policies = policies_from(
        simple_policy(mode="mps", gpuMemory="40Gi", mps={"threadOverprovision": 2.5})
    )
    _, result = _admit(make_pod({"gpu-fraction": "0.5"}), "x", policies)
    assert env_values(result)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    _, result = _admit(make_pod({"gpu-fraction": "0.25"}), "x", policies)
    assert env_values(result)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "62"


def test_mps_limits_can_be_switched_off() -> None:
    policies = policies_from(
        simple_policy(
            mode="mps", mps={"enforceThreadPercentage": False, "enforceMemoryLimit": False}
        )
    )
    _, result = _admit(make_pod({"gpu-fraction": "0.5"}), "x", policies)
    assert not {n for n in env_values(result) if n.startswith("CUDA_MPS")}
    assert result["spec"]["nodeSelector"]["nvidia.com/gpu.sharing-strategy"] == "mps"


def test_device_plugin_mps_injects_no_pipe_directory_mount_or_host_ipc(
    mps_example: PolicySet,
) -> None:
    _, result = _admit(make_pod({"gpu-fraction": "0.5"}), "ml-x", mps_example)
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env_values(result)
    assert "volumes" not in result["spec"]
    assert "hostIPC" not in result["spec"]
    assert "volumeMounts" not in result["spec"]["containers"][0]


def test_policy_inject_env_is_added_when_the_user_did_not_set_it() -> None:
    policies = policies_from(
        simple_policy(inject={"env": [{"name": "NCCL_P2P_DISABLE", "value": "1"}]})
    )
    user = [{"name": "NCCL_P2P_DISABLE", "value": "0"}]
    _, result = _admit(
        make_pod({"gpu-fraction": "0.5"}, containers=[{"name": "a", "image": "x", "env": user}]),
        "x",
        policies,
    )
    assert [e for e in env_of(result) if e["name"] == "NCCL_P2P_DISABLE"] == user
    _, result = _admit(make_pod({"gpu-fraction": "0.5"}), "x", policies)
    assert env_values(result)["NCCL_P2P_DISABLE"] == "1"


def test_policy_inject_env_never_duplicates_a_variable_gpushare_sets() -> None:
    # policies/README.md: inject.env is "added when the user did not set it". A name the
    # mode or a framework knob already injects must not appear twice in the container.
    policies = policies_from(
        simple_policy(
            inject={
                "env": [
                    {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "false"},
                    {"name": "EXTRA", "value": "1"},
                    {"name": "EXTRA", "value": "2"},
                ]
            }
        )
    )
    _, result = _admit(make_pod({"gpu-fraction": "0.5"}), "x", policies)
    names = [e["name"] for e in env_of(result)]
    assert len(names) == len(set(names)), names


# -- the gpushare MPS daemon ----------------------------------------------------------------------


def test_mps_daemon_mounts_the_pipe_directory_into_the_gpu_container_only(
    mps_daemon_example: PolicySet,
) -> None:
    containers = [
        {"name": "app", "image": "x", "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        {"name": "side", "image": "y"},
    ]
    pod = make_pod(
        {"gpu-fraction": "0.2"}, containers=containers, volumes=[{"name": "data", "emptyDir": {}}]
    )
    outcome, result = _admit(pod, "inference", mps_daemon_example)
    spec = result["spec"]
    assert spec["volumes"] == [
        {"name": "data", "emptyDir": {}},
        {
            "name": "gpushare-mps-pipe",
            "hostPath": {"path": "/run/gpushare/mps/pipe", "type": "Directory"},
        },
    ]
    assert spec["containers"][0]["volumeMounts"] == [
        {"name": "data", "mountPath": "/data"},
        {"name": "gpushare-mps-pipe", "mountPath": "/run/gpushare/mps/pipe"},
    ]
    assert spec["containers"][1] == containers[1]
    assert spec["hostIPC"] is True
    assert spec["nodeSelector"]["gpushare.io/mps-ready"] == "true"
    assert spec["nodeSelector"]["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert env_values(result)["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpushare/mps/pipe"
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] == "2"
    assert outcome.warnings == (
        # Neither name is known: the first container is a guess (test_gpu_container_choice).
        'container "app" got the GPU, as the first of "app", "side": set '
        "gpu-fraction-container-name to the one that uses it",
        "hostIPC set for the MPS daemon; it breaks the Baseline Pod Security level",
    )


def test_mps_daemon_without_host_ipc_neither_sets_it_nor_warns() -> None:
    policies = policies_from(
        simple_policy(mode="mps-daemon", gpuMemory="24Gi", mpsDaemon={"pipeDirectory": "/var/mps"})
    )
    outcome, result = _admit(make_pod({"gpu-fraction": "0.5"}), "x", policies)
    assert "hostIPC" not in result["spec"]
    assert outcome.warnings == ()
    assert result["spec"]["volumes"][0]["hostPath"]["path"] == "/var/mps"


def test_mps_daemon_user_pipe_directory_is_overwritten_with_a_warning(
    mps_daemon_example: PolicySet,
) -> None:
    user = [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/nvidia-mps"}]
    pod = make_pod({"gpu-fraction": "0.5"}, containers=[{"name": "a", "image": "x", "env": user}])
    outcome, result = _admit(pod, "inference", mps_daemon_example)
    assert env_of(result)[0] == {
        "name": "CUDA_MPS_PIPE_DIRECTORY",
        "value": "/run/gpushare/mps/pipe",
    }
    assert (
        "CUDA_MPS_PIPE_DIRECTORY in 'a' set to /run/gpushare/mps/pipe by policy (user value "
        "replaced)" in outcome.warnings
    )


def test_mps_daemon_refuses_a_clashing_volume_or_mount(mps_daemon_example: PolicySet) -> None:
    clash_volume = make_pod(
        {"gpu-fraction": "0.5"}, volumes=[{"name": "gpushare-mps-pipe", "emptyDir": {}}]
    )
    assert _deny(clash_volume, "inference", mps_daemon_example).reasons == (
        "the pod already has a volume named 'gpushare-mps-pipe' that differs from the one the MPS "
        "daemon needs: rename it.",
    )
    container = {
        "name": "a",
        "image": "x",
        "volumeMounts": [{"name": "scratch", "mountPath": "/run/gpushare/mps/pipe"}],
    }
    clash_mount = make_pod(
        {"gpu-fraction": "0.5"},
        containers=[container],
        volumes=[{"name": "scratch", "emptyDir": {}}],
    )
    assert _deny(clash_mount, "inference", mps_daemon_example).reasons == (
        "container 'a' already mounts something at /run/gpushare/mps/pipe, where the MPS pipe "
        "directory must go: move it.",
    )


# -- whole GPUs, resources, placement on the pod ------------------------------------------------


def test_whole_gpus_get_the_unshared_resource_and_no_sharing_env(mps_example: PolicySet) -> None:
    outcome, result = _admit(make_pod({"gpu-fraction": "1"}), "ml-x", mps_example)
    container = result["spec"]["containers"][0]
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "1"},
        "requests": {"nvidia.com/gpu": "1"},
    }
    assert "env" not in container
    assert "nodeSelector" not in result["spec"]
    assert json.loads(result["metadata"]["annotations"][APPLIED_ANNOTATION]) == {
        "container": "app",
        "gpus": 1,
        "mode": "whole-gpu",
        "policy": "ml-mps",
        "policyVersion": mps_example.policies[0].version,
        "resource": "nvidia.com/gpu",
    }
    assert outcome.warnings == ()


def test_whole_gpus_are_refused_where_the_policy_allows_none() -> None:
    policies = policies_from(simple_policy(wholeGpus={"max": 0}))
    outcome = _deny(make_pod({"gpu-fraction": "1"}), "x", policies)
    assert outcome.reasons == (
        "gpu-fraction \"1\" asks for 1 whole GPUs, but policy 'p' allows no whole GPUs: ask for "
        "fewer, or for a share below 1.",
    )
    assert outcome.code == 403


def test_existing_non_gpu_resources_are_kept(bundled: PolicySet) -> None:
    resources = {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "1"}}
    pod = make_pod(
        {"gpu-fraction": "0.5"}, containers=[{"name": "a", "image": "x", "resources": resources}]
    )
    _, result = _admit(pod, "research", bundled)
    assert result["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu.shared": "1"},
        "requests": {"cpu": "1", "nvidia.com/gpu.shared": "1"},
    }


@pytest.mark.parametrize(
    "resource",
    [
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-1g.10gb",
        "aliyun.com/gpu-mem",
        "nvidia.com/gpumem",
    ],
)
def test_a_container_asking_for_another_gpu_resource_is_refused(
    bundled: PolicySet, resource: str
) -> None:
    container = {"name": "a", "image": "x", "resources": {"limits": {resource: "3"}}}
    outcome = _deny(make_pod({"gpu-fraction": "0.5"}, containers=[container]), "research", bundled)
    assert outcome.reasons == (
        f"container 'a' already asks for {resource}: 3 in resources.limits; remove it and let "
        "the gpu-fraction annotation decide, or remove the annotation.",
    )
    assert outcome.code == 403


def test_other_containers_resources_are_left_alone(bundled: PolicySet) -> None:
    # A GPU asked by hand in another container is refused: tests/core/test_every_container.py
    other = {"name": "b", "image": "y", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}
    pod = make_pod({"gpu-fraction": "0.5"}, containers=[{"name": "a", "image": "x"}, other])
    _, result = _admit(pod, "research", bundled)
    assert result["spec"]["containers"][1] == other


def test_existing_matching_node_selector_and_tolerations_are_not_duplicated(
    bundled: PolicySet,
) -> None:
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    pod = make_pod(
        {"gpu-fraction": "0.5"},
        nodeSelector={"nvidia.com/gpu.replicas": "2", "zone": "a"},
        tolerations=[toleration],
    )
    _, result = _admit(pod, "research", bundled)
    assert result["spec"]["tolerations"] == [toleration]
    assert result["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.replicas": "2",
        "zone": "a",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    }


def test_pool_node_selector_and_policy_labels_annotations_are_set() -> None:
    policies = policies_from(
        simple_policy(
            pools=[
                {"name": "a100", "replicas": 4, "nodeSelector": {"nvidia.com/gpu.product": "A100"}}
            ],
            inject={"labels": {"gpushare.io/shared": "yes"}, "annotations": {"team/owner": "ml"}},
        )
    )
    _, result = _admit(make_pod({"gpu-fraction": "0.25"}), "x", policies)
    assert result["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "A100"
    assert result["metadata"]["labels"] == {"gpushare.io/shared": "yes"}
    assert result["metadata"]["annotations"]["team/owner"] == "ml"


def test_applied_annotation_records_policy_mode_pool_and_effective_fraction(
    mps_example: PolicySet,
) -> None:
    outcome, result = _admit(make_pod({"gpu-memory": "10Gi"}), "ml-x", mps_example)
    assert isinstance(outcome.decision, Planned)
    recorded = json.loads(result["metadata"]["annotations"][APPLIED_ANNOTATION])
    assert (
        recorded
        == dict(outcome.decision.record)
        == {
            "container": "app",
            "fraction": "0.125",
            "mode": "mps",
            "policy": "ml-mps",
            "policyVersion": mps_example.policies[0].version,
            "pool": "mps-8",
            "resource": "nvidia.com/gpu.shared",
            "slots": 1,
        }
    )
    assert len(recorded["policyVersion"]) == 12


# -- untouched and denied -------------------------------------------------------------------------


def test_mirror_pods_and_pods_without_annotation_are_untouched(bundled: PolicySet) -> None:
    mirror = make_pod({"gpu-fraction": "0.5", "kubernetes.io/config.mirror": "abc"})
    decision = plan_pod(mirror, "research", bundled)
    assert isinstance(decision, Untouched)
    assert decision.reason == "mirror pods are managed by the kubelet and never mutated"
    plain = make_pod()
    assert isinstance(plan_pod(plain, "research", bundled), Untouched)
    assert mutated_pod(plain, plan_pod(plain, "research", bundled)) == plain


def test_unreadable_annotations_are_422_and_policy_violations_403(bundled: PolicySet) -> None:
    assert _deny(make_pod({"gpu-fraction": "abc"}), "research", bundled).code == 422
    missing = make_pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "nope"})
    assert _deny(missing, "research", bundled).code == 422
    assert _deny(make_pod({"gpu-fraction": "0.9"}), "research", bundled).code == 403
    denied = plan_pod(make_pod({"gpu-fraction": "0.01"}), "research", bundled)
    assert isinstance(denied, Denied) and denied.policy == "default"


def test_pod_without_containers_is_refused(bundled: PolicySet) -> None:
    outcome = _deny(make_pod({"gpu-fraction": "0.5"}, containers=[]), "research", bundled)
    assert outcome.reasons == ("The pod has no containers to give a GPU to.",)


def test_container_name_lists_the_candidates(bundled: PolicySet) -> None:
    containers = [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]
    pod = make_pod(
        {"gpu-fraction": "0.5", "gpu-fraction-container-name": "sidecar"},
        containers=containers,
        initContainers=[{"name": "sidecar", "image": "z", "restartPolicy": "Always"}],
    )
    assert _deny(pod, "research", bundled).reasons == (
        'gpu-fraction-container-name "sidecar" names an init container; GPUs go to app '
        "containers: name one of a, b.",
    )


def test_framework_share_that_headroom_eats_is_refused() -> None:
    # Only where a fraction would be sent (a JAX image here).
    # fraction.min below the headroom can only happen with memory headroom (the loader
    # refuses a percentage headroom that large).
    policies = policies_from(
        simple_policy(mode="mps", gpuMemory="16Gi", headroom="2Gi", fraction={"min": 0.05})
    )
    jax = [{"name": "app", "image": "ghcr.io/nvidia/jax:jax-2024-10-01"}]
    outcome = _deny(make_pod({"gpu-fraction": "0.1"}, containers=jax), "x", policies)
    assert outcome.reasons == (
        "A share of 0.1 leaves no memory once policy 'p' keeps its headroom for the CUDA context: "
        "ask for more.",
    )


# -- validate: the pod as every mutator left it --------------------------------------------------


def test_validate_accepts_our_own_result_and_catches_later_tampering(bundled: PolicySet) -> None:
    _, result = _admit(make_pod({"gpu-fraction": "0.5"}), "research", bundled)
    assert validate(result, "research", bundled).allowed
    tampered = copy.deepcopy(result)
    del tampered["spec"]["nodeSelector"]["nvidia.com/gpu.replicas"]
    outcome = validate(tampered, "research", bundled)
    assert not outcome.allowed
    assert outcome.reasons[0].startswith(
        "The GPU-sharing settings injected at admission were changed afterwards (at "
        "/spec/nodeSelector/nvidia.com~1gpu.replicas)"
    )


def test_validate_tells_a_policy_change_from_tampering(bundled: PolicySet) -> None:
    """Mutated under one version of the policy, validated by a replica (or after a reload)
    serving another: the drift is the policies', so the pod is admitted with a note; under
    the same version the same drift is tampering and is denied. Found under load: a policy
    reload between the two webhook calls denied 2-14 creates per reload storm."""
    pod = make_pod({"gpu-fraction": "0.5"})
    _, mutated_before = _admit(pod, "research", bundled)
    (default,) = [p for p in bundled.policies if p.name == "default"]
    changed = dataclasses.replace(default, version="0123456789ab")
    reloaded = PolicySet((changed,), bundled.excluded_namespaces, bundled.sources)
    outcome = validate(mutated_before, "research", reloaded)
    assert outcome.allowed
    assert "version 0123456789ab" in outcome.warnings[0] and "not re-checked" in outcome.warnings[0]
    narrower = dataclasses.replace(default, version="ba9876543210", pools=default.pools[1:])
    refusing = PolicySet((narrower,), bundled.excluded_namespaces, bundled.sources)
    assert not mutate(pod, "research", refusing).allowed  # the new version refuses this ask
    assert validate(mutated_before, "research", refusing).allowed  # but it was admitted
    _, mutated_now = _admit(pod, "research", reloaded)
    tampered = copy.deepcopy(mutated_now)
    del tampered["spec"]["nodeSelector"]["nvidia.com/gpu.replicas"]
    assert not validate(tampered, "research", reloaded).allowed


def test_policy_versions_follow_the_spec() -> None:
    text = yaml.safe_dump(simple_policy("team"), sort_keys=False)
    first = load_policy_text(text, "a.yaml").policies[0]
    again = load_policy_text("# a comment\n" + text, "b.yaml").policies[0]
    changed = load_policy_text(text.replace("replicas: 4", "replicas: 8"), "a.yaml").policies[0]
    assert first.version == again.version  # comments, file names: same spec, same version
    assert first.version != changed.version
    assert len(first.version) == 12


def test_validate_says_when_the_mutating_webhook_never_ran(bundled: PolicySet) -> None:
    """A pod admitted unmutated (mutating webhook down under Ignore) is named as such."""
    outcome = validate(make_pod({"gpu-fraction": "0.5"}), "research", bundled)
    assert not outcome.allowed
    assert outcome.code == 403
    assert outcome.reasons[0].startswith(
        "This pod asks for a GPU share but was never mutated by gpushare"
    )


def test_validate_denies_direct_shared_resource_requests_where_the_policy_says_so(
    bundled: PolicySet,
) -> None:
    container = {"name": "a", "image": "x", "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}
    pod = make_pod(containers=[container])
    outcome = validate(pod, "research", bundled)
    assert not outcome.allowed
    assert outcome.reasons == (
        "container 'a' asks for nvidia.com/gpu.shared directly, which policy 'default' does not "
        'allow: remove it and annotate the pod with gpu-fraction: "0.5" (or the share you need) '
        "instead.",
    )
    assert validate(pod, "kube-system", bundled).allowed
    allowing = policies_from(simple_policy(directResourceRequests="allow"))
    assert validate(pod, "research", allowing).allowed


def test_memoized_mode_changes_never_leak_into_planned_pods(mps_daemon_example: PolicySet) -> None:
    """Editing one planned pod (as a caller may) must not change the next pod's plan."""
    pod = make_pod({"gpu-fraction": "0.3"})
    first, result = _admit(pod, "inference", mps_daemon_example)
    first_patch = copy.deepcopy(first.patch)
    result["spec"]["volumes"][-1]["hostPath"]["path"] = "/tampered"
    result["spec"]["containers"][0]["volumeMounts"][-1]["mountPath"] = "/tampered"
    second = mutate(copy.deepcopy(pod), "inference", mps_daemon_example)
    assert second.patch == first_patch
    assert "/tampered" not in json.dumps(second.patch)


def test_validate_leaves_mirror_pods_alone() -> None:
    """A static pod's API copy cannot be changed or recreated by its author: even one asking
    for the shared resource by hand under a policy that denies it is not refused."""
    strict = load_policy_text(
        """
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: strict}
spec:
  default: true
  mode: time-slicing
  directResourceRequests: deny
  pools: [{name: ts-2, replicas: 2}]
"""
    )
    mirror = make_pod({"kubernetes.io/config.mirror": "abc"})
    mirror["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu.shared": 1}}
    assert validate(mirror, "research", strict).allowed
    del mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"]
    assert not validate(mirror, "research", strict).allowed
