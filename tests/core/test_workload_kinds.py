"""The table of workload kinds (webhook/core/workload_kinds.yaml) and the pods built from it:
paths, counts, names and labels, the shapes that are not PodTemplateSpecs, bounds, and the
policy settings' own kinds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from webhook.core import (
    Planned,
    PolicySet,
    Shape,
    TooManyTemplatesError,
    WorkloadKind,
    builtin_kinds,
    check_workload,
    load_policy_text,
    pod_count,
    template_pod,
    templates_at,
    workload_kind,
)
from webhook.core.object_paths import parse_path, value_at, written_path
from webhook.core.workload_kinds import MAX_TEMPLATES, parse_pods
from webhook.errors import PolicyError

REPO = Path(__file__).resolve().parents[2]
DEFAULT = (REPO / "policies/default.yaml").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    return load_policy_text(DEFAULT)


def kind(group: str, name: str) -> WorkloadKind:
    found = workload_kind(group, name)
    assert found is not None
    return found


def annotated(fraction: str = "0.5") -> dict[str, Any]:
    return {"annotations": {"gpu-fraction": fraction}}


# -- the table ----------------------------------------------------------------------------------


def test_every_kind_the_issue_names_is_in_the_table() -> None:
    names = {(k.group, k.kind) for k in builtin_kinds()}
    assert names >= {
        ("apps", "Deployment"),
        ("batch", "CronJob"),
        ("ray.io", "RayCluster"),
        ("ray.io", "RayJob"),
        ("ray.io", "RayService"),
        ("kubeflow.org", "PyTorchJob"),
        ("kubeflow.org", "TFJob"),
        ("kubeflow.org", "MPIJob"),
        ("kubeflow.org", "XGBoostJob"),
        ("kubeflow.org", "PaddleJob"),
        ("kubeflow.org", "MXJob"),
        ("kubeflow.org", "JAXJob"),
        ("kubeflow.org", "Notebook"),
        ("trainer.kubeflow.org", "TrainJob"),
        ("trainer.kubeflow.org", "TrainingRuntime"),
        ("trainer.kubeflow.org", "ClusterTrainingRuntime"),
        ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"),
        ("jobset.x-k8s.io", "JobSet"),
        ("serving.kserve.io", "InferenceService"),
        ("serving.kserve.io", "LLMInferenceService"),
        ("argoproj.io", "Workflow"),
        ("argoproj.io", "WorkflowTemplate"),
        ("argoproj.io", "ClusterWorkflowTemplate"),
        ("argoproj.io", "CronWorkflow"),
    }
    assert len(names) == len(builtin_kinds())  # each kind once
    resources = [(k.group, k.resource) for k in builtin_kinds()]
    assert len(set(resources)) == len(resources)


@pytest.mark.parametrize(
    ("text", "steps", "written"),
    [
        ("spec.template", ("spec", "template"), "spec.template"),
        (
            "spec.groups[*].template",
            ("spec", "groups", "[*]", "template"),
            "spec.groups[*].template",
        ),
        ("spec.replicaSpecs.*.template", ("spec", "replicaSpecs", "*", "template"), None),
    ],
)
def test_paths_are_parsed_and_written_back(
    text: str, steps: tuple[str, ...], written: str | None
) -> None:
    assert parse_path(text) == steps
    assert written_path(steps) == (written or text)


@pytest.mark.parametrize("text", ["spec..template", "spec.[0]", "spec.a b", "", "spec.x[1]"])
def test_a_path_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a path"):
        parse_path(text)


def test_value_at_follows_bound_wildcards_and_never_raises() -> None:
    document = {"spec": {"groups": [{"n": 1}, {"n": 2}], "map": {"a": {"n": 3}}}}
    assert value_at(document, ("spec", "groups", "[*]", "n"), (1,)) == 2
    assert value_at(document, ("spec", "map", "*", "n"), ("a",)) == 3
    assert value_at(document, ("spec", "groups", "[*]", "n"), (5,)) is None
    assert value_at(document, ("spec", "groups", "[*]", "n"), ("a",)) is None
    assert value_at("not an object", ("spec",)) is None


def test_pod_count_terms_read_as_written() -> None:
    assert parse_pods("spec.replicas|1 * (spec.size|1 - 1)")[1].minus == 1
    with pytest.raises(ValueError, match=r"PATH\|DEFAULT"):
        parse_pods("spec.replicas + 1")


# -- templates found, pods built, counted -------------------------------------------------------


def ray_cluster() -> dict[str, Any]:
    worker = {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.41.0-gpu"}]}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "rc", "namespace": "ml"},
        "spec": {
            "headGroupSpec": {
                "template": {"spec": {"containers": [{"name": "ray-head", "image": "r"}]}}
            },
            "workerGroupSpecs": [
                {
                    "groupName": "gpu",
                    "replicas": 3,
                    "numOfHosts": 2,
                    "template": {"metadata": annotated(), "spec": worker},
                },
                {"groupName": "cpu", "template": {"spec": worker}},
            ],
        },
    }


def test_a_ray_cluster_is_its_head_and_each_worker_group(policies: PolicySet) -> None:
    document = ray_cluster()
    ray = kind("ray.io", "RayCluster")
    found = templates_at(document, ray)
    assert [(t.where, t.role) for t in found] == [
        ("spec.headGroupSpec.template", "head"),
        ("spec.workerGroupSpecs[0].template", "worker group gpu"),
        ("spec.workerGroupSpecs[1].template", "worker group cpu"),
    ]
    assert [pod_count(document, t, "x") for t in found] == [1, 6, 0]  # replicas default 0
    pod = template_pod(document, ray, found[1], "ml")
    assert pod is not None
    assert pod["metadata"]["generateName"] == "rc-gpu-worker-"
    assert pod["metadata"]["labels"]["ray.io/group"] == "gpu"
    assert pod["metadata"]["labels"]["ray.io/node-type"] == "worker"
    checked = check_workload(document, ray, "ml", policies)
    assert checked is not None and checked.allowed
    assert checked.warnings[0].startswith(
        'worker group gpu: each pod will get nvidia.com/gpu.shared: 1 in container "ray-worker"'
    )
    result = checked.result
    assert result is not None
    planned = result["spec"]["workerGroupSpecs"][0]["template"]
    assert planned["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu.shared": "1"}
    assert result["spec"]["workerGroupSpecs"][1] == document["spec"]["workerGroupSpecs"][1]
    assert all(op["path"].startswith("/spec/workerGroupSpecs/0/template/") for op in checked.patch)


def test_a_denied_group_names_its_role_and_the_workload(policies: PolicySet) -> None:
    document = ray_cluster()
    document["spec"]["workerGroupSpecs"][1]["template"]["metadata"] = annotated("1.5")
    checked = check_workload(document, kind("ray.io", "RayCluster"), "ml", policies)
    assert checked is not None and not checked.allowed and checked.code == 422
    assert checked.admission_reasons[0] == "pod template of RayCluster 'rc' (worker group cpu):"
    assert checked.reasons[0].startswith('worker group cpu: gpu-fraction "1.5"')
    assert checked.result is None and checked.patch == []


def test_training_operator_replicas_are_a_map(policies: PolicySet) -> None:
    template = {
        "metadata": annotated(),
        "spec": {"containers": [{"name": "pytorch", "image": "p"}]},
    }
    document = {
        "metadata": {"name": "train"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"template": template},
                "Worker": {"replicas": 3, "template": template},
            }
        },
    }
    pytorch = kind("kubeflow.org", "PyTorchJob")
    found = templates_at(document, pytorch)
    assert [(t.where, t.role, pod_count(document, t, "x")) for t in found] == [
        ("spec.pytorchReplicaSpecs.Master.template", "Master replicas", 1),
        ("spec.pytorchReplicaSpecs.Worker.template", "Worker replicas", 3),
    ]
    pod = template_pod(document, pytorch, found[1], "ml")
    assert pod is not None
    assert pod["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "worker"
    assert pod["metadata"]["labels"]["training.kubeflow.org/job-name"] == "train"


def test_a_leader_worker_set_without_a_leader_template_uses_the_worker_template_for_all() -> None:
    template = {"spec": {"containers": [{"name": "vllm", "image": "v"}]}}
    lws = kind("leaderworkerset.x-k8s.io", "LeaderWorkerSet")
    document = {
        "metadata": {"name": "s"},
        "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 4, "workerTemplate": template}},
    }
    (only,) = templates_at(document, lws)
    assert only.role == "leader and workers" and pod_count(document, only, "x") == 8
    pod = template_pod(document, lws, only, "ml")
    assert pod is not None and pod["metadata"]["annotations"] == {
        "leaderworkerset.sigs.k8s.io/size": "4"
    }
    document["spec"]["leaderWorkerTemplate"]["leaderTemplate"] = template
    leader, workers = templates_at(document, lws)
    assert (pod_count(document, leader, "x"), pod_count(document, workers, "x")) == (2, 6)


def test_a_job_counts_parallelism_up_to_its_completions() -> None:
    job = kind("batch", "Job")
    document = {"spec": {"parallelism": 5, "completions": 2, "template": {"spec": {}}}}
    (at,) = templates_at(document, job)
    assert pod_count(document, at, "x") == 2
    document["spec"].pop("completions")
    assert pod_count(document, at, "x") == 5
    document["spec"]["parallelism"] = -1
    with pytest.raises(ValueError, match=r"spec\.parallelism -1 is not a whole number"):
        pod_count(document, at, "Job/x")


def test_a_kserve_predictor_becomes_the_pod_kserve_makes(policies: PolicySet) -> None:
    isvc = kind("serving.kserve.io", "InferenceService")
    document = {
        "metadata": {
            "name": "llm",
            "labels": {"team": "a"},
            "annotations": {"gpu-fraction": "0.5"},
        },
        "spec": {
            "predictor": {
                "minReplicas": 2,
                "annotations": {"extra": "x"},
                "nodeSelector": {"pool": "gpu"},
                "model": {
                    "modelFormat": {"name": "huggingface"},
                    "storageUri": "hf://m",
                    "args": ["--x"],
                },
                "containers": [{"name": "sidecar", "image": "s"}],
            }
        },
    }
    (at,) = templates_at(document, isvc)
    assert at.site.shape is Shape.KSERVE_COMPONENT and pod_count(document, at, "x") == 2
    pod = template_pod(document, isvc, at, "ml")
    assert pod is not None
    assert [c["name"] for c in pod["spec"]["containers"]] == ["kserve-container", "sidecar"]
    assert pod["spec"]["containers"][0] == {"args": ["--x"], "name": "kserve-container"}
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"} and "minReplicas" not in pod["spec"]
    assert pod["metadata"]["labels"] == {
        "team": "a",
        "serving.kserve.io/inferenceservice": "llm",
        "component": "predictor",
    }
    assert pod["metadata"]["annotations"] == {"gpu-fraction": "0.5", "extra": "x"}
    checked = check_workload(document, isvc, "ml", policies)
    assert checked is not None and checked.allowed
    assert 'in container "kserve-container"' in checked.warnings[0]
    assert checked.result == document and checked.patch == []  # not a template of its own


def test_a_custom_transformer_s_first_container_is_kserve_container() -> None:
    isvc = kind("serving.kserve.io", "InferenceService")
    document = {
        "metadata": {"name": "t"},
        "spec": {"transformer": {"containers": [{"name": "mine"}, {"name": "b"}]}},
    }
    (at,) = templates_at(document, isvc)
    pod = template_pod(document, isvc, at, "ml")
    assert pod is not None and [c["name"] for c in pod["spec"]["containers"]] == [
        "kserve-container",
        "b",
    ]


def test_an_argo_template_makes_a_pod_with_wait_then_main(policies: PolicySet) -> None:
    workflow = kind("argoproj.io", "Workflow")
    document = {
        "metadata": {"generateName": "wf-"},
        "spec": {
            "nodeSelector": {"pool": "a"},
            "podMetadata": {"labels": {"team": "x"}},
            "templates": [
                {"name": "main", "steps": [[{"name": "s", "template": "train"}]]},
                {
                    "name": "train",
                    "metadata": annotated("0.25"),
                    "container": {
                        "name": "ignored",
                        "image": "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
                    },
                },
                {
                    "name": "script",
                    "nodeSelector": {"pool": "b"},
                    "script": {"image": "python", "source": "print(1)"},
                },
            ],
        },
    }
    found = templates_at(document, workflow)
    assert [t.role for t in found] == ["template main", "template train", "template script"]
    assert (
        template_pod(document, workflow, found[0], "ml") is None
    )  # steps make no pod of the user's
    pod = template_pod(document, workflow, found[1], "ml")
    assert pod is not None
    assert [c["name"] for c in pod["spec"]["containers"]] == ["wait", "main"]
    assert pod["spec"]["nodeSelector"] == {"pool": "a"}
    assert pod["metadata"]["labels"]["team"] == "x"
    script = template_pod(document, workflow, found[2], "ml")
    assert script is not None and script["spec"]["nodeSelector"] == {"pool": "b"}
    assert "source" not in script["spec"]["containers"][1]
    checked = check_workload(document, workflow, "ml", policies)
    assert checked is not None and checked.allowed
    record = [t for t in checked.templates if isinstance(t.decision, Planned)]
    assert [t.decision.record["container"] for t in record if isinstance(t.decision, Planned)] == [
        "main"
    ]


def test_podspecpatch_is_said_not_read(policies: PolicySet) -> None:
    workflow = kind("argoproj.io", "Workflow")
    document = {
        "metadata": {"name": "wf"},
        "spec": {
            "templates": [
                {
                    "name": "t",
                    "metadata": annotated(),
                    "podSpecPatch": '{"containers":[{"name":"main"}]}',
                    "container": {"image": "i"},
                }
            ]
        },
    }
    checked = check_workload(document, workflow, "ml", policies)
    assert checked is not None
    assert any("podSpecPatch is not read here (Argo applies it)" in w for w in checked.warnings)


def test_an_llm_inference_service_takes_its_annotations_from_its_workload_fields(
    policies: PolicySet,
) -> None:
    llm = kind("serving.kserve.io", "LLMInferenceService")
    main = {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.8.5"}]}
    document = {
        "metadata": {"name": "q", "annotations": {"gpu-fraction": "0.25"}},
        "spec": {
            "replicas": 3,
            "annotations": {"gpu-fraction": "0.5"},
            "template": main,
            "prefill": {"template": main},
        },
    }
    decode, prefill = templates_at(document, llm)
    pod = template_pod(document, llm, decode, "ml")
    assert pod is not None and pod["metadata"]["annotations"] == {"gpu-fraction": "0.5"}
    prefill_pod = template_pod(document, llm, prefill, "ml")
    assert prefill_pod is not None and "annotations" not in prefill_pod["metadata"]
    assert pod_count(document, decode, "x") == 3


def test_a_notebook_s_own_metadata_is_its_pod_s() -> None:
    notebook = kind("kubeflow.org", "Notebook")
    document = {
        "metadata": {"name": "nb", "labels": {"a": "b"}, "annotations": annotated()["annotations"]},
        "spec": {"template": {"spec": {"containers": [{"name": "nb"}]}}},
    }
    (at,) = templates_at(document, notebook)
    pod = template_pod(document, notebook, at, "ml")
    assert pod is not None
    assert pod["metadata"]["labels"] == {"a": "b", "statefulset": "nb", "notebook-name": "nb"}
    assert pod["metadata"]["annotations"] == {"gpu-fraction": "0.5"}


def test_a_train_job_says_where_its_pods_come_from(policies: PolicySet) -> None:
    trainjob = kind("trainer.kubeflow.org", "TrainJob")
    checked = check_workload(
        {"metadata": {"name": "t"}, "spec": {"runtimeRef": {"name": "torch"}}},
        trainjob,
        "ml",
        policies,
    )
    assert checked is not None and checked.allowed and not checked.templates
    assert checked.warnings == (
        "a TrainJob's pods are its runtime's: put gpu-fraction in the runtime's pod templates",
    )


def test_the_annotation_on_the_workload_itself_is_warned_about(policies: PolicySet) -> None:
    document = ray_cluster()
    document["metadata"]["annotations"] = {"gpu-fraction": "0.5"}
    checked = check_workload(document, kind("ray.io", "RayCluster"), "ml", policies)
    assert checked is not None
    assert checked.warnings[-1] == (
        "gpu-fraction on the RayCluster itself does nothing: put it in each pod template's "
        "metadata.annotations"
    )
    deployment = {
        "metadata": {"name": "d", "annotations": {"gpu-memory": "8Gi"}},
        "spec": {"template": {"spec": {"containers": [{"name": "a"}]}}},
    }
    checked = check_workload(deployment, kind("apps", "Deployment"), "ml", policies)
    assert checked is not None and checked.warnings == (
        "gpu-memory on the Deployment itself does nothing: put it in "
        "spec.template.metadata.annotations",
    )


def test_more_templates_than_the_bound_are_refused(policies: PolicySet) -> None:
    templates = [{"name": f"t{i}", "container": {"image": "i"}} for i in range(MAX_TEMPLATES + 1)]
    document = {"metadata": {"name": "big"}, "spec": {"templates": templates}}
    workflow = kind("argoproj.io", "Workflow")
    with pytest.raises(TooManyTemplatesError):
        templates_at(document, workflow)
    checked = check_workload(document, workflow, "ml", policies)
    assert checked is not None and not checked.allowed and checked.code == 422
    assert "holds more than 256 pod templates" in checked.reasons[0]


# -- the policy settings' own kinds --------------------------------------------------------------

CUSTOM = """\
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingSettings
metadata: {name: settings}
spec:
  workloadKinds:
    - apiVersion: ml.example.com/v1
      kind: TrainingRun
      resource: trainingruns
      templates:
        - path: spec.stages[*].podTemplate
          itemName: stage
          role: "stage {item}"
          pods: "spec.stages[*].workers|1"
          pod:
            generateName: "{name}-{item}-"
            labels: {ml.example.com/run: "{name}", ml.example.com/stage: "{item}"}
---
"""


def test_policy_authors_add_their_own_kinds() -> None:
    policies = load_policy_text(CUSTOM + DEFAULT.split("---\n", 1)[1])
    run = workload_kind("ml.example.com", "TrainingRun", policies)
    assert run is not None and run.custom
    assert workload_kind("ml.example.com", "TrainingRun") is None  # only with those policies
    document = {
        "metadata": {"name": "r1"},
        "spec": {
            "stages": [
                {
                    "stage": "pretrain",
                    "workers": 4,
                    "podTemplate": {
                        "metadata": annotated(),
                        "spec": {"containers": [{"name": "t", "image": "i"}]},
                    },
                }
            ]
        },
    }
    (at,) = templates_at(document, run)
    assert pod_count(document, at, "x") == 4
    pod = template_pod(document, run, at, "ml")
    assert pod is not None and pod["metadata"]["labels"] == {
        "ml.example.com/run": "r1",
        "ml.example.com/stage": "pretrain",
    }
    checked = check_workload(document, run, "ml", policies)
    assert checked is not None and checked.allowed
    assert checked.warnings[0].startswith(
        "stage pretrain: each pod will get nvidia.com/gpu.shared: 1"
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            [
                ("apiVersion: ml.example.com/v1", "apiVersion: ray.io/v1"),
                ("TrainingRun", "RayCluster"),
            ],
            "RayCluster of group ray.io is already read",
        ),
        (
            [("apiVersion: ml.example.com/v1", "apiVersion: apps/v1")],
            "does not have the expected form",
        ),
        (
            [("path: spec.stages[*].podTemplate", "path: spec..x")],
            "does not have the expected form",
        ),
        ([('pods: "spec.stages[*].workers|1"', 'pods: "spec.stages + 1"')], "PATH|DEFAULT"),
    ],
)
def test_a_custom_kind_that_cannot_be_read_is_a_policy_error(
    changes: list[tuple[str, str]], message: str
) -> None:
    text = CUSTOM
    for old, new in changes:
        text = text.replace(old, new)
    with pytest.raises(PolicyError) as error:
        load_policy_text(text + DEFAULT.split("---\n", 1)[1])
    assert any(message in line for line in error.value.problems), error.value.problems


def ray_vllm(workers: int) -> dict[str, Any]:
    head = {
        "metadata": annotated(),
        "spec": {
            "containers": [
                {
                    "name": "ray-head",
                    "image": "vllm/vllm-openai:v0.8.5",
                    "command": ["sh", "-c", "ray start --head && vllm serve m -tp 4"],
                }
            ]
        },
    }
    gpu = {"limits": {"nvidia.com/gpu": 1}}
    worker = {"spec": {"containers": [{"name": "ray-worker", "image": "r", "resources": gpu}]}}
    return {
        "metadata": {"name": "serve"},
        "spec": {
            "headGroupSpec": {"template": head},
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": workers, "template": worker}],
        },
    }


def test_a_server_on_a_ray_cluster_counts_every_pod_s_gpus(policies: PolicySet) -> None:
    """-tp 4 on the head: its share of one GPU and the workers' GPUs count together."""
    ray = kind("ray.io", "RayCluster")
    short = check_workload(ray_vllm(2), ray, "ml", policies)
    assert short is not None and not short.allowed and short.code == 422
    (reason,) = short.reasons
    assert reason.startswith("head: container 'ray-head': vLLM")
    assert "needs 4 GPUs, but all the pods of RayCluster 'serve' get 3 in all" in reason
    enough = check_workload(ray_vllm(3), ray, "ml", policies)
    assert enough is not None and enough.allowed
    assert any("on a Ray cluster its workers' GPUs count" in w for w in enough.warnings)


def test_a_multi_node_llm_inference_service_is_a_leader_worker_group(policies: PolicySet) -> None:
    """With spec.worker KServe runs a LeaderWorkerSet: its leader and workers are one group
    of pipeline-parallel size, and a server spanning it counts the group's GPUs."""
    llm = kind("serving.kserve.io", "LLMInferenceService")
    server = {
        "name": "main",
        "image": "vllm/vllm-openai:v0.8.0",
        "args": ["--tensor-parallel-size", "8", "--pipeline-parallel-size", "2"],
    }
    document = {
        "metadata": {"name": "big"},
        "spec": {
            "replicas": 2,
            "annotations": {"gpu-fraction": "8"},
            "parallelism": {"tensor": 8, "pipeline": 2},
            "template": {"containers": [server]},
            "worker": {"containers": [server]},
        },
    }
    leader, workers = templates_at(document, llm)
    assert (leader.role, workers.role) == ("decode leader", "decode workers")
    assert (pod_count(document, leader, "x"), pod_count(document, workers, "x")) == (2, 2)
    pod = template_pod(document, llm, workers, "ml")
    assert pod is not None
    assert pod["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/size"] == "2"
    checked = check_workload(document, llm, "ml", policies)
    assert checked is not None and checked.allowed, checked.reasons
    document["spec"]["parallelism"]["pipeline"] = 1  # one pod of 8 GPUs for TP 8 x PP 2
    checked = check_workload(document, llm, "ml", policies)
    assert checked is not None and not checked.allowed
    assert "needs 16 GPUs" in checked.reasons[0]


@pytest.mark.parametrize(
    ("example", "namespace"),
    [
        ("hami", "hami-a"),
        ("aliyun-gpushare", "aliyun-a"),
        ("tencent-vcuda", "vcuda-a"),
        ("aws-vgpu", "aws-vgpu-a"),
        ("dra", "gpu-dra-a"),
        ("kai", "kai-a"),
    ],
)
def test_what_each_pod_gets_is_named_under_every_scheme(example: str, namespace: str) -> None:
    """Under the schemes that hand out several resources, a claim or KAI's share, the
    summary names them (it read "None: None" before)."""
    from webhook.core import load_policies

    policies = load_policies(REPO / "policies/examples" / f"{example}.yaml")
    deployment = {
        "metadata": {"name": "web"},
        "spec": {
            "template": {
                "metadata": annotated(),
                "spec": {"containers": [{"name": "app", "image": "python:3.12"}]},
            }
        },
    }
    checked = check_workload(deployment, kind("apps", "Deployment"), namespace, policies)
    assert checked is not None and checked.allowed, checked.reasons
    first = checked.warnings[0]
    assert first.startswith("each pod will get ") and "None" not in first, first
    assert 'in container "app"' in first
