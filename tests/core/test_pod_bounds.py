"""The counts the core works through per pod: every bound refuses one over and passes one at."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.core import pod_size_problem
from webhook.core.pod_bounds import (
    MAX_ARGUMENTS_PER_CONTAINER,
    MAX_CONTAINERS,
    MAX_ITEMS_PER_CONTAINER,
    MAX_METADATA_ENTRIES,
    MAX_POD_ITEMS,
)


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"annotations": {"gpu-fraction": "0.5"}}, "spec": spec}


def container(**fields: Any) -> dict[str, Any]:
    return {"name": "main", "image": "python:3.12", **fields}


def test_an_ordinary_pod_is_within_every_bound() -> None:
    assert pod_size_problem(pod(containers=[container(args=["-c", "x"])])) is None


@pytest.mark.parametrize("extra", [0, 1], ids=["at", "over"])
def test_args_and_command_count_together(extra: int) -> None:
    half = MAX_ARGUMENTS_PER_CONTAINER // 2
    main = container(command=["a"] * half, args=["b"] * (half + extra))
    problem = pod_size_problem(pod(containers=[main]))
    if not extra:
        assert problem is None
        return
    assert problem is not None
    assert problem.startswith(
        f"request.object.spec.containers[0] has {MAX_ARGUMENTS_PER_CONTAINER + 1} command and "
        f"args items; gpushare reads at most {MAX_ARGUMENTS_PER_CONTAINER} per container."
    )
    assert "ConfigMap" in problem


def test_eight_hundred_thousand_args_are_refused() -> None:
    problem = pod_size_problem(pod(containers=[container(args=["a"] * 800_000)]))
    assert problem is not None and "800000 command and args items" in problem


@pytest.mark.parametrize(("key", "limit"), list(MAX_ITEMS_PER_CONTAINER.items()))
def test_container_lists(key: str, limit: int) -> None:
    at = pod(initContainers=[container(**{key: [{}] * limit})])
    over = pod(initContainers=[container(**{key: [{}] * (limit + 1)})])
    assert pod_size_problem(at) is None
    assert pod_size_problem(over, "spec.template") == (
        f"spec.template.spec.initContainers[0].{key} has {limit + 1} items; gpushare reads at "
        f"most {limit}, which bounds the work and memory one review may take. Split the pod, "
        "or move the data into a ConfigMap."
    )


@pytest.mark.parametrize(("key", "limit"), list(MAX_POD_ITEMS.items()))
def test_pod_lists(key: str, limit: int) -> None:
    assert pod_size_problem(pod(**{key: [{}] * limit})) is None
    problem = pod_size_problem(pod(**{key: [{}] * (limit + 1)}))
    assert problem is not None and problem.startswith(f"request.object.spec.{key} has")


def test_containers_of_every_kind_count_together() -> None:
    third = MAX_CONTAINERS // 3 + 1
    many = pod(
        containers=[container()] * third,
        initContainers=[container()] * third,
        ephemeralContainers=[container()] * third,
    )
    problem = pod_size_problem(many)
    assert problem is not None and f"has {3 * third} containers" in problem


@pytest.mark.parametrize("key", ["labels", "annotations"])
def test_metadata_entries(key: str) -> None:
    entries = {f"k{index}": "v" for index in range(MAX_METADATA_ENTRIES + 1)}
    problem = pod_size_problem({"metadata": {key: entries}, "spec": {}})
    assert problem is not None and problem.startswith(f"request.object.metadata.{key} has")
