"""Which container gets the GPU without ``gpu-fraction-container-name`` (docs/annotations.md):
the first with a known GPU container name, else the first that is no known helper, else the
first; a guess among several plain containers is admitted with a warning."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from webhook.constants import (
    APPLIED_ANNOTATION,
    CONTAINER_ANNOTATION,
    GPU_CONTAINER_NAMES,
    HELPER_CONTAINER_NAMES,
)
from webhook.core.container_choice import ONLY, Rule, choose_container
from webhook.core.planning import Planned, _container_index, plan_pod
from webhook.core.policy.loader import load_policy_text
from webhook.core.request import read_request
from webhook.core.verdict import mutate, mutated_pod

from .support import make_pod, policies_from, simple_policy

POLICIES = policies_from(simple_policy())


def _containers(*names: str) -> list[dict[str, Any]]:
    return [{"name": name, "image": f"registry.example.com/{name}:1"} for name in names]


def _gpu_container(*names: str, annotations: dict[str, str] | None = None) -> str:
    """The container the admitted pod's record names, after checking that only it got
    the GPU resource."""
    pod = make_pod({"gpu-fraction": "0.5", **(annotations or {})}, _containers(*names))
    verdict = mutate(pod, "default", POLICIES)
    assert verdict.allowed, verdict.reasons
    assert verdict.decision is not None
    result = mutated_pod(pod, verdict.decision)
    with_gpu = [c["name"] for c in result["spec"]["containers"] if "resources" in c]
    record = json.loads(result["metadata"]["annotations"][APPLIED_ANNOTATION])
    assert with_gpu == [record["container"]]
    return str(record["container"])


def _warnings(*names: str) -> tuple[str, ...]:
    return mutate(make_pod({"gpu-fraction": "0.5"}, _containers(*names)), "x", POLICIES).warnings


# -- rule 1: the annotation names it ------------------------------------------------------


def test_the_annotation_names_the_container_whatever_the_names() -> None:
    named = {CONTAINER_ANNOTATION: "wait"}
    assert _gpu_container("wait", "main", annotations=named) == "wait"
    named = {CONTAINER_ANNOTATION: "b"}
    assert _gpu_container("a", "b", annotations=named) == "b"
    # Named, so no guess and no warning.
    pod = make_pod({"gpu-fraction": "0.5", **named}, _containers("a", "b"))
    assert mutate(pod, "x", POLICIES).warnings == ()


# -- rule 2: a known GPU container name ----------------------------------------------------


@pytest.mark.parametrize(
    ("names", "chosen"),
    [
        (("wait", "main"), "main"),  # Argo Workflows
        (("istio-proxy", "queue-proxy", "kserve-container"), "kserve-container"),  # KServe
        (("sidecar", "pytorch"), "pytorch"),  # PyTorchJob with a sidecar before it
        (("fluent-bit", "tensorflow"), "tensorflow"),
        (("log-shipper", "node"), "node"),  # Kubeflow Trainer
        (("ray-head", "autoscaler"), "ray-head"),  # KubeRay's head pod
        (("pytorch", "main"), "pytorch"),  # the first known name wins
    ],
)
def test_a_known_gpu_container_name_gets_the_gpu(names: tuple[str, ...], chosen: str) -> None:
    assert _gpu_container(*names) == chosen
    assert _warnings(*names) == ()


def test_every_known_name_is_chosen_over_a_plain_container_before_it() -> None:
    for name in GPU_CONTAINER_NAMES:
        choice = choose_container(["app", name])
        assert (choice.index, choice.rule, choice.warning) == (1, Rule.GPU_NAME, None), name


# -- rule 3: the first that is no helper -----------------------------------------------------


@pytest.mark.parametrize(
    ("names", "chosen"),
    [
        (("istio-proxy", "app"), "app"),  # a mesh proxy put first
        (("linkerd-proxy", "vault-agent", "trainer"), "trainer"),
        (("cloud-sql-proxy", "app", "fluentd"), "app"),
        (("app", "oauth2-proxy"), "app"),
    ],
)
def test_known_helpers_are_passed_over(names: tuple[str, ...], chosen: str) -> None:
    assert _gpu_container(*names) == chosen
    assert _warnings(*names) == ()


def test_no_helper_is_ever_chosen_before_a_plain_container() -> None:
    for name in HELPER_CONTAINER_NAMES:
        choice = choose_container([name, "app"])
        assert (choice.index, choice.rule, choice.warning) == (1, Rule.NOT_HELPER, None), name
    assert not set(GPU_CONTAINER_NAMES) & set(HELPER_CONTAINER_NAMES)


# -- rule 4: every container a helper --------------------------------------------------------


def test_every_container_a_helper_gives_the_first() -> None:
    assert _gpu_container("istio-proxy", "fluent-bit") == "istio-proxy"
    assert _warnings("istio-proxy", "fluent-bit") == ()
    assert choose_container(["wait", "agent"]).rule is Rule.FIRST


# -- the guess ---------------------------------------------------------------------------


def test_two_plain_containers_are_a_guess_with_a_warning() -> None:
    assert _gpu_container("app", "exporter") == "app"
    assert _warnings("app", "exporter") == (
        'container "app" got the GPU, as the first of "app", "exporter": set '
        "gpu-fraction-container-name to the one that uses it",
    )


def test_the_warning_names_only_the_candidates_and_helpers_do_not_count() -> None:
    assert _gpu_container("istio-proxy", "app", "worker") == "app"
    assert _warnings("istio-proxy", "app", "worker") == (
        'container "app" got the GPU, as the first of "app", "worker": set '
        "gpu-fraction-container-name to the one that uses it",
    )
    # One plain container beside helpers is no guess.
    assert _warnings("istio-proxy", "app", "wait") == ()


# -- explain, the usual pod, KAI -------------------------------------------------------------


def _explanation(*names: str, annotations: dict[str, str] | None = None) -> list[str]:
    pod = make_pod({"gpu-fraction": "0.5", **(annotations or {})}, _containers(*names))
    decision = plan_pod(pod, "x", POLICIES, explain=True)
    assert isinstance(decision, Planned)
    return [line for line in decision.explanation if line.startswith("container: ")]


def test_explain_says_which_rule_chose_and_which_helpers_were_passed_over() -> None:
    assert _explanation("wait", "main") == [
        "container: 'main' (a known GPU container name: Argo Workflows' main container; "
        "passed over 'wait' (Argo Workflows' wait container))"
    ]
    assert _explanation("istio-proxy", "app") == [
        "container: 'app' (the one container that is not a known helper; passed over "
        "'istio-proxy' (Istio's sidecar))"
    ]
    assert _explanation("a", "b") == [
        "container: 'a' (a guess: the first of the containers that are neither known GPU "
        "containers nor helpers, before 'b')"
    ]
    assert _explanation("a", "b", annotations={CONTAINER_ANNOTATION: "b"}) == [
        "container: 'b' (named by gpu-fraction-container-name)"
    ]
    # One container: nothing to say.
    assert _explanation("app") == []


def test_a_single_container_pod_reads_no_names() -> None:
    """The usual pod takes the shared constant: no list of names, no choice object."""
    request = read_request({"gpu-fraction": "0.5"})
    assert not isinstance(request, list)
    spec = {"containers": [{"name": "wait"}]}  # even a helper's name: it is the only one
    assert _container_index(spec, request) is ONLY


def test_kai_gets_the_annotation_naming_the_chosen_container() -> None:
    """KAI-Scheduler gives the GPU to the first container unless the annotation names one:
    the container gpushare chose is written into the annotation."""
    policies = load_policy_text(
        "apiVersion: gpushare.io/v1alpha1\nkind: GpuSharingPolicy\nmetadata: {name: k}\n"
        "spec: {default: true, mode: kai}\n",
        "k.yaml",
    )
    pod = make_pod({"gpu-fraction": "0.5"}, _containers("wait", "main"))
    before = copy.deepcopy(pod)
    verdict = mutate(pod, "x", policies)
    assert verdict.allowed and verdict.decision is not None
    result = mutated_pod(pod, verdict.decision)
    assert pod == before
    assert result["metadata"]["annotations"][CONTAINER_ANNOTATION] == "main"
    assert mutate(result, "x", policies).patch == []  # idempotent
    # Container 0 chosen: KAI's default already agrees, nothing added.
    pod = make_pod({"gpu-fraction": "0.5"}, _containers("main", "wait"))
    verdict = mutate(pod, "x", policies)
    assert verdict.decision is not None
    assert CONTAINER_ANNOTATION not in mutated_pod(pod, verdict.decision)["metadata"]["annotations"]
