"""`gpushare compile` held equal to the webhook through the real kube-apiserver (issue 11).

The same pods are created (server-side dry runs: the stored object comes back, nothing is
kept) three times in one control plane: with no admission at all, with gpushare's webhook
registered as `gpushare webhook-config` prints it, and with what `gpushare compile` prints
for the same policies. Each pod must come out the same stored pod, or the same denial.

Pods: every corpus pod (tests/corpus/*/pod.yaml in its namespace) and every pod or pod
template of the workload corpus (tests/workload_corpus, created as pods), under the e2e
policy set (conftest.webhook_policies) with the two settings the compiler refuses turned off
in the ml-mps example (frameworks.pytorch.memoryFraction, inferenceServers.memory: set); and
hypothesis-generated policy sets and pods (tests/oracle/strategies), a few by default, more
with GPUSHARE_LONG_TESTS=1.

Normalised before comparing, and only this:
- metadata.uid, metadata.creationTimestamp and the time of each metadata.managedFields
  entry: every create gets its own;
- a denial's prefix: the apiserver says `admission webhook "mutate.gpushare.io" denied the
  request: ` for the webhook and `ValidatingAdmissionPolicy 'gpushare-x' with binding
  'gpushare-x' denied request: ` for a policy; the reasons after it and the HTTP status must
  be equal;
- a pod Kubernetes itself refuses (invalid even with no admission): the webhook refuses it
  at mutation, the compiled policies never get to validate it (object validation runs
  between mutating and validating admission), so both must refuse it, in their own words.
"""

from __future__ import annotations

import copy
import difflib
import json
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from harness.api import create_pod, ensure_namespace, status_message
from harness.controlplane import ControlPlane
from harness.processes import wait_for
from harness.registration import GpushareWebhook, probe_pod, unregistered
from harness.webhookserver import WebhookServer
from tests.core.support import pod_template
from tests.long_runs import scaled
from tests.oracle.oracle import read_policies
from tests.oracle.strategies import pods, policy_texts
from webhook.compile import REINVOCATION_POLICIES, CompileRefusedError, compile_policies, notes
from webhook.constants import APPLIED_ANNOTATION
from webhook.core import (
    api_group,
    load_policies,
    load_policy_texts,
    workload_kind,
)

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests/corpus"
WORKLOAD_CORPUS = REPO / "tests/workload_corpus"
DENIAL_MARKERS = ("denied the request: ", "denied request: ")
# How long a policy the namespace probe cannot see (it matches pod labels) may take to come
# into force after the probe saw the others: the apiserver compiles them about once a second.
LATE_POLICY_S = 20.0
GENERATED_SETS = scaled(2, 12)
# Registration waits on dry runs in the probe namespace, which generated policies do not
# match: this policy governs only there (no generated pod goes there).
PROBE_POLICY = """\
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: zz-probe}
spec:
  match: {namespaces: [e2e-probe]}
  priority: 1000
  mode: time-slicing
  pools: [{name: probe, replicas: 2}]
"""
PODS_PER_SET = scaled(8, 25)


class Outcome(NamedTuple):
    """What the apiserver did with one pod: the stored pod (normalised) or the refusal."""

    admitted: bool
    pod: dict[str, Any] | None
    status: int
    message: str


class Case(NamedTuple):
    name: str
    namespace: str
    pod: dict[str, Any]


def _by_hand(name: str, field: str, section: str, resource: str) -> dict[str, Any]:
    """A pod without gpushare's annotations asking for ``resource`` itself."""
    container = {
        "name": "main",
        "image": "busybox",
        "resources": {section: {resource: "1"}},
    }
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "busybox"}]}
    if field == "containers":
        spec["containers"] = [spec["containers"][0], container]
    else:
        spec[field] = [container]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


# Asking for the shared resource by hand, where the policy denies it (and where it does not
# apply): the compiled mutating policy refuses these, not a validating policy of their own.
BY_HAND = [
    Case(
        "by-hand/limits", "default", _by_hand("a", "containers", "limits", "nvidia.com/gpu.shared")
    ),
    Case(
        "by-hand/init-requests",
        "default",
        _by_hand("b", "initContainers", "requests", "nvidia.com/gpu.shared"),
    ),
    Case("by-hand/whole-gpu", "default", _by_hand("c", "containers", "limits", "nvidia.com/gpu")),
    Case(
        "by-hand/kube-system",
        "kube-system",
        _by_hand("d", "containers", "limits", "nvidia.com/gpu.shared"),
    ),
]


def _choice(name: str, containers: list[tuple[str, str]], fraction: str = "0.5") -> Case:
    """A pod of several containers without gpu-fraction-container-name: which gets the GPU
    (docs/annotations.md); "0.5" takes the compiled usual branch where container 0 is the
    chosen one, "0.123" (no common share) the general path."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "choice", "annotations": {"gpu-fraction": fraction}},
        "spec": {"containers": [{"name": n, "image": image} for n, image in containers]},
    }
    return Case(f"choice/{name}", "default", pod)


_TF = "tensorflow/tensorflow:2.17.0"
# The container that gets the GPU: case name -> container.
CONTAINER_CHOICE = {
    "choice/argo": "main",
    "choice/argo-general": "main",
    "choice/main-first": "main",
    "choice/istio-first": "app",
    "choice/sidecar-pytorch": "pytorch",
    "choice/two-plain": "app",
    "choice/all-helpers": "istio-proxy",
}
CHOICE = [
    _choice("argo", [("wait", "busybox"), ("main", _TF)]),
    _choice("argo-general", [("wait", "busybox"), ("main", _TF)], "0.123"),
    _choice("main-first", [("main", _TF), ("wait", "busybox")], "0.25"),
    _choice("istio-first", [("istio-proxy", "busybox"), ("app", _TF)]),
    _choice("sidecar-pytorch", [("sidecar", "busybox"), ("pytorch", "busybox")]),
    _choice("two-plain", [("app", _TF), ("worker", "busybox")]),
    _choice("all-helpers", [("istio-proxy", "busybox"), ("fluent-bit", "busybox")]),
]


# Enforcement (issue 27): the driver limit in MiB, placement on enforcing nodes and the
# reservation of a GPU model under MPS, hand-set limits refused; under auto, none for a
# fraction on a pool of unknown memory, the ask itself for a memory ask sized by the nodes,
# hand-set limits replaced; device variables.
ENFORCEMENT_POLICIES = """\
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: enforced}
spec:
  match: {namespaces: ["enforced-*"]}
  mode: mps
  gpuMemory: 16Gi
  fraction: {min: 0.1, max: 0.5}
  pools:
    - {name: t4, replicas: 4, nodeSelector: {nvidia.com/gpu.product: Tesla-T4}}
    - {name: half, replicas: 2}
  enforcement:
    driverMemoryLimit: require
    reservedMemory: {default: 256Mi, products: {Tesla-T4: 450Mi}}
    handSetLimits: deny
---
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {name: mixed}
spec:
  match: {namespaces: ["mixed-*"]}
  mode: time-slicing
  fraction: {min: 0.05, max: 0.5}
  pools:
    - {name: sized, replicas: 4, gpuMemory: 24Gi}
    - {name: unsized, replicas: 2}
  enforcement: {driverMemoryLimit: auto, handSetLimits: override}
"""


def _pod(
    name: str,
    annotations: dict[str, str] | None = None,
    env: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if env is not None:
        container["env"] = env
    metadata: dict[str, Any] = {"name": name}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [container], **spec},
    }


def _env(name: str, value: str) -> dict[str, str]:
    return {"name": name, "value": value}


_LIMIT, _REQUEST = "NVIDIA_GPU_MEMORY_LIMIT", "NVIDIA_GPU_MEMORY_REQUEST"
_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
_FROM = {"valueFrom": {"configMapKeyRef": {"name": "limits", "key": "mib"}}}
ENFORCEMENT = (
    [
        Case(f"enforced/{name}", "enforced-a", _pod(name, annotations, env, **spec))
        for name, annotations, env, spec in [
            ("quarter-t4", {"gpu-fraction": "0.25"}, None, {}),
            ("general-half", {"gpu-fraction": "0.4"}, None, {}),
            ("odd-share", {"gpu-fraction": "0.123"}, None, {}),
            ("memory-ask", {"gpu-memory": "3Gi"}, None, {}),
            ("memory-whole-slot", {"gpu-memory": "3983Mi"}, None, {}),
            ("memory-over-reserved", {"gpu-memory": "4000Mi"}, None, {}),
            ("memory-over-slot", {"gpu-memory": "3983.4Mi"}, None, {}),
            (
                "limit-as-planned",
                {"gpu-fraction": "0.25"},
                [_env(_REQUEST, "3983"), _env(_LIMIT, "3983")],
                {},
            ),
            ("limit-raised", {"gpu-fraction": "0.25"}, [_env(_LIMIT, "99999")], {}),
            ("limit-from", {"gpu-fraction": "0.25"}, [{"name": _LIMIT, **_FROM}], {}),
            (
                "limit-quoted",
                {"gpu-fraction": "0.123"},
                [_env(_REQUEST, 'it\'s a \\ "test"\n')],
                {},
            ),
            (
                "threads-raised",
                {"gpu-fraction": "0.25"},
                [_env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "90")],
                {},
            ),
            ("whole-with-limit", {"gpu-fraction": "1"}, [_env(_LIMIT, "16384")], {}),
            (
                "not-enforcing-node",
                {"gpu-fraction": "0.25"},
                None,
                {"nodeSelector": {"gpushare.io/driver-memory-limit": "false"}},
            ),
            (
                "devices-before-all",
                {"gpu-fraction": "x"},
                [_env(_VISIBLE, "all"), _env(_LIMIT, "1")],
                {},
            ),
        ]
    ]
    + [
        Case(f"mixed/{name}", "mixed-a", _pod(name, annotations, env))
        for name, annotations, env in [
            ("sized-quarter", {"gpu-fraction": "0.25"}, [_env(_LIMIT, "1")]),
            ("unsized-half", {"gpu-fraction": "0.5"}, None),
            ("memory-by-nodes", {"gpu-memory": "8Gi"}, None),
            ("memory-sized", {"gpu-memory": "5Gi"}, [{"name": _REQUEST, **_FROM}]),
        ]
    ]
    + [
        Case("devices/plain-all", "default", _pod("d1", env=[_env(_VISIBLE, "all")])),
        Case("devices/plain-void", "default", _pod("d2", env=[_env(_VISIBLE, "void")])),
        Case("devices/plain-empty", "default", _pod("d3", env=[{"name": _VISIBLE}])),
        Case(
            "devices/cuda-init",
            "default",
            _pod(
                "d4",
                initContainers=[
                    {"name": "init", "image": "busybox", "env": [_env("CUDA_VISIBLE_DEVICES", "0")]}
                ],
            ),
        ),
        Case(
            "devices/privileged",
            "default",
            {
                **_pod("d8"),
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "env": [_env(_VISIBLE, "all")],
                            "securityContext": {"privileged": True},
                        }
                    ]
                },
            },
        ),
        Case(
            "devices/kai",
            "default",
            _pod("d5", env=[_env(_VISIBLE, "all")], schedulerName="kai-scheduler"),
        ),
        Case(
            "devices/annotated",
            "ml-devices",
            _pod(
                "d6",
                {"gpu-fraction": "0.25"},
                [_env(_VISIBLE, "GPU-1"), _env("CUDA_VISIBLE_DEVICES", "1")],
            ),
        ),
        Case(
            "devices/and-by-hand",
            "default",
            {
                **_by_hand("d7", "containers", "limits", "nvidia.com/gpu.shared"),
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "resources": {"limits": {"nvidia.com/gpu.shared": "1"}},
                            "env": [{"name": _VISIBLE, **_FROM}],
                        }
                    ]
                },
            },
        ),
    ]
)
# What the enforcement cases must come to under the webhook (so that the comparison means
# something): admitted (with the driver limit where given) or refused, with these words.
ENFORCEMENT_EXPECTED = {
    "enforced/quarter-t4": "3983",
    "enforced/general-half": "6451",
    "enforced/memory-ask": "3072",
    "enforced/memory-whole-slot": "3983",
    # A memory ask is its share of what a GPU leaves to pods: too much for a T4 slot once
    # the T4's reservation is kept, it takes a slot of the other pool.
    "enforced/memory-over-reserved": "4000",
    "enforced/memory-over-slot": "ask for at most 3983Mi",
    "enforced/limit-as-planned": "3983",
    "enforced/limit-raised": "enforcement.handSetLimits: deny",
    "enforced/limit-from": "set by hand from valueFrom",
    "enforced/whole-with-limit": "gpushare sets no NVIDIA_GPU_MEMORY_LIMIT for this pod",
    "enforced/devices-before-all": "NVIDIA_VISIBLE_DEVICES is set by hand in container 'main'",
    "mixed/sized-quarter": "6144",
    "mixed/unsized-half": "",
    "mixed/memory-by-nodes": "8192",
    "devices/plain-all": "enforcement.deviceVariables: deny",
    "devices/plain-void": "",
    "devices/cuda-init": "CUDA_VISIBLE_DEVICES is set by hand in init container 'init'",
    "devices/kai": "",
}


DIGEST = "@sha256:" + "ab" * 32
# Image references the framework knobs read: Docker Hub's implicit names, digests, a registry
# port, TensorFlow tags below and above the growth knob's first release (1.12.0), JAX images.
IMAGES = (
    "docker.io/library/tensorflow/tensorflow:1.11.0-gpu",
    "docker.io/tensorflow/tensorflow:1.11.0",
    "index.docker.io/tensorflow/tensorflow:2.17.0",
    "tensorflow/tensorflow:1.12.0-gpu",
    "tensorflow/tensorflow" + DIGEST,
    "tensorflow/tensorflow:1.11.0" + DIGEST,
    "localhost:5000/tensorflow/tensorflow:1.11.0",
    "nvcr.io/nvidia/tensorflow:24.01-tf2-py3",
    "nvcr.io/nvidia/jax:24.04-py3",
    "ghcr.io/nvidia/jax" + DIGEST,
    "registry-1.docker.io/library/busybox",
)


def _image_case(index: int, image: str) -> Case:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"image-{index}", "annotations": {"gpu-fraction": "0.5"}},
        "spec": {"containers": [{"name": "main", "image": image}]},
    }
    return Case(f"image/{image}", "default", pod)


def _corpus_cases() -> list[Case]:
    cases = list(BY_HAND) + list(CHOICE) + [_image_case(i, image) for i, image in enumerate(IMAGES)]
    cases += ENFORCEMENT
    for folder in sorted(p for p in CORPUS.iterdir() if (p / "pod.yaml").exists()):
        pod = yaml.safe_load((folder / "pod.yaml").read_text(encoding="utf-8"))
        namespace_file = folder / "namespace"
        namespace = (
            namespace_file.read_text(encoding="utf-8").strip()
            if namespace_file.exists()
            else pod.get("metadata", {}).get("namespace") or "default"
        )
        cases.append(Case(f"corpus/{folder.name}", namespace, pod))
    for folder in sorted(p for p in WORKLOAD_CORPUS.iterdir() if p.is_dir()):
        text = (folder / "manifest.yaml").read_text(encoding="utf-8")
        for index, document in enumerate(d for d in yaml.safe_load_all(text) if d):
            kind = workload_kind(api_group(document.get("apiVersion")), document.get("kind"))
            if document.get("kind") == "Pod":
                pod = document
            elif kind is not None and isinstance(pod_template(document, kind), dict):
                template = pod_template(document, kind)
                pod = {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(template)}
            else:
                continue
            namespace = document.get("metadata", {}).get("namespace") or "default"
            cases.append(Case(f"workloads/{folder.name}/{index}", namespace, pod))
    return cases


def _named(case: Case, index: int) -> dict[str, Any]:
    pod = copy.deepcopy(case.pod)
    metadata = pod.setdefault("metadata", {})
    metadata["name"] = f"cmp-{index}"
    metadata.pop("generateName", None)
    metadata["namespace"] = case.namespace
    return pod


def _normalised(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    for key in ("uid", "creationTimestamp"):
        pod["metadata"].pop(key, None)
    for entry in pod["metadata"].get("managedFields", []):
        entry.pop("time", None)
    return pod


def outcomes(
    api: k8s.ApiClient, cases: list[Case], indexes: list[int] | None = None
) -> list[Outcome]:
    """Each case created (dry run) as pod ``cmp-<index>``; ``indexes`` keep a rerun's names."""
    core = k8s.CoreV1Api(api)
    results = []
    for index, case in zip(indexes or range(len(cases)), cases, strict=True):
        ensure_namespace(core, case.namespace)
        try:
            stored = create_pod(api, case.namespace, _named(case, index), dry_run=True).pod
        except ApiException as exc:
            message = status_message(exc)
            for marker in DENIAL_MARKERS:
                message = message.split(marker, 1)[-1]
            results.append(Outcome(False, None, exc.status, message))
        else:
            results.append(Outcome(True, _normalised(stored), 201, ""))
    return results


def compiled_documents(
    policies: Path, reinvocation: str = REINVOCATION_POLICIES[0]
) -> list[dict[str, Any]]:
    return compile_policies(load_policies(policies), reinvocation)


def _acted(api: k8s.ApiClient, namespace: str) -> bool:
    """gpushare (webhook or compiled) acts on an annotated pod in ``namespace`` now."""
    pod = probe_pod(f"probe-{uuid.uuid4().hex[:8]}", annotated=True)
    try:
        stored = create_pod(api, namespace, pod, dry_run=True).pod
    except ApiException as exc:
        return "gpushare" in status_message(exc)
    return APPLIED_ANNOTATION in (stored["metadata"].get("annotations") or {})


def wait_in_force(api: k8s.ApiClient, namespaces: set[str], what: str) -> None:
    """Until gpushare acts in every namespace of ``namespaces``: the apiserver compiles new
    admission policies about once a second, each in its own time."""
    for namespace in sorted(namespaces):
        wait_for(
            f"{what} in namespace {namespace}",
            lambda namespace=namespace: _acted(api, namespace) or None,
            timeout=60,
            interval=0.2,
        )


def _gpushare_acted(outcome: Outcome) -> bool:
    """Refused, or stored with gpushare's record: something of gpushare was in force."""
    annotations = ((outcome.pod or {}).get("metadata") or {}).get("annotations") or {}
    return not outcome.admitted or APPLIED_ANNOTATION in annotations


def under_compiled(
    plane: ControlPlane,
    webhook: GpushareWebhook,
    documents: list[dict[str, Any]],
    cases: list[Case],
    governed: set[str],
    by_webhook: list[Outcome],
) -> list[Outcome]:
    """The outcomes with the compiled policies in force in every ``governed`` namespace.

    The namespace probe carries no pod labels, so a policy matching on labels may come into
    force later than the probe shows: a case the webhook acted on and the compiled policies
    did not is asked again until ``LATE_POLICY_S``; a difference that stays is reported.
    """
    text = yaml.safe_dump_all(documents)
    plane.kubectl("apply", "-f", "-", input=text)
    try:
        wait_in_force(plane.api, governed, "the compiled policies")
        found = outcomes(plane.api, cases)
        deadline = time.monotonic() + LATE_POLICY_S
        while time.monotonic() < deadline:
            late = [
                i
                for i, (mine, theirs) in enumerate(zip(found, by_webhook, strict=True))
                if _gpushare_acted(theirs) and not _gpushare_acted(mine)
            ]
            if not late:
                break
            time.sleep(0.5)
            again = outcomes(plane.api, [cases[i] for i in late], indexes=late)
            for i, outcome in zip(late, again, strict=True):
                found[i] = outcome
        return found
    finally:
        plane.kubectl("delete", "--ignore-not-found", "-f", "-", input=text)
        webhook.wait(unregistered, "the compiled policies to be gone")


def under_webhook(webhook: GpushareWebhook, cases: list[Case]) -> tuple[list[Outcome], set[str]]:
    """The outcomes, and the namespaces where the webhook acted on an annotated probe."""
    webhook.register()
    try:
        found = outcomes(webhook.api, cases)
        governed = {c.namespace for c in cases if _acted(webhook.api, c.namespace)}
        return found, governed
    finally:
        webhook.unregister()


# Pods the webhook refuses and compiled policies admit, each for a difference `gpushare
# compile` prints (webhook/compile/refusals.py notes) and docs/deploying.md lists.
DOCUMENTED_DIFFERENCES = {
    "corpus/deny-vllm-tensor-parallel-on-a-share": "parallelism (vLLM, SGLang, TGI)",
}


def assert_same(
    cases: list[Case], bare: list[Outcome], served: list[Outcome], compiled: list[Outcome]
) -> None:
    differences = []
    for case, alone, by_webhook, by_policies in zip(cases, bare, served, compiled, strict=True):
        if not alone.admitted:  # Kubernetes refuses it: both must, in their own words
            if by_webhook.admitted or by_policies.admitted:
                differences.append(f"{case.name}: an invalid pod was admitted")
            continue
        if case.name in DOCUMENTED_DIFFERENCES:
            if by_webhook.admitted or not by_policies.admitted:
                differences.append(f"{case.name}: not the documented difference")
            continue
        if by_webhook != by_policies:
            diff = difflib.unified_diff(
                json.dumps(by_webhook._asdict(), indent=1, sort_keys=True).splitlines(),
                json.dumps(by_policies._asdict(), indent=1, sort_keys=True).splitlines(),
                "webhook",
                "compiled",
                lineterm="",
            )
            differences.append(f"{case.name}:\n" + "\n".join(diff))
    assert not differences, "\n".join(differences)


def assert_enforcement(cases: list[Case], by_webhook: list[Outcome]) -> None:
    """The webhook's own outcome of each enforcement case is the one meant: a driver limit
    in NVIDIA_GPU_MEMORY_REQUEST and _LIMIT (and the enforcing nodes under require), or a
    refusal naming why."""
    found = {}
    for case, outcome in zip(cases, by_webhook, strict=True):
        if case.name not in ENFORCEMENT_EXPECTED:
            continue
        if not outcome.admitted:
            found[case.name] = outcome.message
            continue
        assert outcome.pod is not None
        (main,) = [c for c in outcome.pod["spec"]["containers"] if c["name"] == "main"]
        env = {e["name"]: e.get("value") for e in main.get("env", [])}
        found[case.name] = env.get("NVIDIA_GPU_MEMORY_LIMIT") or ""
        assert env.get("NVIDIA_GPU_MEMORY_REQUEST") == env.get("NVIDIA_GPU_MEMORY_LIMIT")
        if case.namespace == "enforced-a":
            selector = outcome.pod["spec"]["nodeSelector"]
            assert selector["gpushare.io/driver-memory-limit"] == "true", case.name
    wrong = {
        name: found[name]
        for name, expected in ENFORCEMENT_EXPECTED.items()
        if not (found[name] == expected or (expected and expected in found[name]))
    }
    assert not wrong, wrong


def _compilable(source: Path, target: Path) -> Path:
    """The e2e policy set with the settings the compiler refuses turned off."""
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.glob("*.yaml")):
        documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
        for document in documents:
            spec = document.get("spec", {})
            pytorch = spec.get("frameworks", {}).get("pytorch")
            if isinstance(pytorch, dict):
                pytorch["memoryFraction"] = False
            servers = spec.get("inferenceServers")
            if isinstance(servers, dict) and servers.get("memory") == "set":
                servers["memory"] = "warn"
        (target / path.name).write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return target


@pytest.fixture(scope="module")
def compilable_policies(tmp_path_factory: pytest.TempPathFactory, webhook_policies: Path) -> Path:
    """The e2e set, compilable, with the enforcement policies beside it."""
    target = _compilable(webhook_policies, tmp_path_factory.mktemp("compilable"))
    (target / "enforcement.yaml").write_text(ENFORCEMENT_POLICIES)
    return target


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
    control_plane: ControlPlane,
    compilable_policies: Path,
    probe_namespace: str,
) -> Iterator[GpushareWebhook]:
    server = WebhookServer.start(tmp_path_factory.mktemp("compiled-webhook"), compilable_policies)
    try:
        yield GpushareWebhook(server, control_plane.api, probe_namespace)
    finally:
        server.stop()


def test_the_refused_settings_are_refused_by_name(webhook_policies: Path) -> None:
    with pytest.raises(CompileRefusedError) as refused:
        compiled_documents(webhook_policies)
    text = str(refused.value)
    assert "spec.frameworks.pytorch.memoryFraction" in text
    assert "spec.inferenceServers.memory" in text


@pytest.mark.timeout(900)
# Never (the default) and IfNeeded, where the apiserver calls each policy again on its own
# output: idempotence under reinvocation.
@pytest.mark.parametrize("reinvocation", REINVOCATION_POLICIES)
def test_every_corpus_pod_is_admitted_or_denied_alike(
    control_plane: ControlPlane,
    served: GpushareWebhook,
    compilable_policies: Path,
    reinvocation: str,
) -> None:
    cases = _corpus_cases()
    assert len(cases) > 40, "the corpora went missing"
    printed = " ".join(notes(load_policies(compilable_policies)))
    assert all(topic in printed for topic in DOCUMENTED_DIFFERENCES.values()), printed
    documents = compiled_documents(compilable_policies, reinvocation)
    assert {d["spec"].get("reinvocationPolicy") for d in documents} >= {reinvocation}
    bare = outcomes(control_plane.api, cases)
    by_webhook, governed = under_webhook(served, cases)
    by_policies = under_compiled(control_plane, served, documents, cases, governed, by_webhook)
    assert_same(cases, bare, by_webhook, by_policies)
    # The comparison means something: most pods were mutated, some denied.
    assert (
        sum(
            "gpushare.io/applied" in (o.pod or {}).get("metadata", {}).get("annotations", {})
            for o in by_webhook
        )
        > 15
    )
    assert sum(not o.admitted for o in by_webhook) > 15
    # The image references are told apart: some get TensorFlow's or JAX's knob, some neither.
    knobs = {
        c.name: sorted(
            e["name"]
            for container in (o.pod or {}).get("spec", {}).get("containers", [])
            for e in container.get("env", [])
            if e["name"] in ("TF_FORCE_GPU_ALLOW_GROWTH", "XLA_PYTHON_CLIENT_MEM_FRACTION")
        )
        for c, o in zip(cases, by_webhook, strict=True)
        if c.name.startswith("image/")
    }
    assert {tuple(v) for v in knobs.values()} == {
        (),
        ("TF_FORCE_GPU_ALLOW_GROWTH",),
        ("XLA_PYTHON_CLIENT_MEM_FRACTION",),
    }, knobs
    chosen = {
        c.name: json.loads((o.pod or {})["metadata"]["annotations"][APPLIED_ANNOTATION])[
            "container"
        ]
        for c, o in zip(cases, by_webhook, strict=True)
        if c.name in CONTAINER_CHOICE
    }
    assert chosen == CONTAINER_CHOICE
    assert_enforcement(cases, by_webhook)
    by_hand = {c.name: o for c, o in zip(cases, by_webhook, strict=True) if c in BY_HAND}
    assert [n for n, o in by_hand.items() if not o.admitted] == [
        "by-hand/limits",
        "by-hand/init-requests",
    ]


@pytest.mark.timeout(scaled(900, 7200))
@settings(
    max_examples=GENERATED_SETS,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
@given(data=st.data())
def test_generated_policies_and_pods_are_admitted_or_denied_alike(
    data: st.DataObject,
    control_plane: ControlPlane,
    probe_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    texts = data.draw(policy_texts(), label="policies")
    policies = load_policy_texts((f"policies-{i}.yaml", t) for i, t in enumerate(texts))
    try:
        documents = compile_policies(policies)
    except CompileRefusedError:
        assume(False)
    oracle_policies = read_policies(texts)
    cases = []
    for index in range(PODS_PER_SET):
        pod, namespace = data.draw(pods(oracle_policies), label="pod")
        cases.append(Case(f"generated/{index}", namespace, pod))
    directory = tmp_path_factory.mktemp(f"generated-{uuid.uuid4().hex[:6]}")
    policy_dir = directory / "policies"
    policy_dir.mkdir()
    for index, text in enumerate([*texts, PROBE_POLICY]):
        (policy_dir / f"policies-{index}.yaml").write_text(text)
    documents = compiled_documents(policy_dir)
    server = WebhookServer.start(directory / "webhook", policy_dir)
    try:
        webhook = GpushareWebhook(server, control_plane.api, probe_namespace)
        bare = outcomes(control_plane.api, cases)
        by_webhook, governed = under_webhook(webhook, cases)
        by_policies = under_compiled(control_plane, webhook, documents, cases, governed, by_webhook)
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
    assert_same(cases, bare, by_webhook, by_policies)
