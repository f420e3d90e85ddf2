"""Every container counts: a GPU resource asked by hand in any container of an annotated
pod (app, init, sidecar, ephemeral) is refused, naming the container and what to do.

The ``KAI_CASES`` are KAI-Scheduler's own validator cases, ported: KAI-Scheduler v0.13.0
(commit 5d35eca), ``pkg/binder/plugins/gpusharing/gpu-request/gpu_request_validator_test.go``
(``TestValidateGpuRequests``); its validator (same directory, ``gpu_request_validator.go``)
looks for ``nvidia.com/gpu`` in every container and init container (``getFirstGPULimit``).
gpushare differs where its own rules say more: ``gpu-fraction`` and ``gpu-memory`` together
are admitted when they agree, and whole GPUs come from ``gpu-fraction: "2"``. KAI's MPS
annotation is KAI's own and ignored here. ``gpu-fraction-num-devices`` is read as KAI reads
it (the share on each of that many GPUs): the bundled time-slicing policy gives a share of
one GPU, so it refuses more than one device instead of silently giving less (modes that
give several, hami and kai, are tested in tests/core/test_schemes.py).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from webhook.core import PolicySet, mutate, mutated_pod

from .support import assert_valid_kubernetes_pod, make_pod

GPU = "nvidia.com/gpu"


def _container(name: str, limits: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "python:3.12", **extra}
    if limits is not None:
        container["resources"] = {"limits": dict(limits)}
    return container


def _outcome(policies: PolicySet, annotations: dict[str, str], **spec: Any) -> tuple[bool, str]:
    """(admitted, the reasons joined) for a pod in namespace research (default policy)."""
    pod = make_pod(annotations, **spec)
    verdict = mutate(pod, "research", policies)
    if verdict.patch and verdict.decision is not None:  # what gpushare wrote is valid
        assert_valid_kubernetes_pod(mutated_pod(copy.deepcopy(pod), verdict.decision))
    return verdict.allowed, " ".join(verdict.reasons)


# (KAI's test name, annotations, containers, admitted by gpushare, a piece of the reason)
KAI_CASES = [
    (
        "forbid GPU annotation and GPU request mismatch (fractional)",
        {"gpu-fraction": "0.5"},
        [_container("main", {GPU: "2m"})],
        False,
        "container 'main' already asks for nvidia.com/gpu: 2m",
    ),
    (
        "forbid fraction limit (1500 milli)",
        {"gpu-fraction": "1.5"},
        [_container("main")],
        False,
        'gpu-fraction "1.5" is more than one GPU but not a whole number',
    ),
    ("Allow whole GPU resource limit of 2", {}, [_container("main", {GPU: "2"})], True, ""),
    (
        "Allow whole gpu request of 2, represented as millis",
        {},
        [_container("main", {GPU: "2000m"})],
        True,
        "",
    ),
    (
        "forbid GPU fraction with GPU Memory fraction annotation",
        {"gpu-fraction": "0.5", "gpu-memory": "1"},
        [_container("main")],
        False,
        'gpu-fraction "0.5" and gpu-memory "1" cannot be checked against each other',
    ),
    (
        "Allow multiple containers with whole GPU resource request",
        {},
        [_container("one", {GPU: "1"}), _container("two", {GPU: "2"})],
        True,
        "",
    ),
    (
        "forbid GPU resource limit with GPU Memory fraction annotation",
        {"gpu-memory": "1"},
        [_container("main", {GPU: "1m"})],
        False,
        "container 'main' already asks for nvidia.com/gpu: 1m",
    ),
    (
        "forbid GPU resource limit in sidecar container with GPU Memory fraction annotation",
        {"gpu-memory": "1"},
        [_container("distraction-container"), _container("sneaky-gpu-container", {GPU: "1m"})],
        False,
        "container 'sneaky-gpu-container' asks for nvidia.com/gpu: 1m in resources.limits next "
        "to the gpu-memory annotation",
    ),
    (
        "forbid negative GPU memory annotation",
        {"gpu-memory": "-1"},
        [_container("main")],
        False,
        'gpu-memory "-1" is not a memory size',
    ),
    (
        "forbid negative GPU fraction annotation",
        {"gpu-fraction": "-1"},
        [_container("main")],
        False,
        'gpu-fraction "-1" is not a plain decimal',
    ),
    (
        "forbid GPU fraction which is greater than 1.0",
        {"gpu-fraction": "1.2"},
        [_container("main")],
        False,
        'gpu-fraction "1.2" is more than one GPU but not a whole number',
    ),
    (
        "GPU fraction count with memory: one GPU under time-slicing",
        {"gpu-fraction-num-devices": "2", "gpu-memory": "1000"},
        [_container("main")],
        False,
        'gpu-fraction-num-devices "2" asks for the share on 2 GPUs, but mode time-slicing of '
        "policy 'default' gives a share of one GPU",
    ),
    (
        "GPU fraction count with fractions: one GPU under time-slicing",
        {"gpu-fraction-num-devices": "2", "gpu-fraction": "0.3"},
        [_container("main")],
        False,
        'gpu-fraction-num-devices "2" asks for the share on 2 GPUs',
    ),
]


@pytest.mark.parametrize(
    ("annotations", "containers", "admitted", "reason"),
    [case[1:] for case in KAI_CASES],
    ids=[case[0] for case in KAI_CASES],
)
def test_kai_scheduler_validator_cases(
    bundled: PolicySet,
    annotations: dict[str, str],
    containers: list[dict[str, Any]],
    admitted: bool,
    reason: str,
) -> None:
    allowed, reasons = _outcome(bundled, annotations, containers=containers)
    assert allowed is admitted, reasons
    assert reason in reasons


def test_a_second_app_container_asking_for_a_gpu_is_refused_with_what_to_do(
    bundled: PolicySet,
) -> None:
    containers = [_container("app"), _container("tokenizer", {GPU: "1"})]
    allowed, reasons = _outcome(bundled, {"gpu-fraction": "0.5"}, containers=containers)
    assert not allowed
    assert reasons == (
        "container 'tokenizer' asks for nvidia.com/gpu: 1 in resources.limits next to the "
        "gpu-fraction annotation, which gives container 'app' the GPU: remove it there; if "
        "'tokenizer' is the container that needs the GPU, name it in "
        "gpu-fraction-container-name instead (one container per pod gets the GPU); or remove "
        "the annotation and ask for whole GPUs by hand."
    )


@pytest.mark.parametrize(
    ("field", "extra", "kind"),
    [
        ("initContainers", {}, "init container"),
        (
            "initContainers",
            {"restartPolicy": "Always"},
            "sidecar container (init container with restartPolicy Always)",
        ),
        ("ephemeralContainers", {}, "ephemeral container"),
    ],
)
def test_init_sidecar_and_ephemeral_containers_count(
    bundled: PolicySet, field: str, extra: dict[str, str], kind: str
) -> None:
    other = _container("helper", {GPU: "1"}, **extra)
    allowed, reasons = _outcome(bundled, {"gpu-fraction": "0.5"}, **{field: [other]})
    assert not allowed
    assert reasons == (
        f"{kind} 'helper' asks for nvidia.com/gpu: 1 in resources.limits next to the "
        "gpu-fraction annotation, which gives container 'app' the GPU: remove it there: the "
        "pod would need nvidia.com/gpu besides the GPU the annotation gives, and no node of a "
        "sharing pool offers both; or remove the annotation and ask for whole GPUs by hand."
    )


@pytest.mark.parametrize(
    "resource",
    ["nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "nvidia.com/gpumem", "aliyun.com/gpu-mem"],
)
def test_every_gpu_resource_gpushare_knows_counts(bundled: PolicySet, resource: str) -> None:
    sidecar = _container("helper", {resource: "1"}, restartPolicy="Always")
    allowed, reasons = _outcome(bundled, {"gpu-fraction": "0.25"}, initContainers=[sidecar])
    assert not allowed
    assert f"asks for {resource}: 1 in resources.limits" in reasons


def test_whole_gpus_from_the_annotation_count_too(bundled: PolicySet) -> None:
    init = _container("warmup", {GPU: "1"})
    allowed, reasons = _outcome(bundled, {"gpu-fraction": "2"}, initContainers=[init])
    assert not allowed
    assert reasons.startswith("init container 'warmup' asks for nvidia.com/gpu: 1")


def test_a_request_copied_from_the_limit_is_one_ask_and_each_ask_is_named(
    bundled: PolicySet,
) -> None:
    """The apiserver copies limits into missing requests before admission: one message per
    ask, as for the manifest the user wrote; two different asks, two messages."""
    copied = {"limits": {GPU: "1"}, "requests": {GPU: "1"}}
    two = {"limits": {GPU: "1", "nvidia.com/gpu.shared": "2"}}
    init = [
        {"name": "a", "image": "x", "resources": copied},
        {"name": "b", "image": "x", "resources": two},
    ]
    verdict = mutate(make_pod({"gpu-fraction": "0.5"}, initContainers=init), "research", bundled)
    assert [r.split(" next to")[0] for r in verdict.reasons] == [
        "init container 'a' asks for nvidia.com/gpu: 1 in resources.limits",
        "init container 'b' asks for nvidia.com/gpu: 1 in resources.limits",
        "init container 'b' asks for nvidia.com/gpu.shared: 2 in resources.limits",
    ]


def test_containers_without_gpu_asks_and_other_resources_are_fine(bundled: PolicySet) -> None:
    sidecar = _container("proxy", {"cpu": "1", "memory": "128Mi"}, restartPolicy="Always")
    init = _container("fetch", {"example.com/fpga": "1"})
    allowed, reasons = _outcome(
        bundled,
        {"gpu-fraction": "0.5"},
        initContainers=[init, sidecar],
        containers=[_container("app"), _container("metrics", {"cpu": "100m"})],
    )
    assert allowed, reasons


def test_the_validating_webhook_refuses_the_same_pod(bundled: PolicySet) -> None:
    """A sidecar added after mutation (by a later webhook) is caught at validation."""
    from webhook.core import validate

    pod = make_pod({"gpu-fraction": "0.5"})
    verdict = mutate(pod, "research", bundled)
    assert verdict.decision is not None
    admitted = mutated_pod(pod, verdict.decision)
    admitted["spec"]["initContainers"] = [_container("gpu-probe", {GPU: "1"})]
    checked = validate(admitted, "research", bundled)
    assert not checked.allowed
    assert checked.reasons[0].startswith("init container 'gpu-probe' asks for nvidia.com/gpu: 1")
