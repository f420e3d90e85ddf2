"""The other device plugins' schemes (issue 12): golden cases (tests/schemes/<case>/, laid
out as tests/corpus/README.md says) and the rules behind them, one scheme at a time.

Each golden case is the same annotated workload a developer writes, under one scheme's
example policy (policies/examples/): what the pod gets must be exactly ``expected.yaml``
(or the denial exactly ``denied.txt``), apply as a JSON Patch, stay put when mutated again,
be a valid Pod, and carry every resource with requests == limits as integer strings.
Units round up, never granting less than asked; an ask under a scheme's smallest unit is
refused with the unit named.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.policy_versions import with_policy_versions
from webhook import cli
from webhook.constants import APPLIED_ANNOTATION
from webhook.core.planning import Denied, Planned, Untouched, plan_pod
from webhook.core.policy.loader import load_policy_text
from webhook.core.policy.model import PolicySet
from webhook.core.verdict import mutate, mutated_pod
from webhook.errors import PolicyError

from .support import REPO_ROOT, assert_valid_kubernetes_pod
from .test_corpus import Case, _load_case, _policies

SCHEMES_DIR = REPO_ROOT / "tests" / "schemes"
CASES = [_load_case(folder) for folder in sorted(SCHEMES_DIR.iterdir()) if folder.is_dir()]
ADMITTED = [c for c in CASES if c.expected is not None]
DENIED = [c for c in CASES if c.denied is not None]
MUTATED = [c for c in ADMITTED if not c.untouched]


def _ids(cases: list[Case]) -> list[str]:
    return [c.name for c in cases]


# -- golden cases ----------------------------------------------------------------------------


def test_every_scheme_has_golden_cases() -> None:
    modes = {
        json.loads(c.expected["metadata"]["annotations"][APPLIED_ANNOTATION])["policy"]  # type: ignore[index]
        for c in MUTATED
    }
    assert modes >= {"aws-vgpu", "tencent-vcuda", "aliyun-gpushare", "hami", "kai", "aks-mps"}
    assert {c.name.removeprefix("deny-").split("-")[0] for c in DENIED} >= {
        "aws",
        "tencent",
        "aliyun",
        "kai",
    }


@pytest.mark.parametrize("case", ADMITTED, ids=_ids(ADMITTED))
def test_scheme_case_is_admitted_as_expected(case: Case) -> None:
    outcome = mutate(case.pod, case.namespace, _policies(case.policies_path))
    assert outcome.allowed, outcome.reasons
    assert outcome.warnings == case.warnings
    assert outcome.decision is not None
    assert mutated_pod(case.pod, outcome.decision) == case.expected
    patched = jsonpatch.apply_patch(copy.deepcopy(case.pod), outcome.patch)
    assert patched == case.expected


@pytest.mark.parametrize("case", DENIED, ids=_ids(DENIED))
def test_scheme_case_is_denied_with_the_expected_reasons(case: Case) -> None:
    outcome = mutate(case.pod, case.namespace, _policies(case.policies_path))
    assert not outcome.allowed
    assert outcome.reasons == case.denied
    assert outcome.patch == []


@pytest.mark.parametrize("case", ADMITTED, ids=_ids(ADMITTED))
def test_scheme_case_mutated_again_yields_no_patch(case: Case) -> None:
    outcome = mutate(case.expected or {}, case.namespace, _policies(case.policies_path))
    assert outcome.allowed, outcome.reasons
    assert outcome.patch == []


@pytest.mark.parametrize("case", ADMITTED, ids=_ids(ADMITTED))
def test_scheme_case_is_a_valid_kubernetes_pod(case: Case) -> None:
    assert_valid_kubernetes_pod(case.expected or {})


@pytest.mark.parametrize("case", MUTATED, ids=_ids(MUTATED))
def test_every_resource_a_scheme_sets_has_requests_equal_limits(case: Case) -> None:
    record = json.loads(case.expected["metadata"]["annotations"][APPLIED_ANNOTATION])  # type: ignore[index]
    container = next(
        c
        for c in case.expected["spec"]["containers"]  # type: ignore[index]
        if c["name"] == record["container"]
    )
    wanted = record.get("resources") or (
        {record["resource"]: record.get("slots", record.get("gpus"))}
        if record.get("resource")
        else {}
    )
    for name, count in wanted.items():
        assert container["resources"]["limits"][name] == str(count)
        assert container["resources"]["requests"][name] == str(count)


def test_cli_mutate_runs_a_scheme_case(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    case = next(c for c in CASES if c.name == "tencent-vcuda-quarter")
    monkeypatch.chdir(REPO_ROOT)
    code = cli.main(
        ["mutate", "-f", str(case.folder / "pod.yaml"), "--policies", str(case.policies_arg)]
    )
    out, _ = capsys.readouterr()
    assert code == 0
    assert yaml.safe_load(out) == case.expected


# -- the rules, scheme by scheme ---------------------------------------------------------------


def _policy(mode: str, extra: str = "") -> PolicySet:
    text = f"""
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata: {{name: p}}
spec:
  default: true
  mode: {mode}
{extra}
"""
    return load_policy_text(text, "p.yaml")


def _pod(annotations: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "registry.example.com/app:1"}], **spec},
    }


def _resources(decision: Any) -> dict[str, int]:
    assert isinstance(decision, Planned), decision
    return dict(decision.record["resources"])


def _denied(decision: Any) -> str:
    assert isinstance(decision, Denied), decision
    return " ".join(decision.reasons)


@pytest.mark.parametrize(
    ("fraction", "vgpus"), [("0.1", 1), ("0.11", 2), ("0.2", 2), ("0.3333", 4), ("1", None)]
)
def test_aws_vgpus_are_the_fraction_rounded_up(fraction: str, vgpus: int | None) -> None:
    policies = _policy("aws-vgpu", "  awsVgpu: {singleGpuNodes: true}\n  wholeGpus: {max: 1}")
    decision = plan_pod(_pod({"gpu-fraction": fraction}), "default", policies)
    if vgpus is None:  # whole GPUs are the NVIDIA plugin's, on other nodes
        assert isinstance(decision, Planned) and decision.record["resource"] == "nvidia.com/gpu"
        return
    assert _resources(decision) == {"k8s.amazonaws.com/vgpu": vgpus}


def test_aws_vgpu_refuses_several_vgpus_unless_nodes_have_one_gpu() -> None:
    decision = plan_pod(_pod({"gpu-fraction": "0.2"}), "default", _policy("aws-vgpu"))
    assert "needs 2 vGPUs" in _denied(decision)
    assert "awsVgpu.singleGpuNodes: true" in _denied(decision)


def test_aws_vgpu_refuses_a_fraction_finer_than_one_vgpu_of_the_configured_count() -> None:
    policies = _policy("aws-vgpu", "  awsVgpu: {vgpusPerGpu: 4}")
    decision = plan_pod(_pod({"gpu-fraction": "0.2"}), "default", policies)
    assert _denied(decision).startswith('gpu-fraction "0.2" is finer than one vGPU, 1/4 of a GPU')


def test_aws_vgpu_memory_ask_needs_gpu_memory() -> None:
    decision = plan_pod(_pod({"gpu-memory": "2Gi"}), "default", _policy("aws-vgpu"))
    assert "declares no gpuMemory" in _denied(decision)


def test_aws_vgpu_pods_get_host_ipc_and_the_pipe_directory() -> None:
    decision = plan_pod(_pod({"gpu-fraction": "0.1"}), "default", _policy("aws-vgpu"))
    assert isinstance(decision, Planned)
    pod = mutated_pod(_pod({"gpu-fraction": "0.1"}), decision)
    assert pod["spec"]["hostIPC"] is True
    assert pod["spec"]["volumes"] == [
        {"name": "aws-vgpu-mps", "hostPath": {"path": "/tmp/nvidia-mps"}}
    ]
    assert pod["spec"]["nodeSelector"] == {"k8s.amazonaws.com/accelerator": "vgpu"}
    # No gpuMemory: no memory limit; 10% is the daemon's own, so no client percentage.
    assert [e["name"] for e in pod["spec"]["containers"][0]["env"]] == ["CUDA_MPS_PIPE_DIRECTORY"]


@pytest.mark.parametrize(
    ("annotations", "core", "blocks"),
    [
        ({"gpu-fraction": "0.25"}, 25, 16),  # 4096 MiB of 16Gi
        ({"gpu-memory": "256Mi"}, 2, 1),  # 1.5625% -> 2 cores
        ({"gpu-memory": "257Mi"}, 2, 2),  # one MiB over a block: two blocks
        ({"gpu-memory": "1024Mi"}, 7, 4),
        ({"gpu-fraction": "0.333"}, 34, 22),  # 5455.8 MiB -> 22 blocks (5632 MiB)
    ],
)
def test_tencent_cores_and_memory_round_up(
    annotations: dict[str, str], core: int, blocks: int
) -> None:
    decision = plan_pod(_pod(annotations), "default", _policy("tencent-vcuda", "  gpuMemory: 16Gi"))
    assert _resources(decision) == {
        "tencent.com/vcuda-core": core,
        "tencent.com/vcuda-memory": blocks,
    }
    # Never less memory than asked.
    memory = _resources(decision)["tencent.com/vcuda-memory"] * 256
    fraction = annotations.get("gpu-fraction")
    asked = float(fraction) * 16384 if fraction else float(annotations["gpu-memory"][:-2])
    assert asked <= memory < asked + 256


def test_tencent_refuses_memory_under_one_block_and_needs_gpu_memory() -> None:
    policies = _policy("tencent-vcuda", "  gpuMemory: 16Gi")
    decision = plan_pod(_pod({"gpu-memory": "255Mi"}), "default", policies)
    assert "under one tencent.com/vcuda-memory block (256Mi)" in _denied(decision)
    with pytest.raises(PolicyError, match=r"mode tencent-vcuda .* set gpuMemory"):
        _policy("tencent-vcuda")


def test_tencent_core_limit_annotation_is_set_and_checked() -> None:
    policies = _policy("tencent-vcuda", "  gpuMemory: 16Gi\n  tencentVcuda: {coreLimit: 60}")
    decision = plan_pod(_pod({"gpu-fraction": "0.25"}), "default", policies)
    pod = mutated_pod(_pod({"gpu-fraction": "0.25"}), decision)  # type: ignore[arg-type]
    assert pod["metadata"]["annotations"]["tencent.com/vcuda-core-limit"] == "60"
    clash = _pod({"gpu-fraction": "0.25", "tencent.com/vcuda-core-limit": "90"})
    assert "annotation tencent.com/vcuda-core-limit=90 conflicts" in _denied(
        plan_pod(clash, "default", policies)
    )


@pytest.mark.parametrize(
    ("unit", "memory", "units"),
    [("GiB", "1Gi", 1), ("GiB", "1025Mi", 2), ("MiB", "1000", 1000), ("MiB", "1.5Gi", 1536)],
)
def test_aliyun_memory_rounds_up_in_the_configured_unit(unit: str, memory: str, units: int) -> None:
    policies = _policy("aliyun-gpushare", f"  aliyunGpushare: {{memoryUnit: {unit}}}")
    decision = plan_pod(_pod({"gpu-memory": memory}), "default", policies)
    assert _resources(decision) == {"aliyun.com/gpu-mem": units}


def test_aliyun_fraction_needs_gpu_memory() -> None:
    decision = plan_pod(_pod({"gpu-fraction": "0.5"}), "default", _policy("aliyun-gpushare"))
    assert "declares no gpuMemory" in _denied(decision)


def test_aliyun_memory_ask_without_gpu_memory_sets_no_framework_fraction() -> None:
    decision = plan_pod(_pod({"gpu-memory": "4Gi"}), "default", _policy("aliyun-gpushare"))
    assert isinstance(decision, Planned)
    assert decision.record["memory"] == "4096Mi" and "fraction" not in decision.record


@pytest.mark.parametrize(
    ("extra", "annotations", "resources"),
    [
        (
            "  gpuMemory: 80Gi",
            {"gpu-fraction": "0.3"},
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 24576, "nvidia.com/gpucores": 30},
        ),
        (  # no gpuMemory: a fraction is a memory percentage
            "",
            {"gpu-fraction": "0.3"},
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 30, "nvidia.com/gpucores": 30},
        ),
        (  # a memory ask without gpuMemory: MiB, and no core share to derive
            "",
            {"gpu-memory": "3000"},
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000},
        ),
        (
            "  gpuMemory: 80Gi\n  hami: {memory: percentage, cores: false}",
            {"gpu-memory": "20Gi"},
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25},
        ),
        (
            "  gpuMemory: 80Gi",
            {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "4"},
            {"nvidia.com/gpu": 4, "nvidia.com/gpumem": 40960, "nvidia.com/gpucores": 50},
        ),
    ],
)
def test_hami_resources(extra: str, annotations: dict[str, str], resources: dict[str, int]) -> None:
    decision = plan_pod(_pod(annotations), "default", _policy("hami", extra))
    assert _resources(decision) == resources


def test_hami_pods_go_to_hami_scheduler_and_skip_hamis_own_webhook() -> None:
    decision = plan_pod(_pod({"gpu-fraction": "0.5"}), "default", _policy("hami"))
    pod = mutated_pod(_pod({"gpu-fraction": "0.5"}), decision)  # type: ignore[arg-type]
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    assert pod["metadata"]["labels"] == {"hami.io/webhook": "ignore"}
    other = _pod({"gpu-fraction": "0.5"}, schedulerName="volcano")
    assert "schedulerName 'volcano' conflicts with 'hami-scheduler'" in _denied(
        plan_pod(other, "default", _policy("hami"))
    )
    kept = _policy("hami", "  hami: {skipHamiWebhook: false}")
    pod = mutated_pod(
        _pod({"gpu-fraction": "0.5"}), plan_pod(_pod({"gpu-fraction": "0.5"}), "default", kept)
    )  # type: ignore[arg-type]
    assert "labels" not in pod["metadata"]


def test_hami_whole_gpus_are_exclusive_as_hamis_webhook_makes_them() -> None:
    decision = plan_pod(_pod({"gpu-fraction": "2"}), "default", _policy("hami"))
    assert isinstance(decision, Planned)
    assert decision.record["resources"] == {"nvidia.com/gpu": 2, "nvidia.com/gpucores": 100}
    pod = mutated_pod(_pod({"gpu-fraction": "2"}), decision)
    assert pod["spec"]["schedulerName"] == "hami-scheduler"


def test_kai_hand_over_adds_no_resources_and_checks_what_kai_checks() -> None:
    policies = _policy("kai", "  kai: {queue: research}")
    decision = plan_pod(_pod({"gpu-fraction": "0.5"}), "default", policies)
    pod = mutated_pod(_pod({"gpu-fraction": "0.5"}), decision)  # type: ignore[arg-type]
    assert pod["spec"]["schedulerName"] == "kai-scheduler"
    assert pod["metadata"]["labels"] == {"kai.scheduler/queue": "research"}
    assert "resources" not in pod["spec"]["containers"][0]
    both = _pod({"gpu-fraction": "0.5", "gpu-memory": "40960"})
    assert "refuses gpu-fraction and gpu-memory on one pod" in _denied(
        plan_pod(both, "default", _policy("kai", "  gpuMemory: 80Gi"))
    )
    assert 'write "20480"' in _denied(plan_pod(_pod({"gpu-memory": "20Gi"}), "default", policies))
    assert "nvidia.com/gpu: 2" in _denied(
        plan_pod(_pod({"gpu-fraction": "2"}), "default", policies)
    )


def test_kai_reads_num_devices_as_kai_does() -> None:
    annotations = {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "3"}
    decision = plan_pod(_pod(annotations), "default", _policy("kai"))
    assert isinstance(decision, Planned) and decision.record["devices"] == 3
    bad = plan_pod(
        _pod({**annotations, "gpu-fraction-num-devices": "0"}), "default", _policy("kai")
    )
    assert isinstance(bad, Denied)
    assert bad.reasons == (
        'gpu-fraction-num-devices "0" is not a whole number above 0: write the number of GPUs '
        'that each get the share, such as "2".',
    )


def test_a_pod_bound_for_kai_scheduler_is_left_to_it_unless_the_policy_hands_over() -> None:
    pod = _pod({"gpu-fraction": "0.5"}, schedulerName="kai-scheduler")
    for mode, extra in (("hami", ""), ("tencent-vcuda", "  gpuMemory: 16Gi")):
        decision = plan_pod(pod, "default", _policy(mode, extra))
        assert isinstance(decision, Untouched)
        assert "kai-scheduler" in decision.reason
    assert isinstance(plan_pod(pod, "default", _policy("kai")), Planned)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("  mode: hami\n  pools: [{name: a, replicas: 2}]", "spec.pools: mode hami shares GPUs"),
        ("  mode: hami\n  awsVgpu: {vgpusPerGpu: 4}", "spec.awsVgpu: awsVgpu settings apply only"),
        (
            "  mode: time-slicing\n  pools: [{name: a, replicas: 2}]\n  hami: {cores: false}",
            "spec.hami",
        ),
        ("  mode: kai\n  resourceName: nvidia.com/gpu", "spec.resourceName: mode kai decides"),
        ("  mode: aws-vgpu\n  awsVgpu: {vgpusPerGpu: 49}", "49 is greater than the maximum of 48"),
        ("  mode: aliyun-gpushare\n  aliyunGpushare: {memoryUnit: KiB}", "'KiB' is not one of"),
    ],
)
def test_scheme_policy_errors_name_the_field(spec: str, message: str) -> None:
    text = (
        "apiVersion: gpushare.io/v1alpha1\nkind: GpuSharingPolicy\nmetadata: {name: p}\n"
        f"spec:\n  default: true\n{spec}\n"
    )
    with pytest.raises(PolicyError) as raised:
        load_policy_text(text, "p.yaml")
    assert message in str(raised.value)


def test_example_policies_load(tmp_path: Path) -> None:
    for name in ("aws-vgpu", "tencent-vcuda", "aliyun-gpushare", "hami", "kai", "aks-mps"):
        path = REPO_ROOT / "policies" / "examples" / f"{name}.yaml"
        policies = _policies(path)
        assert [p.name for p in policies.policies] == [name]
        assert with_policy_versions({}, path) == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("two", 'gpu-fraction-num-devices "two" is not a whole number above 0'),
        ("2.5", 'gpu-fraction-num-devices "2.5" is not a whole number above 0'),
        ("-1", 'gpu-fraction-num-devices "-1" is not a whole number above 0'),
        ("٣", 'gpu-fraction-num-devices "٣" is not a whole number above 0'),  # not ASCII
        ("9" * 40, 'gpu-fraction-num-devices "9999999999'),
        ("2048", 'gpu-fraction-num-devices "2048" asks for more GPUs than any node has'),
    ],
)
def test_num_devices_is_read_strictly(value: str, message: str) -> None:
    annotations = {"gpu-fraction": "0.5", "gpu-fraction-num-devices": value}
    decision = plan_pod(_pod(annotations), "default", _policy("kai"))
    assert isinstance(decision, Denied) and decision.code == 422
    assert decision.reasons[0].startswith(message)


def test_num_devices_with_whole_gpus_is_refused() -> None:
    annotations = {"gpu-fraction": "2", "gpu-fraction-num-devices": "2"}
    decision = plan_pod(_pod(annotations), "default", _policy("hami"))
    assert _denied(decision).startswith(
        'gpu-fraction-num-devices "2" gives a share on several GPUs, but gpu-fraction asks '
        "for whole GPUs"
    )
    one = {"gpu-fraction": "2", "gpu-fraction-num-devices": "1"}
    assert isinstance(plan_pod(_pod(one), "default", _policy("hami")), Planned)
