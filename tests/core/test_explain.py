"""``gpushare explain``: which policy matched and why, and what each value came from."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.policy_versions import with_policy_versions
from webhook import cli
from webhook.core import load_policies

from .support import CORPUS_DIR, MPS_DAEMON_EXAMPLE, POLICIES_DIR, make_pod, run_cli


def _explain(capsys: pytest.CaptureFixture[str], case: str, *args: str) -> tuple[int, list[str]]:
    path = CORPUS_DIR / case / "pod.yaml"
    code = cli.main(["explain", "-f", str(path), *args])
    out, err = capsys.readouterr()
    assert err == ""
    header, *lines = out.splitlines()
    # Each document is explained after its label and where it was read: Kind/ns/name (file:line).
    assert header.startswith("Pod/") and header.endswith(f" ({path}:{_first_line(path)})")
    return code, lines


def _version(policy: str) -> str:
    """The bundled policy's version (a digest of its spec, recorded in each pod it mutates)."""
    return next(p.version for p in load_policies(POLICIES_DIR).policies if p.name == policy)


def _first_line(path: Path) -> int:
    """The line a manifest's document starts on, past leading comments and blank lines."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.strip() and line[0] not in "#-")


def test_explain_mutated_pod_names_policy_placement_and_each_value(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, lines = _explain(capsys, "jupyter-tensorflow-notebook", "--policies", str(POLICIES_DIR))
    assert code == 0
    # Lines about policy extras (tolerations, labels, ...) are left to the test below.
    extras = ("toleration", "label ", "annotation ", "volumeMount")
    assert [line for line in lines if not line.startswith(extras)] == [
        "namespace: jhub",
        "decision: mutated",
        "policy: no policy names namespace 'jhub', so the default policy 'default' "
        f"({POLICIES_DIR / 'default.yaml'}) applies",
        "placement: pool 'ts-half' (1/2 of a GPU per slot) takes 1 slot = 0.5 of a GPU >= 0.5 "
        "asked",
        "resources: nvidia.com/gpu.shared: 1 in limits and requests of container 'notebook'",
        # enforcement.driverMemoryLimit auto: a fraction of a pool of unknown memory.
        "driver memory limit: none, since pool 'ts-half' declares no gpuMemory and the share's "
        "size is unknown (enforcement.driverMemoryLimit: auto of policy 'default'; declare "
        "gpuMemory to have the driver cap the pod)",
        "nodeSelector: nvidia.com/gpu.replicas=2",
        "nodeSelector: nvidia.com/gpu.sharing-strategy=time-slicing",
        "env TF_FORCE_GPU_ALLOW_GROWTH=true (TensorFlow grows, never caps)",
        # Per container: which framework env was added or skipped, and why.
        "frameworks: container 'notebook' (jupyter/tensorflow-notebook:2023-10-20): tensorflow: "
        "TF_FORCE_GPU_ALLOW_GROWTH added (image matches 'jupyter/tensorflow-notebook:*'; "
        "version unknown, and releases before 1.12.0 ignore it)",
        "frameworks: container 'notebook' (jupyter/tensorflow-notebook:2023-10-20): jax: "
        "XLA_PYTHON_CLIENT_MEM_FRACTION not added: 'jupyter/tensorflow-notebook:2023-10-20' is "
        "none of its official images",
        "frameworks: container 'notebook' (jupyter/tensorflow-notebook:2023-10-20): pytorch: "
        "per_process_memory_fraction off (frameworks.pytorch.memoryFraction)",
        'recorded in annotation: {"container": "notebook", "fraction": "0.5", "mode": '
        f'"time-slicing", "policy": "default", "policyVersion": "{_version("default")}", '
        '"pool": "ts-half", "resource": "nvidia.com/gpu.shared", "slots": 1}',
        "patch: 6 operation(s)",
    ]


def test_explain_shows_how_mps_limits_were_computed(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _explain(capsys, "mps-daemon-inference", "--policies", str(MPS_DAEMON_EXAMPLE))
    assert code == 0
    assert (
        "placement: pool 'l4-mps' (1/10 of a GPU per slot) takes 3 slots = 0.3 of a GPU >= 0.3 "
        "asked" in lines
    )
    assert (
        "env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30 (floor(0.3 x 100 x overprovision 1), 1..100)"
        in lines
    )
    assert (
        "env CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=7372M (floor(0.3 x 24576Mi of pool 'l4-mps') on "
        "device 0)" in lines
    )
    assert "hostIPC: true (policy mpsDaemon.hostIPC)" in lines
    assert (
        lines[-1]
        == "warning: hostIPC set for the MPS daemon; it breaks the Baseline Pod Security level"
    )


def test_explain_marks_enforced_overwrites_and_kept_user_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    case = CORPUS_DIR / "triton-mps-overwrites-thread-percentage"
    code, lines = _explain(
        capsys, case.name, "--policies", str(POLICIES_DIR / "examples" / "mps.yaml")
    )
    assert code == 0
    assert (
        "env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 (floor(0.25 x 100 x overprovision 1), 1..100; "
        "enforced)"
    ) in lines
    assert lines[-1] == (
        "warning: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in 'tritonserver' set to 25 by policy (user "
        "value replaced)"
    )
    case = CORPUS_DIR / "team-policy-local-file"
    code, lines = _explain(
        capsys, case.name, "--policies", str(case / "policies.yaml"), "-n", "team-vision-dev"
    )
    assert "env XLA_PYTHON_CLIENT_PREALLOCATE: kept the value the user set" in lines


def test_explain_lists_the_policies_that_lost_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    case = CORPUS_DIR / "team-policy-local-file"
    code, lines = _explain(
        capsys, case.name, "--policies", str(case / "policies.yaml"), "-n", "team-vision-dev"
    )
    assert code == 0
    assert lines[2] == (
        f"policy: policy 'team-vision' ({case / 'policies.yaml'}) matches namespace "
        "'team-vision-dev' through ['team-vision-*'] with priority 5"
    )
    assert lines[3] == "  not chosen: fallback: default policy, not used because a policy matches"
    assert "env XLA_PYTHON_CLIENT_PREALLOCATE: kept the value the user set" in lines
    assert "env NVIDIA_DRIVER_CAPABILITIES=compute,utility (policy inject.env)" in lines


def test_explain_lists_every_value_the_policy_injects(capsys: pytest.CaptureFixture[str]) -> None:
    # Labels, annotations and tolerations from the policy and the MPS pipe volumeMount end
    # up on the pod too; explain should say where each came from, as it does for env.
    case = CORPUS_DIR / "team-policy-local-file"
    _, lines = _explain(
        capsys, case.name, "--policies", str(case / "policies.yaml"), "-n", "team-vision-dev"
    )
    text = "\n".join(lines)
    assert "gpushare.io/team" in text
    assert "cluster-autoscaler.kubernetes.io/safe-to-evict" in text
    _, lines = _explain(capsys, "whole-gpus-two", "--policies", str(POLICIES_DIR))
    assert any("toleration" in line for line in lines)
    _, lines = _explain(capsys, "mps-daemon-inference", "--policies", str(MPS_DAEMON_EXAMPLE))
    assert any("volumeMount" in line for line in lines)


def test_explain_already_mutated_pod_says_nothing_changes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Mutated by the policy version served now (the file leaves the version out).
    source = CORPUS_DIR / "already-mutated-notebook" / "pod.yaml"
    pod = with_policy_versions(yaml.safe_load(source.read_text(encoding="utf-8")), POLICIES_DIR)
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod), encoding="utf-8")
    code = cli.main(["explain", "-f", str(path), "--policies", str(POLICIES_DIR)])
    out, _ = capsys.readouterr()
    _, *lines = out.splitlines()
    assert code == 0
    assert lines[1] == "decision: mutated"
    assert lines[-1] == "patch: 0 operation(s) (already mutated: nothing to change)"
    assert "env TF_FORCE_GPU_ALLOW_GROWTH: kept the value the user set" in lines


def test_explain_denied_pod_exits_3_and_lists_every_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, lines = _explain(capsys, "deny-several-reasons", "--policies", str(POLICIES_DIR))
    reasons = (CORPUS_DIR / "deny-several-reasons" / "denied.txt").read_text().splitlines()
    assert code == 3
    assert lines == [
        "namespace: research",
        "decision: denied by policy 'default'",
        *(f"  - {reason}" for reason in reasons),
    ]


def test_explain_untouched_pods_say_why(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _explain(capsys, "kube-system-untouched", "--policies", str(POLICIES_DIR))
    assert code == 0
    assert lines == [
        "namespace: kube-system",
        "decision: untouched (namespace 'kube-system' is excluded from GPU sharing)",
        "warning: gpu-fraction ignored: namespace 'kube-system' is excluded from GPU sharing",
    ]
    code, lines = _explain(capsys, "no-annotation-untouched", "--policies", str(POLICIES_DIR))
    assert (code, lines) == (
        0,
        [
            "namespace: default",
            "decision: untouched (the pod has no gpu-fraction or gpu-memory annotation)",
        ],
    )


def test_explain_reads_stdin_in_a_fresh_process(tmp_path: Path) -> None:
    pod = make_pod({"gpu-fraction": "0.25"}, namespace="team-a")
    run = run_cli("explain", "-f", "-", "--policies", str(POLICIES_DIR), stdin=yaml.safe_dump(pod))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[:3] == ["Pod/team-a/pod (<stdin>:1)", "namespace: team-a", "decision: mutated"]
    assert (
        "placement: pool 'ts-quarter' (1/4 of a GPU per slot) takes 1 slot = 0.25 of a GPU >= "
        "0.25 asked" in lines
    )
