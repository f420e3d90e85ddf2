"""Property tests (hypothesis) over generated pods and annotations.

Generated pods are valid Kubernetes pods with random containers, init containers (native
sidecars included), env lists (valueFrom, names gpushare sets, duplicates), resources, node
selectors, labels, annotations and volumes present, absent or null; the annotations ask for
what the governing policy allows, so every generated pod is admitted.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import jsonpatch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.constants import (
    APPLIED_ANNOTATION,
    DRIVER_MEMORY_LIMIT_VAR,
    GPU_CONTAINER_NAMES,
    HELPER_CONTAINER_NAMES,
    MPS_MEMORY_LIMIT_VAR,
    MPS_PIPE_DIRECTORY_VAR,
    MPS_THREAD_PERCENTAGE_VAR,
)
from webhook.core.framework_images import DEFAULT_IMAGES, PYTORCH, TORCH_FRACTION, image_version
from webhook.core.planning import (
    Planned,
)
from webhook.core.policy.loader import load_policy_texts
from webhook.core.policy.model import Mode, Policy, PolicySet
from webhook.core.verdict import mutate, mutated_pod, validate

from .support import (
    MPS_DAEMON_EXAMPLE,
    MPS_EXAMPLE,
    POLICIES_DIR,
    assert_schema_valid,
    assert_valid_kubernetes_pod,
    policy_doc,
)

TEAM_POLICY = policy_doc(
    "team",
    match={"namespaces": ["team-*"]},
    mode="time-slicing",
    allocation="count",
    fraction={"min": 0.1, "max": 0.75},
    headroom="5%",
    pools=[{"name": "single-8", "replicas": 8, "gpusPerNode": 1}],
    tolerations=[{"key": "team", "operator": "Exists", "effect": "NoSchedule"}],
    frameworks={"jax": {"preallocate": False}, "pytorch": {"memoryFraction": True}},
    inject={
        "env": [{"name": "NCCL_P2P_DISABLE", "value": "1"}],
        "labels": {"gpushare.io/team": "yes"},
        "annotations": {"example.com/gpu-shared": "true"},
    },
)


def _load() -> PolicySet:
    files = [POLICIES_DIR / "default.yaml", MPS_EXAMPLE, MPS_DAEMON_EXAMPLE]
    texts = [(str(f), f.read_text(encoding="utf-8")) for f in files]
    texts.append(("team.yaml", yaml.safe_dump(TEAM_POLICY)))
    return load_policy_texts(texts)


POLICIES = _load()
NAMESPACES = {  # namespace → (policy, gpu-memory range in MiB when the policy declares memory)
    "research": ("default", None),
    "ml-train": ("ml-mps", (8192, 40960)),
    # fraction.min..max of what an L4 leaves to pods: 24Gi less 2Gi reservedMemory.
    "inference": ("inference-mps-daemon", (2458, 20275)),
    "team-a": ("team", None),
}

GPUSHARE_ENV = [
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    MPS_THREAD_PERCENTAGE_VAR,
    MPS_MEMORY_LIMIT_VAR,
    MPS_PIPE_DIRECTORY_VAR,
    DRIVER_MEMORY_LIMIT_VAR,
    "NCCL_P2P_DISABLE",
]
ENV_NAMES = [*GPUSHARE_ENV, "HOME", "MODEL_DIR", "OMP_NUM_THREADS"]
IMAGES = [
    "pytorch/pytorch:2.10.0-cuda12.8-cudnn9-runtime",
    "pytorch/pytorch:2.9.0-cuda12.8-cudnn9-runtime",
    "pytorch/pytorch:2.1.0-cuda11.8-cudnn8-runtime",
    "nvcr.io/nvidia/pytorch:25.01-py3",
    "jupyter/tensorflow-notebook:2023-10-20",
    "ghcr.io/nvidia/jax:jax-2024-10-01",
    "busybox:1.36",
]
# A known GPU container name, known helpers and plain names: without the annotation the GPU
# goes to main, else the first that is no helper, else the first (docs/annotations.md).
APP_NAMES = ["main", "model", "istio-proxy", "wait", "logs", "metrics"]
INIT_NAMES = ["init-a", "init-b", "sidecar"]
PROPERTY_SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

_env_value = st.one_of(
    st.sampled_from(
        [
            "expandable_segments:True",
            "per_process_memory_fraction:0.2,max_split_size_mb:64",
            "per_process_memory_fraction:0.9",
            "true",
            "100",
            "0=1G",
            "",
        ]
    ),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
)
_env_entry = st.builds(
    lambda name, kind, value: (
        {"name": name, "value": value}
        if kind == "value"
        else {"name": name, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
        if kind == "valueFrom"
        else {"name": name}
    ),
    st.sampled_from(ENV_NAMES),
    st.sampled_from(["value", "value", "valueFrom", "bare"]),
    _env_value,
)


def _fresh(values: list[Any]) -> st.SearchStrategy[Any]:
    """sampled_from, but each draw a fresh copy: decoded JSON never shares objects, and a
    value shared by two containers would make deepcopy + jsonpatch alias them."""
    return st.sampled_from(values).map(copy.deepcopy)


_resources = _fresh(
    [
        None,
        {},
        {"limits": None},
        {"requests": {"cpu": "500m"}},
        {"limits": {"memory": "1Gi"}, "requests": {"memory": "1Gi", "cpu": "1"}},
    ]
)


@st.composite
def _container_body(draw: st.DrawFn, mounts_possible: bool, init: bool) -> dict[str, Any]:
    container: dict[str, Any] = {"image": draw(_images)}
    env = draw(_env_lists)
    if env is not None or draw(st.booleans()):
        container["env"] = env
    resources = draw(_resources)
    if resources is not None:
        container["resources"] = resources
    if mounts_possible and draw(st.booleans()):
        container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    if draw(st.booleans()):
        container["envFrom"] = [{"configMapRef": {"name": "defaults"}}]
    if init and draw(st.booleans()):
        container["restartPolicy"] = "Always"
    return container


# Strategies are built once: building them inside a composite re-validates them per draw.
_images = st.sampled_from(IMAGES)
_env_lists = st.one_of(st.none(), st.just([]).map(list), st.lists(_env_entry, max_size=6))
_bodies = {
    (mounts, init): _container_body(mounts, init)
    for mounts in (False, True)
    for init in (False, True)
}
_namespaces = st.sampled_from(sorted(NAMESPACES))
_volumes = _fresh([None, "absent", [], [{"name": "data", "emptyDir": {}}]])
_app_names = st.lists(st.sampled_from(APP_NAMES), min_size=1, max_size=3, unique=True)
_init_names = st.one_of(st.none(), st.lists(st.sampled_from(INIT_NAMES), max_size=2, unique=True))
_selectors = _fresh(["absent", None, {}, {"kubernetes.io/arch": "amd64"}, {"zone": "a"}])
_tolerations = _fresh(
    [
        "absent",
        [],
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        [{"key": "team", "operator": "Exists", "effect": "NoSchedule"}],
        [{"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute"}],
    ]
)
_restart_policies = st.sampled_from(["Always", "Never", "OnFailure"])
_labels = _fresh(["absent", None, {}, {"app": "x"}])
_memory_mib = {ns: st.integers(*r) for ns, (_, r) in NAMESPACES.items() if r is not None}
_whole_gpus = st.integers(1, 4)
_fraction_thousandths = st.integers(100, 500)
_one_in_ten = st.integers(0, 9)


@dataclass
class Example:
    pod: dict[str, Any]
    namespace: str
    target: int


def _default_target(names: list[str]) -> int:
    """The GPU container without gpu-fraction-container-name, as docs/annotations.md says."""
    for index, name in enumerate(names):
        if name in GPU_CONTAINER_NAMES:
            return index
    return next((i for i, name in enumerate(names) if name not in HELPER_CONTAINER_NAMES), 0)


@st.composite
def examples(draw: st.DrawFn) -> Example:
    namespace = draw(_namespaces)
    volumes = draw(_volumes)
    mounts_possible = isinstance(volumes, list) and bool(volumes)
    names = draw(_app_names)
    containers = [{"name": n, **draw(_bodies[mounts_possible, False])} for n in names]
    spec: dict[str, Any] = {"containers": containers}
    if volumes != "absent":
        spec["volumes"] = volumes
    init = draw(_init_names)
    if init is not None:
        spec["initContainers"] = [{"name": n, **draw(_bodies[mounts_possible, True])} for n in init]
    selector = draw(_selectors)
    if selector != "absent":
        spec["nodeSelector"] = selector
    tolerations = draw(_tolerations)
    if tolerations != "absent":
        spec["tolerations"] = tolerations
    if draw(st.booleans()):
        spec["hostIPC"] = False
    if draw(st.booleans()):
        spec["restartPolicy"] = draw(_restart_policies)

    annotations: dict[str, str] = {}
    if namespace in _memory_mib and draw(st.booleans()):
        annotations["gpu-memory"] = f"{draw(_memory_mib[namespace])}Mi"
    elif draw(_one_in_ten) == 0:
        annotations["gpu-fraction"] = str(draw(_whole_gpus))
    else:
        annotations["gpu-fraction"] = f"0.{draw(_fraction_thousandths):03d}".rstrip("0")
    target = _default_target(names)
    if draw(st.booleans()):
        target = draw(st.integers(0, len(names) - 1))
        annotations["gpu-fraction-container-name"] = names[target]
    if draw(st.booleans()):
        annotations["example.com/owner"] = "someone"
    metadata: dict[str, Any] = {"name": "generated", "annotations": annotations}
    if draw(st.booleans()):
        metadata["namespace"] = namespace
    labels = draw(_labels)
    if labels != "absent":
        metadata["labels"] = labels
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    return Example(pod, namespace, target)


def _admitted(example: Example) -> tuple[Planned, list[dict[str, Any]], dict[str, Any]]:
    outcome = mutate(example.pod, example.namespace, POLICIES)
    assert outcome.allowed, outcome.reasons
    assert isinstance(outcome.decision, Planned)
    assert outcome.decision.policy.name == NAMESPACES[example.namespace][0]
    return outcome.decision, outcome.patch, mutated_pod(example.pod, outcome.decision)


@PROPERTY_SETTINGS
@given(examples())
def test_mutating_a_mutated_pod_yields_an_empty_patch(example: Example) -> None:
    decision, _, result = _admitted(example)
    again = mutate(result, example.namespace, POLICIES)
    assert again.allowed, again.reasons
    assert again.patch == []
    assert isinstance(again.decision, Planned)
    assert again.decision.record == decision.record
    assert validate(result, example.namespace, POLICIES).allowed


@PROPERTY_SETTINGS
@given(examples())
def test_the_input_pod_is_never_modified(example: Example) -> None:
    before = copy.deepcopy(example.pod)
    outcome = mutate(example.pod, example.namespace, POLICIES)
    assert outcome.decision is not None
    result = mutated_pod(example.pod, outcome.decision)
    jsonpatch.apply_patch(example.pod, outcome.patch)  # in_place defaults to False
    json.dumps(result)
    assert example.pod == before


@PROPERTY_SETTINGS
@given(examples())
def test_the_patch_applied_to_the_input_yields_the_planned_pod(example: Example) -> None:
    _, patch, result = _admitted(example)
    assert jsonpatch.apply_patch(copy.deepcopy(example.pod), patch) == result
    assert all(op["op"] in ("add", "replace") for op in patch)
    # Exact, not a whole-pod diff: every operation sits under a field gpushare owns.
    owned = (
        f"/spec/containers/{example.target}/",
        "/spec/nodeSelector",
        "/spec/tolerations",
        "/spec/volumes",
        "/spec/hostIPC",
        "/metadata/annotations",
        "/metadata/labels",
    )
    assert all(op["path"].startswith(owned) for op in patch), patch


@PROPERTY_SETTINGS
@given(examples())
def test_other_containers_init_containers_and_other_fields_stay_identical(
    example: Example,
) -> None:
    decision, _, result = _admitted(example)
    before, after = example.pod["spec"], result["spec"]
    assert decision.record["container"] == before["containers"][example.target]["name"]
    assert after.get("initContainers") == before.get("initContainers")
    for index, (old, new) in enumerate(zip(before["containers"], after["containers"], strict=True)):
        if index != example.target:
            assert new == old
        else:
            changed = {k for k in {*old, *new} if old.get(k) != new.get(k)}
            assert changed <= {"env", "resources", "volumeMounts"}
            for section in ("limits", "requests"):
                old_section = (old.get("resources") or {}).get(section) or {}
                new_section = new["resources"][section]
                assert {k: new_section[k] for k in old_section} == old_section
    owned = {"containers", "nodeSelector", "tolerations", "volumes", "hostIPC"}
    assert {k: v for k, v in after.items() if k not in owned} == {
        k: v for k, v in before.items() if k not in owned
    }
    for key, value in (before.get("nodeSelector") or {}).items():
        assert after["nodeSelector"][key] == value
    for field in ("tolerations", "volumes"):
        old_items = before.get(field) or []
        assert (after.get(field) or [])[: len(old_items)] == old_items
    old_meta, new_meta = example.pod["metadata"], result["metadata"]
    assert {k: v for k, v in new_meta.items() if k not in ("annotations", "labels")} == {
        k: v for k, v in old_meta.items() if k not in ("annotations", "labels")
    }
    for key, value in old_meta["annotations"].items():
        assert new_meta["annotations"][key] == value
    assert json.loads(new_meta["annotations"][APPLIED_ANNOTATION]) == decision.record


def _enforced_names(policy: Policy, whole: bool, asks_memory: bool, pool: str | None) -> set[str]:
    if whole:
        return set()
    # The driver limit: wherever the share's memory is known (enforcement auto, the default).
    memory = next((p.gpu_memory_mib for p in policy.pools if p.name == pool), None)
    names = {DRIVER_MEMORY_LIMIT_VAR} if asks_memory or memory is not None else set()
    if policy.mode is Mode.TIME_SLICING:
        return names
    names |= {MPS_THREAD_PERCENTAGE_VAR, MPS_MEMORY_LIMIT_VAR}
    if policy.mode is Mode.MPS_DAEMON:
        names.add(MPS_PIPE_DIRECTORY_VAR)
    return names


def _torch_gated(policy: Policy, image: str, whole: bool) -> bool:
    """Whether PyTorch's key goes in: a PyTorch image whose version parses it (2.10+)."""
    torch = policy.frameworks.pytorch
    globs = DEFAULT_IMAGES[PYTORCH] if torch.images is None else torch.images
    version = image_version(PYTORCH, image, torch.versions).version
    return (
        not whole
        and torch.memory_fraction
        and any(fnmatchcase(image, g) for g in globs)
        and version is not None
        and version >= TORCH_FRACTION.since
    )


def _keys(conf: str) -> set[str]:
    return {p.split(":")[0].strip() for p in conf.split(",") if p.strip()}


@PROPERTY_SETTINGS
@given(examples())
def test_user_env_is_kept_except_enforced_limits_and_nothing_is_duplicated(
    example: Example,
) -> None:
    decision, _, result = _admitted(example)
    whole = decision.record["mode"] == "whole-gpu"
    old_container = example.pod["spec"]["containers"][example.target]
    new_env = result["spec"]["containers"][example.target].get("env") or []
    old_env = old_container.get("env") or []
    asks_memory = "gpu-memory" in example.pod["metadata"]["annotations"]
    enforced = _enforced_names(decision.policy, whole, asks_memory, decision.record.get("pool"))
    torch = _torch_gated(decision.policy, old_container["image"], whole)
    assert len(new_env) >= len(old_env)
    # With duplicate names the kubelet uses the last entry: that is the user's value.
    effective = {e["name"]: e for e in old_env}
    torch_vars = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    for old, new in zip(old_env, new_env, strict=False):
        name = old["name"]
        assert new["name"] == name
        if name in enforced:
            assert set(new) == {"name", "value"}
        elif torch and name in torch_vars and new != old:
            user = effective[name]
            assert "valueFrom" not in user, "a valueFrom config must be left alone"
            merged = new["value"]
            assert "per_process_memory_fraction" in _keys(merged)
            assert _keys(user.get("value", "")) <= _keys(merged)
        else:
            assert new == old
    for name in enforced:
        values = {e.get("value") for e in new_env if e["name"] == name}
        assert len(values) == 1, (name, values)
    added = [e["name"] for e in new_env[len(old_env) :]]
    assert len(added) == len(set(added)), added
    # jaxlib 0.4.33+ refuses the two fraction names together: never the second one.
    both = {"XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"}
    assert not both <= {e["name"] for e in new_env} or both <= {e["name"] for e in old_env}
    if torch and not any("valueFrom" in e for e in old_env if e["name"] in torch_vars):
        assert any("per_process_memory_fraction" in str(e.get("value")) for e in new_env)
    assert not set(added) & {e["name"] for e in old_env}
    if whole:
        assert not set(added) & set(GPUSHARE_ENV) - {"NCCL_P2P_DISABLE"}
    if MPS_THREAD_PERCENTAGE_VAR in enforced:
        fraction = float(decision.record["fraction"])
        expected = max(1, min(100, math.floor(fraction * 100 + 1e-9)))
        assert {e["value"] for e in new_env if e["name"] == MPS_THREAD_PERCENTAGE_VAR} == {
            str(expected)
        }


@PROPERTY_SETTINGS
@given(examples())
def test_mutated_pods_validate_against_the_kubernetes_schema(example: Example) -> None:
    assert_schema_valid(example.pod)
    _, _, result = _admitted(example)
    assert_valid_kubernetes_pod(result)


_garbage = st.one_of(
    st.text(max_size=20),
    # Near misses of what is accepted: signs, commas, exponents, units, whitespace.
    st.from_regex(r"\A[-+ ]?[0-9]{0,3}[.,]?[0-9]{0,4}(e-?[0-9])?(%|Gi|Mi|G| |\n)?\Z"),
)
_PLAIN_DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?|\.[0-9]+")


@PROPERTY_SETTINGS
@given(
    _garbage, st.sampled_from(sorted(NAMESPACES)), st.sampled_from(["gpu-fraction", "gpu-memory"])
)
def test_garbage_annotations_never_crash_and_denials_name_the_value(
    text: str, namespace: str, annotation: str
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "g", "annotations": {annotation: text}},
        "spec": {"containers": [{"name": "app", "image": "x"}]},
    }
    outcome = mutate(pod, namespace, POLICIES)
    if outcome.allowed:
        assert isinstance(outcome.decision, Planned)
        if annotation == "gpu-fraction":
            assert _PLAIN_DECIMAL.fullmatch(text), f"accepted {text!r}"
        return
    assert outcome.reasons
    assert outcome.code in (403, 422)
    assert any(f'"{text}"' in reason for reason in outcome.reasons), outcome.reasons


@PROPERTY_SETTINGS
@given(_garbage)
def test_garbage_container_names_never_crash_and_denials_name_the_container(text: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "g",
            "annotations": {"gpu-fraction": "0.5", "gpu-fraction-container-name": text},
        },
        "spec": {"containers": [{"name": "app", "image": "x"}]},
    }
    outcome = mutate(pod, "research", POLICIES)
    if text == "app":
        assert outcome.allowed
    else:
        assert not outcome.allowed
        [reason] = outcome.reasons
        assert f'"{text}"' in reason or not text.strip()
