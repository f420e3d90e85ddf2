"""The safety net inside the real kube-apiserver: each check of the ValidatingAdmissionPolicy
that `gpushare webhook-config` prints, denying with its message, and what it lets through.

gpushare is registered as printed (conftest.py). To put pods the mutating webhook would have
fixed in front of the policy, the module swaps the mutating webhook for one at a dead port
under failurePolicy Ignore (as during an outage): every pod then reaches the policy as
written, so a pod carrying a forged `gpushare.io/applied` record stands for one a later
mutator changed after gpushare. The forged records are what `gpushare mutate` writes, so an
untampered one must be admitted: the policy's facts (node selectors, enforced env limits
per policy version and pool) must agree with the webhook's own plan.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from network_faults import closed_port
from pods import annotated_pod, plain_pod

from harness.api import create_pod, ensure_namespace, status_message
from harness.registration import SAFETY_NET_DENIAL, SHARED_RESOURCE, GpushareWebhook
from webhook.constants import APPLIED_ANNOTATION, FRACTION_ANNOTATION
from webhook.core import load_policies, mutate, mutated_pod, validate

CHANGED = "The GPU-sharing settings injected at admission were changed afterwards"
REMEDY = (
    f"; remove the webhook or edit that changes them, or drop the {FRACTION_ANNOTATION} annotation."
)
NEVER_MUTATED = (
    "This pod asks for a GPU share but was never mutated by gpushare: the mutating webhook "
    "was unreachable or skipped it. Check that mutate.gpushare.io is up and registered, "
    "then create the pod again."
)


@pytest.fixture(scope="module")
def mutation_down(gpushare_webhook: GpushareWebhook) -> Iterator[GpushareWebhook]:
    """The mutating webhook at a dead port under Ignore; the safety net as printed."""
    dead = f"https://127.0.0.1:{closed_port()}"
    documents = gpushare_webhook.configuration("--failure-policy", "Ignore", url=dead)
    mutating = [d for d in documents if d["kind"] == "MutatingWebhookConfiguration"]
    gpushare_webhook.swap(
        mutating,
        lambda p: p.annotated.startswith("rejected: ") and NEVER_MUTATED in p.annotated,
        "the dead mutating webhook (Ignore) next to the safety net",
    )
    try:
        yield gpushare_webhook
    finally:
        gpushare_webhook.restore()


def namespace_named(core_v1: k8s.CoreV1Api, prefix: str) -> str:
    """A fresh namespace whose name a policy matches (ml-* is ml-mps, inference its own)."""
    name = prefix if prefix == "inference" else f"{prefix}{uuid.uuid4().hex[:6]}"
    ensure_namespace(core_v1, name)
    return name


def as_mutated(webhook: GpushareWebhook, pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The pod as gpushare's mutating webhook would have left it: the forged record is real."""
    verdict = mutate(pod, namespace, load_policies(webhook.policies))
    assert verdict.allowed and verdict.decision is not None, verdict.reasons
    return mutated_pod(pod, verdict.decision)


def refused(webhook: GpushareWebhook, namespace: str, pod: dict[str, Any]) -> str:
    """The policy's message for a pod it must deny (the apiserver's prefix checked)."""
    with pytest.raises(ApiException) as caught:
        create_pod(webhook.api, namespace, pod)
    message = status_message(caught.value)
    prefix = f'pods "{pod["metadata"]["name"]}" is forbidden: {SAFETY_NET_DENIAL}'
    assert message.startswith(prefix), message
    assert caught.value.status == 403
    return message.removeprefix(prefix)


def env_of(pod: dict[str, Any]) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = pod["spec"]["containers"][0]["env"]
    return env


def set_env(pod: dict[str, Any], name: str, value: str | None) -> dict[str, Any]:
    """A copy with env `name` set to `value` (None: removed)."""
    changed = copy.deepcopy(pod)
    env = [e for e in env_of(changed) if e["name"] != name]
    if value is not None:
        env.append({"name": name, "value": value})
    changed["spec"]["containers"][0]["env"] = env
    return changed


# -- asked by hand, never mutated ----------------------------------------------------------


def test_shared_resource_asked_by_hand_is_refused_with_the_webhooks_message(
    mutation_down: GpushareWebhook, namespace: str
) -> None:
    shared = {SHARED_RESOURCE: "1"}
    pod = plain_pod("by-hand", resources={"requests": shared, "limits": shared})
    pod["spec"]["initContainers"] = [{"name": "warmup", "image": "busybox"}]

    message = refused(mutation_down, namespace, pod)

    (expected,) = validate(pod, namespace, load_policies(mutation_down.policies)).reasons
    assert message == expected
    assert message == (
        f"container 'main' asks for {SHARED_RESOURCE} directly, which policy 'default' does "
        f'not allow: remove it and annotate the pod with {FRACTION_ANNOTATION}: "0.5" (or '
        "the share you need) instead."
    )


def test_an_init_container_asking_by_hand_is_named(
    mutation_down: GpushareWebhook, core_v1: k8s.CoreV1Api
) -> None:
    namespace = namespace_named(core_v1, "ml-")
    pod = plain_pod("init-by-hand")
    pod["spec"]["initContainers"] = [
        {"name": "prefetch", "image": "busybox", "resources": {"limits": {SHARED_RESOURCE: "1"}}}
    ]

    message = refused(mutation_down, namespace, pod)

    assert message.startswith(f"container 'prefetch' asks for {SHARED_RESOURCE} directly, ")
    assert "which policy 'ml-mps' does not allow" in message


def test_an_annotated_pod_the_mutating_webhook_never_saw_is_refused(
    mutation_down: GpushareWebhook, namespace: str
) -> None:
    pod = annotated_pod("unmutated", "0.25")

    assert refused(mutation_down, namespace, pod) == NEVER_MUTATED
    assert mutation_down.server.admissions(namespace) == []


# -- changed after mutation: a forged record -------------------------------------------------


def test_a_mutated_pod_exactly_as_gpushare_left_it_is_admitted(
    mutation_down: GpushareWebhook, core_v1: k8s.CoreV1Api, namespace: str
) -> None:
    """Time-slicing, MPS, the MPS daemon and whole GPUs: the policy's baked facts agree
    with the webhook's plan, so nothing the webhook wrote is taken for tampering."""
    cases = [
        (namespace, annotated_pod("ts", "0.5")),
        (namespace, annotated_pod("whole", "2")),
        (namespace_named(core_v1, "ml-"), annotated_pod("mps", "0.3")),
        (namespace_named(core_v1, "inference"), annotated_pod(f"daemon-{uuid.uuid4().hex[:6]}")),
    ]
    for where, pod in cases:
        mutated = as_mutated(mutation_down, pod, where)
        admitted = create_pod(mutation_down.api, where, mutated).pod
        annotations = admitted["metadata"]["annotations"]
        assert (
            annotations[APPLIED_ANNOTATION]
            == mutated["metadata"]["annotations"][APPLIED_ANNOTATION]
        )
        assert admitted["spec"].get("nodeSelector") == mutated["spec"].get("nodeSelector")


def test_a_gpu_resource_raised_after_mutation_is_refused(
    mutation_down: GpushareWebhook, namespace: str
) -> None:
    mutated = as_mutated(mutation_down, annotated_pod("raised", "0.5"), namespace)
    resources = mutated["spec"]["containers"][0]["resources"]
    resources["limits"][SHARED_RESOURCE] = resources["requests"][SHARED_RESOURCE] = "2"

    assert refused(mutation_down, namespace, mutated) == (
        f"{CHANGED} (at /spec/containers/0/resources/limits/nvidia.com~1gpu.shared: "
        f"{APPLIED_ANNOTATION} records 1, the container asks for 2){REMEDY}"
    )


def test_a_node_selector_moved_to_another_pool_is_refused(
    mutation_down: GpushareWebhook, namespace: str
) -> None:
    mutated = as_mutated(mutation_down, annotated_pod("moved", "0.5"), namespace)
    mutated["spec"]["nodeSelector"]["nvidia.com/gpu.replicas"] = "8"
    version = json.loads(mutated["metadata"]["annotations"][APPLIED_ANNOTATION])["policyVersion"]

    assert refused(mutation_down, namespace, mutated) == (
        f"{CHANGED} (at /spec/nodeSelector: policy version default@{version} selects "
        f"nvidia.com/gpu.replicas=2){REMEDY}"
    )


THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MEMORY = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
DRIVER_LIMIT = "NVIDIA_GPU_MEMORY_LIMIT"
DRIVER_REQUEST = "NVIDIA_GPU_MEMORY_REQUEST"


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        (THREADS, None, f"{THREADS} at most 25"),
        (THREADS, "100", f"{THREADS} at most 25"),
        (MEMORY, "0=81920M", f"{MEMORY} at most 0=20480M"),
        (MEMORY, "unlimited", f"{MEMORY} at most 0=20480M"),
        (DRIVER_LIMIT, "81920", f"{DRIVER_LIMIT} at most 20480"),
        (DRIVER_REQUEST, None, f"{DRIVER_REQUEST} at most 20480"),
        (DRIVER_LIMIT, "20480Mi", f"{DRIVER_LIMIT} at most 20480"),
    ],
    ids=[
        "thread-limit-removed",
        "thread-limit-raised",
        "memory-raised",
        "memory-garbled",
        "driver-limit-raised",
        "driver-request-removed",
        "driver-limit-not-mib",
    ],
)
def test_mps_hard_limits_removed_or_loosened_are_refused(
    mutation_down: GpushareWebhook,
    core_v1: k8s.CoreV1Api,
    name: str,
    value: str | None,
    expected: str,
) -> None:
    """A quarter of an 80 GiB GPU on pool mps-4 (one slot): at most 25% of the threads and
    20480 MiB, for MPS and for the driver (NVIDIA_GPU_MEMORY_*, whole MiB); the webhook set
    exactly that, and nothing looser may replace it."""
    namespace = namespace_named(core_v1, "ml-")
    mutated = as_mutated(mutation_down, annotated_pod("loosened", "0.25"), namespace)
    version = json.loads(mutated["metadata"]["annotations"][APPLIED_ANNOTATION])["policyVersion"]

    message = refused(mutation_down, namespace, set_env(mutated, name, value))

    assert message == (
        f"{CHANGED} (at /spec/containers/0/env: policy version ml-mps@{version} sets "
        f"{expected} for 1 slot(s) of pool mps-4){REMEDY}"
    )


def test_a_tighter_mps_limit_is_let_through(
    mutation_down: GpushareWebhook, core_v1: k8s.CoreV1Api
) -> None:
    """What CEL checks is "not looser": a limit tightened by hand is the opt-in validating
    webhook's to refuse (it wants exactly its own value)."""
    namespace = namespace_named(core_v1, "ml-")
    mutated = as_mutated(mutation_down, annotated_pod("tighter", "0.25"), namespace)

    admitted = create_pod(
        mutation_down.api, namespace, set_env(mutated, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "10")
    ).pod

    assert {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "10"} in env_of(admitted)


def test_a_renamed_gpu_container_is_refused(mutation_down: GpushareWebhook, namespace: str) -> None:
    mutated = as_mutated(mutation_down, annotated_pod("renamed", "0.5"), namespace)
    mutated["spec"]["containers"][0]["name"] = "other"

    assert refused(mutation_down, namespace, mutated) == (
        f"{CHANGED} (the {APPLIED_ANNOTATION} record names container 'main', which the pod "
        f"no longer has){REMEDY}"
    )


def test_a_pod_mutated_under_another_policy_version_is_not_judged_by_this_one(
    mutation_down: GpushareWebhook, namespace: str
) -> None:
    """As the webhook admits version skew (a replica still serving other policies), the
    policy checks selectors and limits only for the versions it was generated from."""
    mutated = as_mutated(mutation_down, annotated_pod("skewed", "0.5"), namespace)
    record = json.loads(mutated["metadata"]["annotations"][APPLIED_ANNOTATION])
    record["policyVersion"] = "000000000000"
    mutated["metadata"]["annotations"][APPLIED_ANNOTATION] = json.dumps(
        record, separators=(",", ":"), sort_keys=True
    )
    mutated["spec"]["nodeSelector"]["nvidia.com/gpu.replicas"] = "4"

    admitted = create_pod(mutation_down.api, namespace, mutated).pod

    assert admitted["spec"]["nodeSelector"]["nvidia.com/gpu.replicas"] == "4"


def parsed_record(pod: dict[str, Any]) -> dict[str, Any]:
    """A copy whose record holds a key the core never writes before its mode: the policy's
    lookup of the records gpushare writes passes it to the checks that parse the record
    field by field (webhook/install/known_records.py)."""
    changed = copy.deepcopy(pod)
    annotations = changed["metadata"]["annotations"]
    record = annotations[APPLIED_ANNOTATION]
    annotations[APPLIED_ANNOTATION] = record.replace('"mode":', '"aaa":"x","mode":', 1)
    changed["metadata"]["name"] += "-parsed"
    return changed


def outcome(webhook: GpushareWebhook, namespace: str, pod: dict[str, Any]) -> str:
    """ "admitted", or the policy's message."""
    try:
        create_pod(webhook.api, namespace, pod)
    except ApiException as error:
        return status_message(error).replace(pod["metadata"]["name"], "<pod>")
    return "admitted"


def raised(pod: dict[str, Any]) -> None:
    resources = pod["spec"]["containers"][0]["resources"]
    resources["limits"][SHARED_RESOURCE] = resources["requests"][SHARED_RESOURCE] = "2"


def moved(pod: dict[str, Any]) -> None:
    pod["spec"]["nodeSelector"]["nvidia.com/gpu.replicas"] = "8"


def renamed(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["name"] = "other"


def visible(pod: dict[str, Any]) -> None:
    env_of(pod).append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})


def loosened(pod: dict[str, Any]) -> None:
    for entry in env_of(pod):
        if entry["name"] == THREADS:
            entry["value"] = "100"


def untouched(pod: dict[str, Any]) -> None:
    pass


@pytest.mark.parametrize(
    ("prefix", "fraction", "change"),
    [
        ("", "0.5", untouched),
        ("", "0.25", raised),
        ("", "0.5", moved),
        ("", "0.5", renamed),
        ("", "0.5", visible),
        ("ml-", "0.25", untouched),
        ("ml-", "0.25", loosened),
        ("ml-", "0.5", raised),
    ],
    ids=lambda v: v.__name__ if callable(v) else v,
)
def test_a_record_looked_up_and_one_parsed_are_judged_alike(
    mutation_down: GpushareWebhook,
    core_v1: k8s.CoreV1Api,
    namespace: str,
    prefix: str,
    fraction: str,
    change: Any,
) -> None:
    """The same pod, its record once as gpushare writes it (looked up among the records the
    policies make) and once in a shape only the general checks read: the same verdict and
    message, tampered or not."""
    where = namespace_named(core_v1, prefix) if prefix else namespace
    mutated = as_mutated(
        mutation_down, annotated_pod(f"alike-{uuid.uuid4().hex[:6]}", fraction), where
    )
    change(mutated)

    looked_up = outcome(mutation_down, where, mutated)

    assert looked_up == outcome(mutation_down, where, parsed_record(mutated))
    assert (looked_up == "admitted") == (change is untouched)


# -- device variables, in every pod a policy refusing them governs ---------------------------


def with_env(pod: dict[str, Any], entry: dict[str, Any], field: str = "containers") -> None:
    """``entry`` in the env of the pod's first container (or a new init container)."""
    if field == "initContainers":
        pod["spec"]["initContainers"] = [
            {"name": "prefetch", "image": pod["spec"]["containers"][0]["image"]}
        ]
    container = pod["spec"][field][0]
    container["env"] = [{"name": "LOG_LEVEL", "value": "info"}, entry]


def device_refusal(container: str, name: str) -> str:
    return (
        f"{name} is set by hand in {container}, which policy 'default' does not allow "
        "(enforcement.deviceVariables: deny)"
    )


@pytest.mark.parametrize(
    ("entry", "field", "container"),
    [
        ({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, "containers", "container 'main'"),
        (
            {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
            "initContainers",
            "init container 'prefetch'",
        ),
        (
            {
                "name": "NVIDIA_VISIBLE_DEVICES",
                "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "visible"}},
            },
            "containers",
            "container 'main'",
        ),
    ],
    ids=["visible-all", "cuda-in-init", "visible-from-configmap"],
)
def test_a_device_variable_set_by_hand_is_refused_in_a_pod_gpushare_never_saw(
    gpushare_webhook: GpushareWebhook,
    namespace: str,
    entry: dict[str, Any],
    field: str,
    container: str,
) -> None:
    """No annotation, no shared resource: the webhooks' filters let this pod by, but the
    default policy (enforcement.deviceVariables: deny by default) governs its namespace."""
    pod = plain_pod("devices")
    with_env(pod, entry, field)

    message = refused(gpushare_webhook, namespace, pod)

    verdict = validate(pod, namespace, load_policies(gpushare_webhook.policies))
    assert message == " ".join(verdict.reasons)
    assert message.startswith(device_refusal(container, entry["name"]))


def test_every_device_variable_is_named_before_a_hand_ask(
    mutation_down: GpushareWebhook, namespace: str
) -> None:
    """One sentence per variable, containers then init containers, ahead of the shared
    resource asked by hand: the webhook's validate says the same, in that order."""
    shared = {SHARED_RESOURCE: "1"}
    pod = plain_pod("many", resources={"limits": shared})
    with_env(pod, {"name": "CUDA_VISIBLE_DEVICES", "value": "1"}, "initContainers")
    pod["spec"]["containers"][0]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-0"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
    ]

    message = refused(mutation_down, namespace, pod)

    reasons = validate(pod, namespace, load_policies(mutation_down.policies)).reasons
    assert message == " ".join(reasons)
    assert [r.split(" is set by hand in ")[1].split(",")[0] for r in reasons] == [
        "container 'main'",
        "container 'main'",
        "init container 'prefetch'",
    ]


def test_device_variables_exposing_no_gpu_and_kai_pods_are_let_through(
    gpushare_webhook: GpushareWebhook, namespace: str
) -> None:
    """void, none and the empty string hide every GPU (nvidia-container-toolkit); KAI's
    binder sets NVIDIA_VISIBLE_DEVICES from a ConfigMap of its own; a namespace no policy
    governs (kube-system) is not checked."""
    for index, value in enumerate(("void", "none", "")):
        pod = plain_pod(f"no-gpu-{index}")
        with_env(pod, {"name": "NVIDIA_VISIBLE_DEVICES", "value": value})
        admitted = create_pod(gpushare_webhook.api, namespace, pod).pod
        assert admitted["spec"]["containers"][0]["env"][-1]["name"] == "NVIDIA_VISIBLE_DEVICES"

    kai = plain_pod("kai")
    kai["spec"]["schedulerName"] = "kai-scheduler"
    with_env(kai, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    assert create_pod(gpushare_webhook.api, namespace, kai).pod["metadata"]["name"] == "kai"

    # A privileged container reaches every device anyway: the GPU Operator's own pods set
    # NVIDIA_VISIBLE_DEVICES=all in privileged containers.
    operator = plain_pod("privileged")
    with_env(operator, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    operator["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    created = create_pod(gpushare_webhook.api, namespace, operator, dry_run=True).pod
    assert created["metadata"]["name"] == "privileged"

    system = plain_pod(f"system-{uuid.uuid4().hex[:6]}")
    with_env(system, {"name": "CUDA_VISIBLE_DEVICES", "value": "0"})
    created = create_pod(gpushare_webhook.api, "kube-system", system, dry_run=True).pod
    assert created["metadata"]["name"] == system["metadata"]["name"]


# -- what the policy never touches ----------------------------------------------------------


def test_ordinary_pods_and_excluded_namespaces_are_untouched(
    mutation_down: GpushareWebhook, core_v1: k8s.CoreV1Api, namespace: str
) -> None:
    """No annotation and no shared resource: admitted as written (a whole GPU asked by hand
    is not the shared resource). Opted-out namespaces are outside the policy's match."""
    ordinary = plain_pod("ordinary", resources={"limits": {"nvidia.com/gpu": "1", "cpu": "1"}})
    admitted = create_pod(mutation_down.api, namespace, ordinary).pod
    assert admitted["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "cpu": "1",
    }
    assert "annotations" not in admitted["metadata"]

    opted_out = f"opted-out-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespace(
        k8s.V1Namespace(
            metadata=k8s.V1ObjectMeta(name=opted_out, labels={"gpushare.io/webhook": "exclude"})
        )
    )
    shared = {SHARED_RESOURCE: "1"}
    by_hand = plain_pod("by-hand", resources={"requests": shared, "limits": shared})
    assert create_pod(mutation_down.api, opted_out, by_hand).pod["metadata"]["name"] == "by-hand"
    core_v1.delete_collection_namespaced_pod(opted_out, grace_period_seconds=0)
    core_v1.delete_namespace(opted_out)
