"""Framework memory knobs: TensorFlow growth, JAX fractions, the PyTorch allocator merge."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.core.policy.model import PolicySet
from webhook.core.verdict import mutate, mutated_pod

from .support import env_of, env_values, make_pod, policies_from, simple_policy

TORCH_IMAGE = "pytorch/pytorch:2.9.0-cuda12.8-cudnn9-runtime"


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


def test_default_knobs_are_tensorflow_growth_and_jax_fraction_minus_headroom() -> None:
    env, _ = _env_after(
        policies_from(simple_policy(headroom="2%", fraction={"min": 0.05})), fraction="0.25"
    )
    assert env == [
        {"name": "TF_FORCE_GPU_ALLOW_GROWTH", "value": "true"},
        {"name": "XLA_PYTHON_CLIENT_MEM_FRACTION", "value": "0.23"},
        {"name": "XLA_CLIENT_MEM_FRACTION", "value": "0.23"},
    ]


def test_knobs_can_be_switched_off_and_jax_preallocate_set() -> None:
    policies = policies_from(
        simple_policy(
            frameworks={
                "tensorflow": {"allowGrowth": False},
                "jax": {"memoryFraction": False, "preallocate": False},
            }
        )
    )
    env, _ = _env_after(policies)
    assert env == [{"name": "XLA_PYTHON_CLIENT_PREALLOCATE", "value": "false"}]


def test_memory_headroom_is_converted_with_the_pool_memory() -> None:
    policies = policies_from(simple_policy(mode="mps", gpuMemory="40Gi", headroom="1Gi"))
    env, _ = _env_after(policies, fraction="0.25")
    # 0.25 - 1/40 = 0.225
    assert (
        env_values({"spec": {"containers": [{"env": env}]}})["XLA_PYTHON_CLIENT_MEM_FRACTION"]
        == "0.225"
    )


def test_pytorch_fraction_is_off_by_default() -> None:
    env, _ = _env_after(policies_from(simple_policy()))
    assert "PYTORCH_CUDA_ALLOC_CONF" not in {e["name"] for e in env}


def test_pytorch_fraction_is_added_when_the_user_set_no_allocator_config() -> None:
    env, warnings = _env_after(_torch_policies())
    assert {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "per_process_memory_fraction:0.48"} in env
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


def test_pytorch_config_from_value_from_is_left_alone_with_a_warning() -> None:
    user = [
        {
            "name": "PYTORCH_CUDA_ALLOC_CONF",
            "valueFrom": {"configMapKeyRef": {"name": "t", "key": "k"}},
        }
    ]
    env, warnings = _env_after(_torch_policies(), user)
    assert env[0] == user[0]
    assert [e["name"] for e in env].count("PYTORCH_CUDA_ALLOC_CONF") == 1
    assert warnings == (
        "PYTORCH_CUDA_ALLOC_CONF comes from valueFrom; per_process_memory_fraction not merged",
    )


@pytest.mark.parametrize(
    ("image", "gated"),
    [
        ("pytorch/pytorch:2.9.0-cuda12.8-cudnn9-runtime", True),
        ("pytorch/pytorch:2.10.0-cuda13.0-cudnn9-runtime", True),
        ("pytorch/pytorch:2.1.0-cuda11.8-cudnn8-runtime", False),
        ("nvcr.io/nvidia/pytorch:25.01-py3", True),
        ("nvcr.io/nvidia/pytorch:24.08-py3", False),
        ("jupyter/tensorflow-notebook:2023-10-20", False),
    ],
)
def test_pytorch_fraction_is_gated_by_image_globs(
    mps_example: PolicySet, image: str, gated: bool
) -> None:
    pod = make_pod({"gpu-fraction": "0.5"}, containers=[{"name": "t", "image": image}])
    outcome = mutate(pod, "ml-x", mps_example)
    assert outcome.decision is not None
    names = {e["name"] for e in env_of(mutated_pod(pod, outcome.decision))}
    assert ("PYTORCH_CUDA_ALLOC_CONF" in names) is gated
