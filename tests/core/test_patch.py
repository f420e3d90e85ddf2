"""JSON Patch from edit trees: pointer escaping, missing parents, add vs replace, exactness."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from webhook.core.edits import PodEdits
from webhook.core.patch import build_patch, escape_pointer_token
from webhook.core.render import render
from webhook.core.verdict import mutate, mutated_pod

from .support import make_pod


def _check(original: dict[str, Any], edits: PodEdits) -> list[dict[str, Any]]:
    """The patch, after checking it applies to the original and yields the rendered pod."""
    before = copy.deepcopy(original)
    patch = build_patch(original, edits)
    rendered = render(original, edits)
    assert original == before, "building or rendering changed the original"
    assert jsonpatch.apply_patch(copy.deepcopy(original), patch) == rendered
    return patch


@pytest.mark.parametrize(
    ("token", "escaped"),
    [
        ("nvidia.com/gpu.shared", "nvidia.com~1gpu.shared"),
        ("gpushare.io/applied", "gpushare.io~1applied"),
        ("a~b", "a~0b"),
        ("~1", "~01"),  # "~" first, or "~1" would come back as "/"
        ("a/~b", "a~1~0b"),
        (3, "3"),
        ("plain", "plain"),
    ],
)
def test_pointer_tokens_are_escaped_per_rfc_6901(token: str | int, escaped: str) -> None:
    assert escape_pointer_token(token) == escaped


def test_resource_names_with_slashes_are_escaped_in_the_patch() -> None:
    pod = make_pod(containers=[{"name": "a", "image": "x", "resources": {"limits": {"cpu": "1"}}}])
    edits = PodEdits()
    edits.set(("spec", "containers", 0, "resources", "limits", "nvidia.com/gpu.shared"), "1")
    assert _check(pod, edits) == [
        {
            "op": "add",
            "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu.shared",
            "value": "1",
        }
    ]


def test_missing_parents_are_added_whole_in_one_operation() -> None:
    pod = make_pod(containers=[{"name": "a", "image": "x"}])
    edits = PodEdits()
    for section in ("limits", "requests"):
        edits.set(("spec", "containers", 0, "resources", section, "nvidia.com/gpu.shared"), "1")
    edits.append(("spec", "containers", 0, "env"), {"name": "A", "value": "1"})
    edits.set(("metadata", "labels", "x/y"), "z")
    assert _check(pod, edits) == [
        {
            "op": "add",
            "path": "/spec/containers/0/resources",
            "value": {
                "limits": {"nvidia.com/gpu.shared": "1"},
                "requests": {"nvidia.com/gpu.shared": "1"},
            },
        },
        {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "A", "value": "1"}]},
        {"op": "add", "path": "/metadata/labels", "value": {"x/y": "z"}},
    ]


@pytest.mark.parametrize("field", ["nodeSelector", "tolerations"])
def test_null_parents_are_replaced_whole(field: str) -> None:
    pod = make_pod(**{field: None})
    edits = PodEdits()
    if field == "nodeSelector":
        edits.set(("spec", "nodeSelector", "k"), "v")
        value: Any = {"k": "v"}
    else:
        edits.append(("spec", "tolerations"), {"operator": "Exists"})
        value = [{"operator": "Exists"}]
    assert _check(pod, edits) == [{"op": "add", "path": f"/spec/{field}", "value": value}]


def test_existing_object_member_is_set_with_add_and_equal_values_emit_nothing() -> None:
    pod = make_pod(nodeSelector={"a": "1", "b": "2"})
    edits = PodEdits()
    edits.set(("spec", "nodeSelector", "a"), "1")  # already so
    edits.set(("spec", "nodeSelector", "b"), "3")  # differs: add replaces (RFC 6902 4.1)
    edits.set(("spec", "nodeSelector", "c"), "4")  # new
    assert _check(pod, edits) == [
        {"op": "add", "path": "/spec/nodeSelector/b", "value": "3"},
        {"op": "add", "path": "/spec/nodeSelector/c", "value": "4"},
    ]


def test_list_items_are_replaced_at_their_index_then_appends_use_dash() -> None:
    env = [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}, {"name": "C", "value": "3"}]
    pod = make_pod(containers=[{"name": "a", "image": "x", "env": env}])
    edits = PodEdits()
    path = ("spec", "containers", 0, "env")
    edits.append(path, {"name": "D", "value": "4"})
    edits.replace_item(path, 2, {"name": "C", "value": "30"})
    edits.replace_item(path, 0, {"name": "A", "value": "1"})  # unchanged: no operation
    edits.append(path, {"name": "E", "value": "5"})
    assert _check(pod, edits) == [
        {
            "op": "replace",
            "path": "/spec/containers/0/env/2",
            "value": {"name": "C", "value": "30"},
        },
        {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "D", "value": "4"}},
        {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "E", "value": "5"}},
    ]


def test_edits_reach_the_right_container_by_index() -> None:
    containers = [{"name": "a", "image": "x"}, {"name": "b", "image": "y", "env": []}]
    pod = make_pod(containers=containers)
    edits = PodEdits()
    edits.append(("spec", "containers", 1, "env"), {"name": "A", "value": "1"})
    assert _check(pod, edits) == [
        {"op": "add", "path": "/spec/containers/1/env/-", "value": {"name": "A", "value": "1"}}
    ]


def test_no_edits_no_patch_and_render_returns_the_original() -> None:
    pod = make_pod()
    assert build_patch(pod, PodEdits()) == []
    assert render(pod, PodEdits()) is pod


def test_conflicting_edits_are_a_programming_error() -> None:
    edits = PodEdits()
    edits.set(("spec", "hostIPC"), True)
    with pytest.raises(ValueError, match="conflicting edits"):
        edits.set(("spec", "hostIPC", "x"), 1)
    with pytest.raises(ValueError, match="conflicting edits"):
        edits.append(("spec", "hostIPC"), 1)


def test_render_copies_only_touched_parts_and_never_changes_the_original() -> None:
    pod = make_pod(
        containers=[{"name": "a", "image": "x"}, {"name": "b", "image": "y"}],
        volumes=[{"name": "v", "emptyDir": {}}],
    )
    before = copy.deepcopy(pod)
    edits = PodEdits()
    edits.set(("spec", "containers", 0, "resources", "limits", "r/x"), "1")
    result = render(pod, edits)
    assert pod == before
    assert result["spec"]["containers"][0]["resources"] == {"limits": {"r/x": "1"}}
    assert result["spec"]["containers"][1] is pod["spec"]["containers"][1]
    assert result["spec"]["volumes"] is pod["spec"]["volumes"]
    assert result["spec"] is not pod["spec"]


def test_a_real_mutation_patch_is_small_and_every_path_is_escaped(bundled: Any) -> None:
    pod = make_pod(
        {"gpu-fraction": "0.5"},
        containers=[
            {
                "name": "app",
                "image": "tensorflow/tensorflow:2.17.0-gpu",  # gets TensorFlow's env
                "resources": {"limits": {"cpu": "1"}, "requests": {}},
            },
            {"name": "sidecar", "image": "y"},
        ],
        namespace="research",
    )
    outcome = mutate(pod, "research", bundled)
    assert outcome.allowed
    ops = {(op["op"], op["path"]) for op in outcome.patch}
    assert ops == {
        ("add", "/spec/containers/0/resources/limits/nvidia.com~1gpu.shared"),
        ("add", "/spec/containers/0/resources/requests/nvidia.com~1gpu.shared"),
        ("add", "/spec/containers/0/env"),
        ("add", "/spec/nodeSelector"),
        ("add", "/spec/tolerations"),
        ("add", "/metadata/annotations/gpushare.io~1applied"),
    }
    assert outcome.decision is not None
    assert jsonpatch.apply_patch(copy.deepcopy(pod), outcome.patch) == mutated_pod(
        pod, outcome.decision
    )


def test_patch_never_removes_and_replaces_only_existing_list_items(mps_example: Any) -> None:
    env = [
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"},
        {
            "name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}},
        },
    ]
    pod = make_pod({"gpu-fraction": "0.25"}, containers=[{"name": "t", "image": "x", "env": env}])
    outcome = mutate(pod, "ml-serving", mps_example)
    assert outcome.allowed
    assert {op["op"] for op in outcome.patch} <= {"add", "replace"}
    replaced = [op for op in outcome.patch if op["op"] == "replace"]
    assert [op["path"] for op in replaced] == [
        "/spec/containers/0/env/0",
        "/spec/containers/0/env/1",
    ]
    assert replaced[1]["value"] == {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=20480M"}
    patched = jsonpatch.apply_patch(copy.deepcopy(pod), outcome.patch)
    assert patched["spec"]["containers"][0]["env"][:2] == [
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "25"},
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=20480M"},
    ]
