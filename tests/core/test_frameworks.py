"""Framework memory knobs: only into their framework's images, only into releases that read
them (PyTorch's allocator key only where the version is known), merged with the user's env."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.core.framework_images import (
    image_version,
    normalized,
    parse_version,
    split_reference,
)
from webhook.core.planning import Planned
from webhook.core.policy.model import PolicySet
from webhook.core.verdict import mutate, mutated_pod
from webhook.errors import PolicyError

from .support import env_of, env_values, make_pod, policies_from, simple_policy

TORCH_IMAGE = "pytorch/pytorch:2.10.0-cuda12.8-cudnn9-runtime"
TF_IMAGE = "tensorflow/tensorflow:2.17.0-gpu"
JAX_IMAGE = "ghcr.io/nvidia/jax:jax-2024-10-01"


def _torch_policies(**frameworks: Any) -> PolicySet:
    pytorch = {"memoryFraction": True, **frameworks}
    return policies_from(
        simple_policy(headroom="2%", fraction={"min": 0.05}, frameworks={"pytorch": pytorch})
    )


def _env_after(
    policies: PolicySet,
    env: list[dict[str, Any]] | None = None,
    image: str = TORCH_IMAGE,
    fraction: str = "0.5",
) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    container: dict[str, Any] = {"name": "train", "image": image}
    if env is not None:
        container["env"] = env
    pod = make_pod({"gpu-fraction": fraction}, containers=[container])
    outcome = mutate(pod, "x", policies)
    assert outcome.allowed, outcome.reasons
    assert outcome.decision is not None
    result = mutated_pod(pod, outcome.decision)
    assert mutate(result, "x", policies).patch == []
    return env_of(result), outcome.warnings


def _default_policies() -> PolicySet:
    return policies_from(simple_policy(headroom="2%", fraction={"min": 0.05}))


# -- which containers get which framework's env ------------------------------------------------


@pytest.mark.parametrize(
    ("image", "names"),
    [
        (TF_IMAGE, ["TF_FORCE_GPU_ALLOW_GROWTH"]),
        ("docker.io/tensorflow/tensorflow:2.17.0-gpu", ["TF_FORCE_GPU_ALLOW_GROWTH"]),
        ("jupyter/tensorflow-notebook:2023-10-20", ["TF_FORCE_GPU_ALLOW_GROWTH"]),
        (JAX_IMAGE, ["XLA_PYTHON_CLIENT_MEM_FRACTION"]),
        ("nvcr.io/nvidia/jax:24.04-py3", ["XLA_PYTHON_CLIENT_MEM_FRACTION"]),
        # The issue's examples: none of these run TensorFlow or JAX.
        ("linuxserver/blender:4.2.0", []),
        ("nvcr.io/nvidia/tritonserver:24.08-py3", []),
        (TORCH_IMAGE, []),
        ("vllm/vllm-openai:v0.6.3", []),
    ],
)
def test_framework_env_goes_only_into_that_frameworks_images(image: str, names: list[str]) -> None:
    env, warnings = _env_after(_default_policies(), image=image, fraction="0.25")
    assert [e["name"] for e in env] == names
    assert [w for w in warnings if "vLLM" not in w] == []
    if "XLA_PYTHON_CLIENT_MEM_FRACTION" in names:
        assert env[0]["value"] == "0.23"  # 0.25 - 2% headroom


def test_all_containers_puts_tensorflow_and_jax_env_into_any_image() -> None:
    policies = policies_from(
        simple_policy(headroom="2%", fraction={"min": 0.05}, frameworks={"allContainers": True})
    )
    env, _ = _env_after(policies, image="linuxserver/blender:4.2.0", fraction="0.25")
    assert env == [
        {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "true"},
        {"name": "XLA_PYTHON_CLIENT_MEM_FRACTION", "value": "0.23"},
    ]


def test_all_containers_does_not_lift_the_pytorch_version_gate() -> None:
    policies = policies_from(
        simple_policy(
            frameworks={"allContainers": True, "pytorch": {"memoryFraction": True}},
        )
    )
    env, warnings = _env_after(policies, image="registry.example.com/team/train:v3")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in {e["name"] for e in env}
    assert warnings == (
        "per_process_memory_fraction not set: the image's PyTorch version is unknown "
        "(declare it in frameworks.pytorch.versions)",
    )


def test_policy_images_replace_the_official_ones() -> None:
    policies = policies_from(
        simple_policy(frameworks={"tensorflow": {"images": ["registry.example.com/tf/*"]}})
    )
    env, _ = _env_after(policies, image="registry.example.com/tf/serving:1")
    assert {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "true"} in env
    env, _ = _env_after(policies, image=TF_IMAGE)
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in {e["name"] for e in env}


def test_knobs_can_be_switched_off_and_jax_preallocate_set() -> None:
    policies = policies_from(
        simple_policy(
            frameworks={
                "tensorflow": {"allowGrowth": False},
                "jax": {"memoryFraction": False, "preallocate": False},
            }
        )
    )
    env, _ = _env_after(policies, image=JAX_IMAGE)
    assert env == [{"name": "XLA_PYTHON_CLIENT_PREALLOCATE", "value": "false"}]


def test_memory_headroom_is_converted_with_the_pool_memory() -> None:
    policies = policies_from(simple_policy(mode="mps", gpuMemory="40Gi", headroom="1Gi"))
    env, _ = _env_after(policies, image=JAX_IMAGE, fraction="0.25")
    # 0.25 - 1/40 = 0.225
    values = env_values({"spec": {"containers": [{"env": env}]}})
    assert values["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.225"


def test_a_share_the_headroom_eats_is_no_problem_where_no_fraction_is_sent() -> None:
    policies = policies_from(
        simple_policy(mode="mps", gpuMemory="16Gi", headroom="2Gi", fraction={"min": 0.05})
    )
    env, _ = _env_after(policies, image=TF_IMAGE, fraction="0.1")
    assert {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "true"} in env


# -- JAX: one fraction variable, never two -----------------------------------------------------


@pytest.mark.parametrize(
    ("user", "added"),
    [
        ([], ["XLA_PYTHON_CLIENT_MEM_FRACTION"]),
        ([{"name": "XLA_CLIENT_MEM_FRACTION", "value": "0.2"}], []),
        ([{"name": "XLA_PYTHON_CLIENT_MEM_FRACTION", "value": "0.2"}], []),
    ],
)
def test_jax_never_gets_both_fraction_names(user: list[dict[str, Any]], added: list[str]) -> None:
    # jaxlib 0.4.33+ raises "XLA_CLIENT_MEM_FRACTION is specified together with
    # XLA_PYTHON_CLIENT_MEM_FRACTION" and JAX falls back to the CPU.
    env, _ = _env_after(_default_policies(), [*user], image=JAX_IMAGE)
    names = [e["name"] for e in env]
    assert names == [e["name"] for e in user] + added
    assert not {"XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"} <= set(names)


# -- PyTorch's allocator key -------------------------------------------------------------------


def test_pytorch_fraction_is_off_by_default() -> None:
    env, _ = _env_after(policies_from(simple_policy()))
    assert "PYTORCH_CUDA_ALLOC_CONF" not in {e["name"] for e in env}


def test_pytorch_fraction_is_added_when_the_user_set_no_allocator_config() -> None:
    env, warnings = _env_after(_torch_policies())
    assert env == [{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "per_process_memory_fraction:0.48"}]
    assert warnings == ()


@pytest.mark.parametrize(
    ("user", "merged"),
    [
        ("expandable_segments:True", "expandable_segments:True,per_process_memory_fraction:0.48"),
        (
            "max_split_size_mb:128, garbage_collection_threshold:0.6",
            "max_split_size_mb:128,garbage_collection_threshold:0.6,per_process_memory_fraction:0.48",
        ),
        (
            "per_process_memory_fraction:0.3,expandable_segments:True",
            "expandable_segments:True,per_process_memory_fraction:0.3",
        ),
        ("per_process_memory_fraction:0.9", "per_process_memory_fraction:0.48"),
        ("per_process_memory_fraction:lots", "per_process_memory_fraction:0.48"),
        ("", "per_process_memory_fraction:0.48"),
    ],
)
def test_pytorch_fraction_is_merged_into_the_user_config_smaller_fraction_wins(
    user: str, merged: str
) -> None:
    env, _ = _env_after(
        _torch_policies(),
        [{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": user}, {"name": "A", "value": "1"}],
    )
    assert env[0] == {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": merged}
    assert env[1] == {"name": "A", "value": "1"}
    assert [e["name"] for e in env].count("PYTORCH_CUDA_ALLOC_CONF") == 1


def test_pytorch_fraction_goes_into_the_newer_alias_when_only_that_is_set() -> None:
    env, _ = _env_after(
        _torch_policies(), [{"name": "PYTORCH_ALLOC_CONF", "value": "expandable_segments:True"}]
    )
    assert env[0] == {
        "name": "PYTORCH_ALLOC_CONF",
        "value": "expandable_segments:True,per_process_memory_fraction:0.48",
    }
    assert "PYTORCH_CUDA_ALLOC_CONF" not in {e["name"] for e in env}


def test_pytorch_fraction_goes_into_the_older_name_when_both_are_set() -> None:
    # PyTorch 2.9 and 2.10 parse PYTORCH_CUDA_ALLOC_CONF when both are set (measured).
    user = [
        {"name": "PYTORCH_ALLOC_CONF", "value": "expandable_segments:True"},
        {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "max_split_size_mb:128"},
    ]
    env, _ = _env_after(_torch_policies(), user)
    assert env == [
        user[0],
        {
            "name": "PYTORCH_CUDA_ALLOC_CONF",
            "value": "max_split_size_mb:128,per_process_memory_fraction:0.48",
        },
    ]


def test_pytorch_config_from_value_from_is_left_alone_with_a_warning() -> None:
    user = [
        {
            "name": "PYTORCH_CUDA_ALLOC_CONF",
            "valueFrom": {"configMapKeyRef": {"name": "t", "key": "k"}},
        }
    ]
    env, warnings = _env_after(_torch_policies(), user)
    assert env == user
    assert warnings == (
        "PYTORCH_CUDA_ALLOC_CONF comes from valueFrom; per_process_memory_fraction not merged",
    )


PREDATES = "per_process_memory_fraction not set: PyTorch {} in the image predates it (2.10.0)"
UNKNOWN = (
    "per_process_memory_fraction not set: the image's PyTorch version is unknown "
    "(declare it in frameworks.pytorch.versions)"
)


@pytest.mark.parametrize(
    ("image", "gated", "warning"),
    [
        ("pytorch/pytorch:2.10.0-cuda12.8-cudnn9-runtime", True, None),
        ("pytorch/pytorch:2.11.0-cuda13.0-cudnn9-devel", True, None),
        ("docker.io/pytorch/pytorch:2.10.0-cuda12.6-cudnn9-runtime", True, None),
        ("pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime", False, PREDATES.format("2.9.1")),
        ("pytorch/pytorch:2.1.0-cuda11.8-cudnn8-runtime", False, PREDATES.format("2.1.0")),
        # NGC 25.12 is 2.10.0a0: a pre-release that may predate the key.
        ("nvcr.io/nvidia/pytorch:25.12-py3", False, PREDATES.format("2.10.0a0")),
        ("nvcr.io/nvidia/pytorch:25.01-py3", False, PREDATES.format("2.10.0a0")),
        ("nvcr.io/nvidia/pytorch:24.08-py3", False, PREDATES.format("2.10.0a0")),
        ("nvcr.io/nvidia/pytorch:26.03-py3", False, UNKNOWN),
        ("pytorch/pytorch:latest", False, UNKNOWN),
        ("pytorch/pytorch@sha256:" + "a" * 64, False, UNKNOWN),
        ("registry.example.com/ml/train:v3", True, None),  # declared 2.10 by the policy
        ("jupyter/tensorflow-notebook:2023-10-20", False, None),  # not a PyTorch image
    ],
)
def test_pytorch_fraction_needs_a_known_version_that_parses_the_key(
    mps_example: PolicySet, image: str, gated: bool, warning: str | None
) -> None:
    pod = make_pod({"gpu-fraction": "0.5"}, containers=[{"name": "t", "image": image}])
    outcome = mutate(pod, "ml-x", mps_example)
    assert outcome.decision is not None
    names = {e["name"] for e in env_of(mutated_pod(pod, outcome.decision))}
    assert ("PYTORCH_CUDA_ALLOC_CONF" in names) is gated
    assert [w for w in outcome.warnings if "per_process" in w] == ([warning] if warning else [])


def test_declared_versions_gate_like_read_ones() -> None:
    policies = _torch_policies(
        images=["registry.example.com/*"],
        versions={"registry.example.com/old/*": "2.9.1", "registry.example.com/*": "v2.10"},
    )
    env, warnings = _env_after(policies, image="registry.example.com/old/train:1")
    assert env == []
    assert warnings == (PREDATES.format("2.9.1"),)
    env, warnings = _env_after(policies, image="registry.example.com/new/train:1")
    assert env[0]["name"] == "PYTORCH_CUDA_ALLOC_CONF"


# -- policies that could never send the key are refused at load time ---------------------------


@pytest.mark.parametrize("glob", ["pytorch/pytorch:2.9*", "nvcr.io/nvidia/pytorch:25.*"])
def test_a_pytorch_image_glob_matching_only_older_releases_is_refused(glob: str) -> None:
    with pytest.raises(PolicyError) as error:
        _torch_policies(images=[TORCH_IMAGE, glob])
    assert (
        f"test.yaml: spec.frameworks.pytorch.images[1]: {glob!r} matches only PyTorch "
        "releases before 2.10.0, which refuse per_process_memory_fraction in their allocator "
        "config: match newer images or remove it (line "
    ) in str(error.value)


@pytest.mark.parametrize(
    "images",
    [
        ["pytorch/pytorch:*"],
        ["pytorch/pytorch:2.1*"],
        ["nvcr.io/nvidia/pytorch:*"],
        ["registry.example.com/train:*"],
    ],
)
def test_pytorch_image_globs_that_can_match_a_new_enough_release_load(images: list[str]) -> None:
    assert _torch_policies(images=images).policies[0].frameworks.pytorch.images == tuple(images)


def test_an_old_glob_loads_while_the_pytorch_key_is_off() -> None:
    policies = policies_from(
        simple_policy(frameworks={"pytorch": {"images": ["pytorch/pytorch:2.9*"]}})
    )
    assert policies.policies[0].frameworks.pytorch.images == ("pytorch/pytorch:2.9*",)


# -- reading versions from image references ----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("2.10.0", (2, 10, 0, 0)),
        ("2.17.0-gpu", (2, 17, 0, 0)),
        ("v0.6.3", (0, 6, 3, 0)),
        ("2.10", (2, 10, 0, 0)),
        ("2.10.0a0+b4e4ee81d3", (2, 10, 0, -1)),
        ("2.10.0rc1", (2, 10, 0, -1)),
        ("latest", None),
        ("jax-2024-10-01", None),
    ],
)
def test_parse_version(text: str, version: tuple[int, ...] | None) -> None:
    assert parse_version(text) == version
    if version is not None and version[3] < 0:
        assert version < (2, 10, 0, 0)


@pytest.mark.parametrize(
    ("image", "repository", "tag"),
    [
        (
            "pytorch/pytorch:2.10.0-cuda12.8-cudnn9-runtime",
            "pytorch/pytorch",
            "2.10.0-cuda12.8-cudnn9-runtime",
        ),
        ("docker.io/library/python:3.12", "python", "3.12"),
        ("registry.local:5000/team/train", "registry.local:5000/team/train", ""),
        ("registry.local:5000/team/train:v1", "registry.local:5000/team/train", "v1"),
        ("pytorch/pytorch:2.10.0@sha256:" + "b" * 64, "pytorch/pytorch", "2.10.0"),
        ("pytorch/pytorch@sha256:" + "b" * 64, "pytorch/pytorch", ""),
    ],
)
def test_split_reference(image: str, repository: str, tag: str) -> None:
    assert split_reference(image) == (repository, tag)
    assert (
        normalized("index.docker.io/tensorflow/tensorflow:2.17.0") == "tensorflow/tensorflow:2.17.0"
    )


def test_image_version_says_where_a_version_came_from() -> None:
    assert image_version("tensorflow", TF_IMAGE).source == "tag 2.17.0-gpu of tensorflow/tensorflow"
    declared = image_version("pytorch", "r.example/x:1", [("r.example/*", "2.10")])
    assert (declared.version, declared.source) == (
        (2, 10, 0, 0),
        "declared for 'r.example/*' by the policy",
    )
    assert image_version("jax", JAX_IMAGE).version is None


def test_a_tensorflow_known_to_predate_the_growth_variable_gets_none() -> None:
    env, warnings = _env_after(_default_policies(), image="tensorflow/tensorflow:1.11.0-gpu")
    assert env == []
    assert warnings == (
        "TF_FORCE_GPU_ALLOW_GROWTH not set: TensorFlow 1.11.0 in the image predates it (1.12.0)",
    )


# -- explain -----------------------------------------------------------------------------------


def test_explain_says_per_container_which_framework_env_was_added_or_skipped() -> None:
    pod = make_pod(
        {"gpu-fraction": "0.5"},
        containers=[{"name": "nb", "image": TF_IMAGE}, {"name": "proxy", "image": "nginx:1.27"}],
    )
    outcome = mutate(pod, "x", _default_policies(), explain=True)
    assert isinstance(outcome.decision, Planned)
    lines = [x for x in outcome.decision.explanation if x.startswith("frameworks:")]
    assert lines == [
        f"frameworks: container 'nb' ({TF_IMAGE}): tensorflow: TF_FORCE_GPU_ALLOW_GROWTH added "
        "(image matches 'tensorflow/tensorflow:*'; tag 2.17.0-gpu of tensorflow/tensorflow)",
        f"frameworks: container 'nb' ({TF_IMAGE}): jax: XLA_PYTHON_CLIENT_MEM_FRACTION not "
        f"added: '{TF_IMAGE}' is none of its official images",
        f"frameworks: container 'nb' ({TF_IMAGE}): pytorch: per_process_memory_fraction off "
        "(frameworks.pytorch.memoryFraction)",
        "frameworks: container 'proxy': no framework env (it gets no GPU)",
    ]
