"""The golden corpus (tests/corpus/<case>/): each case run through the core and the CLI.

A case folder holds ``pod.yaml``; optionally ``policies`` (a path relative to the repository
root) or ``policies.yaml`` (default: the bundled ``policies/``), ``namespace`` (default: the
pod's, else ``default``) and ``warnings.txt`` (exact warnings, one per line); and exactly one
of ``expected.yaml`` (the admitted pod) or ``denied.txt`` (exact reasons, one per line).
"""

from __future__ import annotations

import copy
import io
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.policy_versions import with_policy_versions
from webhook import cli
from webhook.constants import (
    APPLIED_ANNOTATION,
)
from webhook.core.planning import (
    Planned,
)
from webhook.core.policy.loader import load_policies
from webhook.core.policy.model import PolicySet
from webhook.core.verdict import mutate, mutated_pod

from .support import (
    CORPUS_DIR,
    POLICIES_DIR,
    REPO_ROOT,
    assert_schema_valid,
    assert_valid_kubernetes_pod,
    run_cli,
)


@dataclass(frozen=True)
class Case:
    name: str
    folder: Path
    pod: dict[str, Any]
    policies_path: Path
    policies_arg: str | None  # what to pass as --policies (None: the CLI's default)
    namespace: str
    namespace_arg: str | None
    expected: dict[str, Any] | None
    denied: tuple[str, ...] | None
    warnings: tuple[str, ...]

    @property
    def untouched(self) -> bool:
        return self.expected == self.pod


def _lines(path: Path) -> tuple[str, ...]:
    return tuple(path.read_text(encoding="utf-8").splitlines()) if path.exists() else ()


def _load_case(folder: Path) -> Case:
    pod = yaml.safe_load((folder / "pod.yaml").read_text(encoding="utf-8"))
    if (folder / "policies").exists():
        policies_arg = (folder / "policies").read_text(encoding="utf-8").strip()
        policies_path = REPO_ROOT / policies_arg
    elif (folder / "policies.yaml").exists():
        policies_path = folder / "policies.yaml"
        policies_arg = str(policies_path)
    else:
        policies_path, policies_arg = POLICIES_DIR, None
    namespace_arg = None
    if (folder / "namespace").exists():
        namespace_arg = (folder / "namespace").read_text(encoding="utf-8").strip()
    namespace = namespace_arg or pod.get("metadata", {}).get("namespace") or "default"
    expected_file = folder / "expected.yaml"
    denied_file = folder / "denied.txt"
    return Case(
        name=folder.name,
        folder=folder,
        pod=with_policy_versions(pod, policies_path),
        policies_path=policies_path,
        policies_arg=policies_arg,
        namespace=namespace,
        namespace_arg=namespace_arg,
        expected=with_policy_versions(
            yaml.safe_load(expected_file.read_text(encoding="utf-8")), policies_path
        )
        if expected_file.exists()
        else None,
        denied=_lines(denied_file) if denied_file.exists() else None,
        warnings=_lines(folder / "warnings.txt"),
    )


CASES = [_load_case(folder) for folder in sorted(CORPUS_DIR.iterdir()) if folder.is_dir()]
ADMITTED = [c for c in CASES if c.expected is not None]
DENIED = [c for c in CASES if c.denied is not None]
MUTATED = [c for c in ADMITTED if not c.untouched]


def _ids(cases: list[Case]) -> list[str]:
    return [c.name for c in cases]


@cache
def _policies(path: Path) -> PolicySet:
    return load_policies(path)


def _by_name(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


# -- the corpus itself ------------------------------------------------------------------------


def test_corpus_holds_every_case_the_issue_names() -> None:
    required = {
        "jupyter-tensorflow-notebook",
        "kubeflow-notebook-envfrom-istio",
        "triton-mps-overwrites-thread-percentage",
        "ray-worker-native-sidecar",
        "container-name-picks-second",
        "pytorch-alloc-conf-merged",
        "gpu-memory-20gi-mps",
        "mps-daemon-inference",
        "whole-gpus-two",
        "already-mutated-notebook",
        "no-annotation-untouched",
        "kube-system-untouched",
        "deny-fraction-abc",
        "deny-fraction-empty",
        "deny-fraction-zero",
        "deny-fraction-negative",
        "deny-fraction-one-and-a-half",
        "deny-fraction-percent",
        "deny-fraction-two-points",
        "deny-fraction-nan",
        "deny-fraction-inf",
        "deny-fraction-exponent",
        "deny-container-name-missing",
        "deny-container-name-is-init",
        "deny-fraction-below-policy-min",
        "deny-fraction-above-policy-max",
        "deny-container-asks-nvidia-gpu",
        "deny-annotations-disagree",
        "deny-node-selector-conflict",
        # issue 10: every container counts; gpu-memory in MiB and sized by GFD labels
        "gpu-memory-gfd-default-policy",
        "gpu-memory-bare-number-is-mib",
        "deny-sidecar-asks-nvidia-gpu",
        "deny-init-container-asks-nvidia-gpu",
        "deny-second-container-asks-gpu-kai",
        # issue 27: limits a workload cannot escape (the driver limit, hand-set variables)
        "driver-limit-time-slicing-by-product",
        "driver-limit-mps-hand-set-replaced",
        "driver-limit-required-nodes",
        "deny-device-variables-set-by-hand",
        "deny-hand-set-driver-limit",
    }
    assert required <= {c.name for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_case_folder_is_well_formed(case: Case) -> None:
    assert (case.expected is None) != (case.denied is None), "expected.yaml xor denied.txt"
    assert case.pod["kind"] == "Pod"
    assert case.policies_path.exists(), case.policies_path
    if case.denied is not None:
        assert case.denied, "denied.txt names no reason"
        assert not case.warnings, "denied cases carry no warnings file"
    allowed = {"pod.yaml", "policies", "policies.yaml", "namespace", "warnings.txt"}
    allowed |= {"expected.yaml", "denied.txt"}
    assert {p.name for p in case.folder.iterdir()} <= allowed


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_corpus_input_pod_is_a_valid_kubernetes_pod(case: Case) -> None:
    assert_schema_valid(case.pod)


# -- the core ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ADMITTED, ids=_ids(ADMITTED))
def test_core_admits_case_as_expected(case: Case) -> None:
    outcome = mutate(case.pod, case.namespace, _policies(case.policies_path))
    assert outcome.allowed, outcome.reasons
    assert outcome.warnings == case.warnings
    assert all(len(w) < 120 for w in outcome.warnings), "admission warnings must stay short"
    assert outcome.decision is not None
    assert mutated_pod(case.pod, outcome.decision) == case.expected


@pytest.mark.parametrize("case", DENIED, ids=_ids(DENIED))
def test_core_denies_case_with_expected_reasons(case: Case) -> None:
    outcome = mutate(case.pod, case.namespace, _policies(case.policies_path))
    assert not outcome.allowed
    assert outcome.reasons == case.denied
    assert outcome.patch == []
    assert outcome.code in (403, 422)


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_core_leaves_the_input_pod_unmodified(case: Case) -> None:
    pod = copy.deepcopy(case.pod)
    outcome = mutate(pod, case.namespace, _policies(case.policies_path))
    if outcome.decision is not None:
        mutated_pod(pod, outcome.decision)
    assert pod == case.pod


@pytest.mark.parametrize("case", ADMITTED, ids=_ids(ADMITTED))
def test_patch_applied_to_input_yields_expected_pod(case: Case) -> None:
    outcome = mutate(case.pod, case.namespace, _policies(case.policies_path))
    patched = jsonpatch.apply_patch(copy.deepcopy(case.pod), outcome.patch)
    assert patched == case.expected
    assert (outcome.patch == []) == case.untouched


@pytest.mark.parametrize("case", ADMITTED, ids=_ids(ADMITTED))
def test_expected_pod_mutated_again_yields_no_patch(case: Case) -> None:
    outcome = mutate(case.expected or {}, case.namespace, _policies(case.policies_path))
    assert outcome.allowed, outcome.reasons
    assert outcome.patch == []


@pytest.mark.parametrize("case", ADMITTED, ids=_ids(ADMITTED))
def test_expected_pod_is_a_valid_kubernetes_pod(case: Case) -> None:
    assert_valid_kubernetes_pod(case.expected or {})


@pytest.mark.parametrize("case", MUTATED, ids=_ids(MUTATED))
def test_mutation_touches_only_the_target_container(case: Case) -> None:
    outcome = mutate(case.pod, case.namespace, _policies(case.policies_path))
    assert isinstance(outcome.decision, Planned)
    record = outcome.decision.record
    assert json.loads(case.expected["metadata"]["annotations"][APPLIED_ANNOTATION]) == record  # type: ignore[index]
    before, after = case.pod["spec"], case.expected["spec"]  # type: ignore[index]
    assert after.get("initContainers") == before.get("initContainers")
    names = [c["name"] for c in before["containers"]]
    assert [c["name"] for c in after["containers"]] == names
    target = names.index(record["container"])
    for index, (old, new) in enumerate(zip(before["containers"], after["containers"], strict=True)):
        if index != target:
            assert new == old, f"container {old['name']} changed"
            continue
        changed = {k for k in {*old, *new} if old.get(k) != new.get(k)}
        # args / command: an inference server's memory flag (inferenceServers.memory: set).
        assert changed <= {"env", "resources", "volumeMounts", "args", "command"}
        if "command" in changed:
            assert len(new["command"]) == len(old["command"])  # a value replaced, no more
        old_env, new_env = old.get("env") or [], new.get("env") or []
        assert len({e["name"] for e in new_env[len(old_env) :]}) == len(new_env) - len(old_env)
        assert not {e["name"] for e in new_env[len(old_env) :]} & {e["name"] for e in old_env}
    spec_changes = {k for k in {*before, *after} if before.get(k) != after.get(k)}
    assert spec_changes <= {
        "containers",
        "nodeSelector",
        "affinity",
        "tolerations",
        "volumes",
        "hostIPC",
        "resourceClaims",  # the dra mode's claim
    }
    affinity_before, affinity_after = before.get("affinity") or {}, after.get("affinity") or {}
    assert {
        k
        for k in {*affinity_before, *affinity_after}
        if affinity_before.get(k) != affinity_after.get(k)
    } <= {"nodeAffinity"}
    assert {k for k in case.pod if case.pod[k] != case.expected.get(k)} <= {"metadata", "spec"}  # type: ignore[union-attr]


@pytest.mark.parametrize("case", MUTATED, ids=_ids(MUTATED))
def test_gpu_resource_requests_equal_limits_as_integer_strings(case: Case) -> None:
    outcome = mutate(case.pod, case.namespace, _policies(case.policies_path))
    assert isinstance(outcome.decision, Planned)
    record = outcome.decision.record
    container = next(
        c
        for c in case.expected["spec"]["containers"]
        if c["name"] == record["container"]  # type: ignore[index]
    )
    resources = container["resources"]
    if "claimTemplate" in record:  # the dra mode: a resource claim, no extended resource
        assert {"name": "gpushare-gpu"} in resources["claims"]
        return
    count = str(record.get("slots", record.get("gpus")))
    assert resources["limits"][record["resource"]] == count
    assert resources["requests"][record["resource"]] == count


# -- the CLI: every case in-process, the exit-code contract in fresh interpreters ---------------


def _cli_args(case: Case, *extra: str) -> list[str]:
    args = ["mutate", "-f", str(case.folder / "pod.yaml"), *extra]
    if case.policies_arg is not None:
        args += ["--policies", case.policies_arg]
    if case.namespace_arg is not None:
        args += ["--namespace", case.namespace_arg]
    return args


def _label(case: Case, namespace: str | None = None) -> str:
    """How the CLI names the case's pod at the start of each line: Pod/namespace/name."""
    metadata = case.pod["metadata"]
    name = metadata.get("name") or metadata.get("generateName")
    return f"Pod/{namespace or case.namespace}/{name}"


def _stderr_lines(case: Case) -> list[str]:
    label = _label(case)
    return [f"{label}: warning: {w}" for w in case.warnings] + [
        f"{label}: denied: {r}" for r in case.denied or ()
    ]


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_cli_main_mutate_exit_code_output_and_stderr(
    case: Case, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every case through ``gpushare mutate`` in-process (the subprocess runs are below)."""
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.delenv("GPUSHARE_POLICIES", raising=False)
    code = cli.main(_cli_args(case))
    out, err = capsys.readouterr()
    assert err.splitlines() == _stderr_lines(case)
    if case.denied is not None:
        assert code == 3
        assert out == ""
    else:
        assert code == 0
        assert yaml.safe_load(out) == case.expected


SUBPROCESS_CASES = [
    "triton-mps-overwrites-thread-percentage",
    "kube-system-untouched",
    "deny-fraction-nan",
]


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_cli_subprocess_mutate_exit_code_output_and_stderr(name: str) -> None:
    case = _by_name(name)
    run = run_cli(*_cli_args(case))
    assert run.stderr.splitlines() == _stderr_lines(case)
    if case.denied is not None:
        assert run.returncode == 3
        assert run.stdout == ""
    else:
        assert run.returncode == 0
        assert yaml.safe_load(run.stdout) == case.expected


@pytest.mark.parametrize(
    "name", ["triton-mps-overwrites-thread-percentage", "already-mutated-notebook"]
)
def test_cli_patch_output_is_the_json_patch_that_yields_expected(name: str) -> None:
    case = _by_name(name)
    # The pod as loaded (an already-mutated one carries the version its file leaves out).
    args = [
        a if a != str(case.folder / "pod.yaml") else "-" for a in _cli_args(case, "-o", "patch")
    ]
    run = run_cli(*args, stdin=yaml.safe_dump(case.pod))
    assert run.returncode == 0, run.stderr
    patch = json.loads(run.stdout)
    assert isinstance(patch, list)
    assert jsonpatch.apply_patch(copy.deepcopy(case.pod), patch) == case.expected
    assert (patch == []) == case.untouched


def test_cli_json_output_from_stdin_equals_expected_pod() -> None:
    case = _by_name("mps-daemon-inference")
    text = (case.folder / "pod.yaml").read_text(encoding="utf-8")
    args = ["mutate", "-f", "-", "-o", "json", "--policies", str(case.policies_path)]
    run = run_cli(*args, stdin=text)
    assert run.returncode == 0, run.stderr
    (entry,) = json.loads(run.stdout)["documents"]
    assert entry["result"] == case.expected
    assert entry["warnings"] == list(case.warnings)
    assert jsonpatch.apply_patch(copy.deepcopy(case.pod), entry["patch"]) == case.expected
    assert (entry["source"], entry["kind"], entry["verdict"]) == ("<stdin>", "Pod", "allowed")
    assert run.stderr.splitlines() == _stderr_lines(case)


def test_cli_reads_a_json_manifest_from_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    case = _by_name("jupyter-tensorflow-notebook")
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.delenv("GPUSHARE_POLICIES", raising=False)
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(case.pod)))
    assert cli.main(["mutate", "-f", "-", "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == case.expected


def test_cli_denial_from_stdin_exits_3_with_one_line_per_reason() -> None:
    case = _by_name("deny-several-reasons")
    run = run_cli("mutate", "-f", "-", stdin=(case.folder / "pod.yaml").read_text())
    assert run.returncode == 3
    assert run.stdout == ""
    assert run.stderr.splitlines() == _stderr_lines(case)
    assert len(run.stderr.splitlines()) == len(case.denied or ()) > 1


def test_cli_namespace_flag_overrides_the_manifest_namespace(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The Triton pod names ml-serving; the MPS example alone matches no "research" namespace.
    case = _by_name("triton-mps-overwrites-thread-percentage")
    assert cli.main([*_cli_args(case), "--namespace", "research"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"{_label(case, 'research')}: warning: gpu-fraction ignored: no policy matches namespace "
        "'research' and none is default"
    ]
    assert yaml.safe_load(out) == case.pod


def test_cli_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    run = run_cli("mutate")
    assert run.returncode == 2
    assert "the following arguments are required: -f/--file" in run.stderr
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["mutate", "-f", "pod.yaml", "-o", "xml"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'xml'" in capsys.readouterr().err


def test_cli_invalid_policy_file_exits_2_naming_file_and_yaml_path(tmp_path: Path) -> None:
    policy = tmp_path / "broken.yaml"
    policy.write_text(
        "apiVersion: gpushare.io/v1alpha1\n"
        "kind: GpuSharingPolicy\n"
        "metadata:\n"
        "  name: broken\n"
        "spec:\n"
        "  default: true\n"
        "  mode: time-slicing\n"
        "  pools:\n"
        "    - name: one\n"
        "      replicas: 1\n",
        encoding="utf-8",
    )
    pod = _by_name("jupyter-tensorflow-notebook").folder / "pod.yaml"
    run = run_cli("mutate", "-f", str(pod), "--policies", str(policy))
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.splitlines() == [
        f"{policy}: spec.pools[0].replicas: 1 is less than the minimum of 2 (line 10)"
    ]


def test_cli_unreadable_or_invalid_manifest_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.yaml"
    run = run_cli("mutate", "-f", str(missing))
    assert run.returncode == 2
    assert run.stderr.startswith(f"{missing}: cannot be read:")
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: Pod\nspec: [\n", encoding="utf-8")
    assert cli.main(["mutate", "-f", str(broken)]) == 2
    assert capsys.readouterr().err.startswith(f"{broken}: ")


def test_cli_without_policies_flag_uses_the_checkout_policies_from_any_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUSHARE_POLICIES", raising=False)
    case = _by_name("jupyter-tensorflow-notebook")
    assert cli.main(["mutate", "-f", str(case.folder / "pod.yaml")]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == case.expected


def test_cli_gpushare_policies_variable_picks_the_policies(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    case = _by_name("gpu-memory-20gi-mps")
    monkeypatch.setenv("GPUSHARE_POLICIES", str(case.policies_path))
    assert cli.main(["mutate", "-f", str(case.folder / "pod.yaml")]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == case.expected
