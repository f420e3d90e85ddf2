"""The GPU operators' own published examples, adopted as a user would, through ``gpushare
mutate`` and ``gpushare plan``.

The examples are the samples harness/tools/operator-crds/modules.txt pins (KubeRay v1.5.0,
training-operator v1.8.1, Trainer v2.0.0, Argo Workflows v4.0.5, JobSet v0.8.2, LWS v0.7.0,
KServe v0.16.0; each test id is the file's ``module@version/path``), copied from the
projects' Go modules by build.sh into the directory harness.operator_crds finds (or builds).

Every sample whose pod templates ask for ``nvidia.com/gpu`` is adopted by
tests/operator_adoption.py (written from docs/workload-kinds-facts.md, not from gpushare's
own kind table): the GPU request leaves the container and ``gpu-fraction`` ("0.5" for one
GPU, "N" for N) goes where that template's pods take their annotations from. Then, with the
repository's policies/:

- each adopted document is recognised and every adopted template is decided: allowed, with
  the GPU in exactly the container that asked for it (the warnings' ``in container "X"``,
  and for PodTemplateSpecs the applied record of the template as printed), or denied only
  for the reason ``EXPECTED`` names for that sample (none is, today);
- a second ``mutate`` of what the first printed changes nothing;
- ``gpushare plan`` over all of them together counts each template's pods as the facts sheet
  says (``EXPECTED``, each count derived by hand; plus a RayService worker group of
  replicas x numOfHosts and a JobSet of replicas x parallelism);
- every sample as published (no annotation) is untouched or allowed, never denied: gpushare
  must not break the GPU workloads a cluster already runs.

The LLMInferenceService is adopted with ``spec.annotations`` as the facts sheet says (KServe
v0.20.0); the KServe v0.16.0 CRD pinned for the e2e tests has no such field
(tests/e2e/test_operator_kinds.py).
"""

from __future__ import annotations

import contextlib
import io
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.operator_crds import OperatorCrds, OperatorCrdsError, read_pins
from harness.operator_crds import load as load_operator_crds
from tests.operator_adoption import (
    GPU,
    GpuContainer,
    PodPath,
    adopted_copy,
    annotate,
    gpu_containers,
    request_annotations,
    templates,
    value_at,
)
from webhook import cli

REPO = Path(__file__).resolve().parents[1]
POLICIES = REPO / "policies"
APPLIED = "gpushare.io/applied"
# What each pod gets under policies/default.yaml: a share of 0.5 is one slot of the
# time-slicing pool ts-half; N whole GPUs are nvidia.com/gpu: N.
SHARE = "nvidia.com/gpu.shared: 1"


def whole(count: int) -> str:
    return f"{GPU}: {count}"


PINS = read_pins()
SAMPLES = {
    f"{pin.source}/{sample}": (pin.project, sample) for pin in PINS for sample in pin.samples
}


@dataclass(frozen=True)
class Expect:
    """One adopted template: how gpushare names it in its lines (its role), the container
    that asked for the GPU (by its name in the pods), what each pod gets, and how many pods
    the controller makes from it (facts sheet, derived by hand in ``why``)."""

    role: str
    container: str
    gets: str
    pods: int
    why: str
    denied: str = ""  # the one reason this template may be denied for (none today)


# Every published sample asking for nvidia.com/gpu, by module@version/path.
EXPECTED: dict[str, tuple[Expect, ...]] = {
    "github.com/ray-project/kuberay/ray-operator@v1.5.0/config/samples/ray-cluster.verl.yaml": (
        Expect("head", "ray-head", whole(4), 1, "§1: one head pod per cluster"),
    ),
    "github.com/ray-project/kuberay/ray-operator@v1.5.0/config/samples/ray-job.batch-inference.yaml": (  # noqa: E501
        Expect("head", "ray-head", whole(4), 1, "§1-2: the RayJob's cluster has one head"),
    ),
    "github.com/ray-project/kuberay/ray-operator@v1.5.0/config/samples/ray-service.stable-diffusion.yaml": (  # noqa: E501
        Expect(
            "worker group gpu-group",
            "ray-worker",
            SHARE,
            1,
            "§1: clamp(replicas 1, minReplicas 1, maxReplicas 10) x numOfHosts (default 1)",
        ),
    ),
    "github.com/kubeflow/training-operator@v1.8.1/examples/pytorch/mnist/v1/pytorch_job_mnist_nccl.yaml": (  # noqa: E501
        Expect("Master replicas", "pytorch", SHARE, 1, "§4: Master replicas 1"),
        Expect("Worker replicas", "pytorch", SHARE, 1, "§4: Worker replicas 1"),
    ),
    "github.com/kubeflow/training-operator@v1.8.1/examples/tensorflow/distribution_strategy/keras-API/multi_worker_tfjob.yaml": (  # noqa: E501
        Expect("Worker replicas", "tensorflow", SHARE, 2, "§4: Worker replicas 2"),
    ),
    "github.com/kubeflow/training-operator@v1.8.1/examples/paddlepaddle/simple-gpu.yaml": (
        Expect("Worker replicas", "paddle", whole(2), 2, "§4: Worker replicas 2"),
    ),
    "github.com/kubeflow/training-operator@v1.8.1/examples/mxnet/mxjob_dist_v1.yaml": (
        Expect("Worker replicas", "mxnet", SHARE, 1, "§4: Worker replicas 1"),
    ),
    "github.com/kubeflow/trainer/v2@v2.0.0/manifests/base/runtimes/torchtune/llama3_2/llama3_2_1B.yaml": (  # noqa: E501
        Expect(
            "replicated job node",
            "node",
            whole(2),
            1,
            "§5/§8: replicas (default 1) x the Job's parallelism (default 1)",
        ),
    ),
    "sigs.k8s.io/lws@v0.7.0/docs/examples/vllm/GPU/lws.yaml": (
        Expect("leader", "vllm-leader", whole(8), 2, "§7: one leader per group, replicas 2"),
        Expect("workers", "vllm-worker", whole(8), 2, "§7: replicas 2 x (size 2 - 1)"),
    ),
    "sigs.k8s.io/lws@v0.7.0/docs/examples/sglang/lws.yaml": (
        Expect("leader", "sglang-leader", SHARE, 2, "§7: one leader per group, replicas 2"),
        Expect("workers", "sglang-worker", SHARE, 2, "§7: replicas 2 x (size 2 - 1)"),
    ),
    "github.com/kserve/kserve@v0.20.0/docs/samples/v1beta1/torchserve/v1/gpu.yaml": (
        Expect("predictor", "kserve-container", SHARE, 1, "§9: minReplicas (default 1)"),
    ),
    "github.com/kserve/kserve@v0.20.0/docs/samples/storage/hf/hf_isvc.yaml": (
        Expect("predictor", "kserve-container", SHARE, 1, "§9: minReplicas (default 1)"),
    ),
    "github.com/kserve/kserve@v0.20.0/docs/samples/llmisvc/single-node-gpu/llm-inference-service-qwen2-7b-gpu.yaml": (  # noqa: E501
        Expect("decode", "main", SHARE, 3, "§10: a Deployment of spec.replicas 3"),
    ),
}


@pytest.fixture(scope="module")
def operator_crds() -> OperatorCrds:
    """The built operator CRDs directory ($GPUSHARE_OPERATOR_CRDS, else build.sh)."""
    try:
        return load_operator_crds()
    except OperatorCrdsError as exc:
        pytest.fail(str(exc), pytrace=False)


def documents_of(operator_crds: OperatorCrds, sample_id: str) -> list[dict[str, Any]]:
    project, sample = SAMPLES[sample_id]
    path = operator_crds.sample(project, sample)
    assert operator_crds.source(path) == sample_id
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def adopted_documents(
    operator_crds: OperatorCrds, sample_id: str
) -> list[tuple[dict[str, Any], list[GpuContainer]]]:
    return [adopted_copy(doc) for doc in documents_of(operator_crds, sample_id)]


def run(*args: str) -> tuple[int, str, str]:
    """``gpushare ARGS`` in this process (webhook.cli.main), as the CLI tests do."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def mutate_report(path: Path) -> tuple[int, list[dict[str, Any]]]:
    code, out, err = run("mutate", "-f", str(path), "--policies", str(POLICIES), "-o", "json")
    assert code in (0, 3), err
    return code, json.loads(out)["documents"]


def write(path: Path, documents: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path


def gpu_lines(warnings: list[str], role: str) -> list[str]:
    """The lines saying which GPU resource each pod of ``role`` gets, and in which container."""
    return [w for w in warnings if w.startswith(f"{role}: each pod will get nvidia.com/")]


# -- which samples ask for GPUs -------------------------------------------------------------


def test_the_gpu_samples_are_the_ones_this_module_expects(operator_crds: OperatorCrds) -> None:
    """Every sample asking for nvidia.com/gpu in a pod template is in EXPECTED (a new pin or
    sample must say what gpushare does with it), with one Expect per GPU container."""
    asking = {}
    for sample_id in SAMPLES:
        containers = [
            g for doc in documents_of(operator_crds, sample_id) for g in gpu_containers(doc)
        ]
        if containers:
            asking[sample_id] = [g.name for g in containers]
    assert set(asking) == set(EXPECTED)
    for sample_id, names in asking.items():
        assert names == [e.container for e in EXPECTED[sample_id]], sample_id


# -- adopted: recognised, decided, the GPU where it was --------------------------------------


@pytest.mark.parametrize("sample_id", list(EXPECTED))
def test_an_adopted_sample_is_decided_with_the_gpu_where_it_was(
    sample_id: str, operator_crds: OperatorCrds, tmp_path: Path
) -> None:
    adopted = adopted_documents(operator_crds, sample_id)
    assert all(GPU not in json.dumps(doc) for doc, _ in adopted), "nvidia.com/gpu left behind"
    code, entries = mutate_report(write(tmp_path / "adopted.yaml", [doc for doc, _ in adopted]))
    expected = iter(EXPECTED[sample_id])
    for (_, containers), entry in zip(adopted, entries, strict=True):
        if not containers:  # a ConfigMap or Service beside the workload
            assert entry["verdict"] == "untouched", entry
            continue
        # Recognised: its templates were read, not passed through as unknown.
        assert entry["template"] is not None, entry
        # What gpushare says about the templates fits a warning the apiserver keeps whole.
        own = ("each pod", "itself does nothing", "shown as written", "is read as", "named")
        long = [w for w in entry["warnings"] if any(p in w for p in own) and len(w) > 119]
        assert long == [], long
        assert entry["verdict"] in ("allowed", "denied"), entry
        # Each template decided on its own: by its path (as written), its role and verdict.
        decided = {t["path"]: (t["role"], t["verdict"]) for t in entry["templates"]}
        roles = []
        for gpu in containers:
            expect = next(expected)
            roles.append(expect.role)
            verdict = "denied" if expect.denied else "allowed"
            assert decided[written(gpu.template)] == (expect.role, verdict), decided
            lines = gpu_lines(entry["warnings"], expect.role)
            if expect.denied:
                assert any(
                    reason.startswith(f"{expect.role}: ") and expect.denied in reason
                    for reason in entry["reasons"]
                ), entry["reasons"]
                continue
            # Allowed: one line for the template, naming the container that asked.
            wanted = (
                f'{expect.role}: each pod will get {expect.gets} in container "{expect.container}"'
            )
            assert len(lines) == 1, entry["warnings"]
            assert lines[0] == wanted or lines[0].startswith(f"{wanted} ("), lines[0]
            if gpu.exact and entry["verdict"] == "allowed":
                check_printed_template(entry["result"], gpu, expect.container)
        # Templates that asked for no GPU got nothing.
        assert {verdict for role, verdict in decided.values() if role not in roles} <= {
            "untouched"
        }, decided
        given = [w for w in entry["warnings"] if "each pod will get nvidia.com/" in w]
        assert [w for w in given if not w.startswith(tuple(f"{r}: " for r in roles))] == []
        denials = [e.denied for e in EXPECTED[sample_id] if e.denied]
        assert (entry["verdict"] == "denied") == bool(denials), entry["reasons"]
        assert (code == 3) == bool(denials)
    assert next(expected, None) is None


def written(path: PodPath) -> str:
    """A concrete path as gpushare's report writes it: dots, list indexes in brackets."""
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else f".{step}"
    return text.lstrip(".")


def check_printed_template(result: dict[str, Any], gpu: GpuContainer, container: str) -> None:
    """The template as printed: the applied record names the container, and only it has a
    GPU resource."""
    template = value_at(result, gpu.template)
    record = json.loads(template["metadata"]["annotations"][APPLIED])
    assert record["container"] == container
    for item in template["spec"]["containers"]:
        limits = (item.get("resources") or {}).get("limits") or {}
        has_gpu = any(name.startswith("nvidia.com/") for name in limits)
        assert has_gpu == (item["name"] == container), item


@pytest.mark.parametrize("sample_id", list(EXPECTED))
def test_a_second_mutate_of_the_printed_sample_changes_nothing(
    sample_id: str, operator_crds: OperatorCrds, tmp_path: Path
) -> None:
    adopted = [doc for doc, _ in adopted_documents(operator_crds, sample_id)]
    _, entries = mutate_report(write(tmp_path / "adopted.yaml", adopted))
    # A denied document is printed as nothing (EXPECTED says which may be: none today).
    first = [entry for entry in entries if entry["verdict"] != "denied"]
    assert first, [entry["reasons"] for entry in entries]
    _, second = mutate_report(write(tmp_path / "printed.yaml", [e["result"] for e in first]))
    for before, after in zip(first, second, strict=True):
        assert after["verdict"] == before["verdict"]
        assert after["patch"] == [], after["patch"]
        assert after["result"] == before["result"]


# -- plan: the pods of each template ---------------------------------------------------------


def label(document: dict[str, Any], role: str) -> str:
    """How ``plan`` names a template: Kind/namespace/name (role); the document's own
    namespace (a PaddleJob sample names kubeflow), else default."""
    metadata = document["metadata"]
    namespace = metadata.get("namespace") or "default"
    return f"{document['kind']}/{namespace}/{metadata['name']} ({role})"


def planned_pods(directory: Path) -> Counter[str]:
    """Pods per template, as ``gpushare plan -f DIR -o json`` counts them (the policies as
    configured): served in a pool, denied, not modelled or untouched."""
    code, out, err = run("plan", "-f", str(directory), "--policies", str(POLICIES), "-o", "json")
    assert code == 0, err
    (configured, *_) = json.loads(out)["schemes"]
    assert configured["scheme"] == "as configured"
    counts: Counter[str] = Counter()
    for pool in configured["pools"]:
        for bin_ in pool["bins"]:
            for item in bin_:
                counts[item["workload"]] += item["pods"]
    for section in ("denied", "notModelled", "untouched"):
        for item in configured[section]:
            counts[item["workload"]] += item["pods"]
    return counts


def hand_counted(operator_crds: OperatorCrds) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Published samples given a share by hand, scaled where the sample leaves a factor at
    its default, and their pod counts worked out from the facts sheet."""
    documents, counts = [], {}
    # §1: a worker group makes replicas x numOfHosts pods (replicas within min..max).
    (service,) = documents_of(
        operator_crds,
        "github.com/ray-project/kuberay/ray-operator@v1.5.0/config/samples/"
        "ray-service.stable-diffusion.yaml",
    )
    service, _ = adopted_copy(service)
    service["metadata"]["name"] = "stable-diffusion-scaled"
    group = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    group.update(replicas=3, numOfHosts=2)
    documents.append(service)
    counts[label(service, "worker group gpu-group")] = 3 * 2
    # §8: a replicated Job makes replicas x parallelism pods (mnist: parallelism 4).
    (jobset,) = documents_of(
        operator_crds, "sigs.k8s.io/jobset@v0.8.2/site/static/examples/pytorch/cnn-mnist/mnist.yaml"
    )
    jobset["metadata"]["name"] = "pytorch-shared"
    workers = jobset["spec"]["replicatedJobs"][0]
    annotate(workers["template"]["spec"]["template"], ("metadata", "annotations"), "0.5")
    documents.append(jobset)
    counts[label(jobset, "replicated job workers")] = 1 * 4
    scaled = json.loads(json.dumps(jobset))
    scaled["metadata"]["name"] = "pytorch-shared-scaled"
    scaled["spec"]["replicatedJobs"][0]["replicas"] = 3
    documents.append(scaled)
    counts[label(scaled, "replicated job workers")] = 3 * 4
    return documents, counts


def test_plan_counts_each_adopted_template_as_the_facts_sheet_does(
    operator_crds: OperatorCrds, tmp_path: Path
) -> None:
    expected: dict[str, int] = {}
    for number, sample_id in enumerate(EXPECTED):
        adopted = adopted_documents(operator_crds, sample_id)
        write(tmp_path / f"{number:02d}.yaml", [doc for doc, _ in adopted])
        workload = next(doc for doc, containers in adopted if containers)
        for expect in EXPECTED[sample_id]:
            expected[label(workload, expect.role)] = expect.pods
    documents, counts = hand_counted(operator_crds)
    write(tmp_path / "hand-counted.yaml", documents)
    expected.update(counts)

    planned = planned_pods(tmp_path)

    assert {name: planned.get(name) for name in expected} == expected


# What KubeRay makes of a worker group whose replicas lie outside minReplicas..maxReplicas
# (facts §1, KR controllers/ray/utils/util.go L348-369: clamp(replicas, min, max) x
# numOfHosts; replicas defaults to 0): the clamp is on replicas, before numOfHosts.
RAY_CLAMP = [
    pytest.param({"minReplicas": 2, "maxReplicas": 5, "numOfHosts": 2}, 4, id="no-replicas-min-2"),
    pytest.param({"replicas": 9, "minReplicas": 1, "maxReplicas": 3}, 3, id="replicas-above-max"),
]


@pytest.mark.parametrize(("group", "pods"), RAY_CLAMP)
def test_plan_counts_a_ray_worker_group_clamped_as_kuberay_does(
    group: dict[str, int], pods: int, operator_crds: OperatorCrds, tmp_path: Path
) -> None:
    (cluster,) = documents_of(
        operator_crds,
        "github.com/ray-project/kuberay/ray-operator@v1.5.0/config/samples/ray-cluster.sample.yaml",
    )
    worker = cluster["spec"]["workerGroupSpecs"][0]
    for key in ("replicas", "minReplicas", "maxReplicas"):
        worker.pop(key, None)
    worker.update(group)
    annotate(worker["template"], ("metadata", "annotations"), "0.5")
    write(tmp_path / "cluster.yaml", [cluster])
    assert planned_pods(tmp_path).get(label(cluster, "worker group workergroup")) == pods


# -- as published: nothing is broken ---------------------------------------------------------


@pytest.mark.parametrize("sample_id", list(SAMPLES))
def test_a_sample_as_published_is_untouched_or_allowed_never_denied(
    sample_id: str, operator_crds: OperatorCrds, tmp_path: Path
) -> None:
    documents = documents_of(operator_crds, sample_id)
    assert request_annotations(documents) == 0  # published without gpushare's annotations
    code, entries = mutate_report(write(tmp_path / "published.yaml", documents))
    assert code == 0
    for document, entry in zip(documents, entries, strict=True):
        assert entry["verdict"] in ("untouched", "allowed"), entry
        assert entry["reasons"] == []
        assert entry["patch"] == []
        assert entry["result"] == document
        if templates(document):  # an operator kind: gpushare read it and found no annotation
            assert entry["template"] is not None or "no pod template" in entry["untouched"]
