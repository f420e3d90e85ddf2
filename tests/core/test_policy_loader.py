"""Policy files → PolicySet, or errors that read ``file: yaml.path: problem (line N)``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import jsonschema
import pytest
import yaml
from jsonschema import Draft202012Validator

from webhook import cli
from webhook.core.policy.loader import load_policies, load_policy_text, load_policy_texts
from webhook.core.policy.model import (
    Allocation,
    DirectRequests,
    Mode,
)
from webhook.errors import PolicyError

from .support import MPS_DAEMON_EXAMPLE, MPS_EXAMPLE, POLICIES_DIR, run_cli

HEADER = """\
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata:
  name: team
spec:
"""


def _policy(spec: str, header: str = HEADER) -> str:
    """A policy document whose spec body starts on line 6."""
    return header + textwrap.indent(textwrap.dedent(spec).strip("\n"), "  ") + "\n"


def _problems(text: str, source: str = "team.yaml") -> list[str]:
    with pytest.raises(PolicyError) as error:
        load_policy_text(text, source)
    assert str(error.value) == "\n".join(error.value.problems)
    return error.value.problems


VALID_SPEC = """\
default: true
mode: time-slicing
pools:
  - name: half
    replicas: 2
"""


# -- valid policies ---------------------------------------------------------------------------


def test_bundled_default_policy_loads_with_its_documented_values() -> None:
    policies = load_policies(POLICIES_DIR)
    assert [p.name for p in policies.policies] == ["default"]
    policy = policies.policies[0]
    assert policy.default
    assert policy.mode is Mode.TIME_SLICING
    assert policy.resource_name == "nvidia.com/gpu.shared"
    assert policy.allocation is Allocation.REPLICA_CLASS
    assert (policy.min_fraction, policy.max_fraction) == (0.05, 0.5)
    assert [(p.name, p.replicas) for p in policy.pools] == [("ts-half", 2), ("ts-quarter", 4)]
    assert policy.headroom.fraction == pytest.approx(0.02)
    assert policy.whole_gpus.resource_name == "nvidia.com/gpu"
    assert dict(policy.whole_gpus.node_selector) == {"nvidia.com/gpu.sharing-strategy": "none"}
    assert policy.direct_requests is DirectRequests.DENY
    assert policies.excluded_namespaces == {
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "gpushare-system",
        "gpushare-mps",
        "gpushare-node",
    }


def test_example_policies_load_with_memory_in_mib() -> None:
    mps = load_policies(MPS_EXAMPLE).policies[0]
    assert mps.mode is Mode.MPS
    assert {p.gpu_memory_mib for p in mps.pools} == {81920}
    assert mps.headroom.memory_mib == 1024
    assert mps.frameworks.pytorch.memory_fraction
    daemon = load_policies(MPS_DAEMON_EXAMPLE).policies[0]
    assert daemon.mode is Mode.MPS_DAEMON
    assert daemon.allocation is Allocation.COUNT
    assert daemon.pools[0].gpu_memory_mib == 24576
    assert daemon.pools[0].gpus_per_node == 1
    assert daemon.mps_daemon.host_ipc


def test_loading_a_directory_reads_yaml_and_yml_files_but_not_subfolders(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(_policy(VALID_SPEC), encoding="utf-8")
    (tmp_path / "b.yml").write_text(
        _policy(
            "match: {namespaces: [x]}\nmode: time-slicing\npools: [{name: q, replicas: 4}]"
        ).replace("name: team", "name: other"),
        encoding="utf-8",
    )
    (tmp_path / "notes.txt").write_text("not yaml: [", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.yaml").write_text("broken: [", encoding="utf-8")
    policies = load_policies(tmp_path)
    assert sorted(p.name for p in policies.policies) == ["other", "team"]
    assert policies.sources == (str(tmp_path / "a.yaml"), str(tmp_path / "b.yml"))


def test_settings_replace_the_default_exclusions_but_kube_system_stays_excluded() -> None:
    settings = textwrap.dedent(
        """\
        apiVersion: gpushare.io/v1alpha1
        kind: GpuSharingSettings
        metadata: {name: settings}
        spec:
          excludeNamespaces: [infra-*]
        ---
        """
    )
    policies = load_policy_text(settings + _policy(VALID_SPEC))
    assert policies.excluded_namespaces == {"infra-*", "kube-system"}


def test_multi_document_file_loads_every_policy() -> None:
    second = _policy(
        "match: {namespaces: [a]}\nmode: time-slicing\npools: [{name: q, replicas: 4}]"
    )
    text = _policy(VALID_SPEC) + "---\n" + second.replace("name: team", "name: team-a")
    assert [p.name for p in load_policy_text(text).policies] == ["team", "team-a"]


# -- errors: file, YAML path, bad value, line --------------------------------------------------


def test_replicas_below_two_names_path_value_and_line() -> None:
    text = _policy(
        """\
        default: true
        mode: time-slicing
        pools:
          - name: one
            replicas: 1
        """
    )
    assert _problems(text) == [
        "team.yaml: spec.pools[0].replicas: 1 is less than the minimum of 2 (line 10)"
    ]


def test_mode_typo_lists_the_accepted_modes() -> None:
    text = _policy(VALID_SPEC.replace("time-slicing", "timeslicing"))
    assert _problems(text) == [
        "team.yaml: spec.mode: 'timeslicing' is not one of time-slicing, mps, mps-daemon, dra, "
        "aws-vgpu, tencent-vcuda, aliyun-gpushare, hami, kai (line 7)"
    ]


def test_unknown_field_names_the_field_and_lists_the_allowed_ones() -> None:
    text = _policy(VALID_SPEC + "replica: 3\n")
    [problem] = _problems(text)
    assert problem.startswith("team.yaml: spec")
    assert "unknown field 'replica';" in problem  # nothing at spec level is close to it
    assert "allowed fields: aliyunGpushare, allocation, awsVgpu, default," in problem


@pytest.mark.parametrize(
    ("typo", "field", "at"),
    [
        ("replica: 3", "replicas", "spec.pools[0].replica"),
        ("resource_name: nvidia.com/gpu", "resourceName", "spec.resource_name"),
        ("NodeSelector: {}", "nodeSelector", "spec.pools[0].NodeSelector"),
        ("priorty: 3", "priority", "spec.priorty"),
    ],
)
def test_unknown_field_says_which_known_field_was_meant(typo: str, field: str, at: str) -> None:
    extra = f"    {typo}\n" if at.startswith("spec.pools") else f"{typo}\n"
    spec = VALID_SPEC.replace("replicas: 2\n", "replicas: 2\n" + extra, 1)
    if not at.startswith("spec.pools"):
        spec = VALID_SPEC + extra
    [problem] = _problems(_policy(spec))
    assert problem.startswith(f"team.yaml: {at}: unknown field ")
    assert f"(did you mean {field!r}?)" in problem


def test_unknown_field_points_at_the_field_itself() -> None:
    # The path and line should be those of the unknown key (spec.replica, line 11), not of
    # the mapping that holds it (reported today as "spec" on line 6, i.e. "default: true").
    text = _policy(VALID_SPEC + "replica: 3\n")
    [problem] = _problems(text)
    assert problem.startswith("team.yaml: spec.replica: ")
    assert problem.endswith("(line 11)")


def test_min_above_max_names_both_values() -> None:
    text = _policy(VALID_SPEC + "fraction: {min: 0.6, max: 0.4}\n")
    assert _problems(text) == [
        "team.yaml: spec.fraction: min 0.6 is above max 0.4; min must not exceed max (line 11)"
    ]


def test_mps_without_gpu_memory_asks_for_it_on_each_pool() -> None:
    text = _policy(
        """\
        default: true
        mode: mps
        pools:
          - name: mps-2
            replicas: 2
          - name: mps-4
            replicas: 4
            gpuMemory: 40Gi
        """
    )
    assert _problems(text) == [
        "team.yaml: spec.pools[0]: mode mps limits each pod's device memory, which needs the GPU "
        "memory of this pool: set gpuMemory here or at spec.gpuMemory (e.g. 80Gi) (line 9)"
    ]


def test_mps_daemon_without_memory_limit_needs_no_gpu_memory() -> None:
    text = _policy(
        VALID_SPEC.replace("time-slicing", "mps-daemon") + "mps: {enforceMemoryLimit: false}\n"
    )
    assert load_policy_text(text).policies[0].mode is Mode.MPS_DAEMON


def test_count_allocation_needs_single_gpu_pools() -> None:
    text = _policy(
        """\
        default: true
        mode: time-slicing
        allocation: count
        pools:
          - name: single
            replicas: 4
            gpusPerNode: 1
          - name: multi
            replicas: 4
            gpusPerNode: 8
        """
    )
    assert _problems(text) == [
        "team.yaml: spec.pools[1]: allocation 'count' hands out several slots to one pod, which "
        "is only safe on nodes with exactly one GPU: set gpusPerNode: 1 on this pool or use "
        "allocation 'replica-class' (line 13)"
    ]


def test_count_allocation_with_mps_mode_is_refused() -> None:
    text = _policy(
        """\
        default: true
        mode: mps
        allocation: count
        gpuMemory: 80Gi
        pools:
          - {name: single, replicas: 4, gpusPerNode: 1}
        """
    )
    [problem] = _problems(text)
    assert problem.startswith("team.yaml: spec.allocation: the NVIDIA device plugin's MPS mode")
    assert problem.endswith("(line 8)")


def test_duplicate_pool_names_are_refused() -> None:
    text = _policy(VALID_SPEC + "  - name: half\n    replicas: 4\n")
    assert _problems(text) == [
        "team.yaml: spec.pools[1].name: pool name 'half' is used twice; pool names must be "
        "unique (line 11)"
    ]


def test_duplicate_policy_names_across_files_name_both_files() -> None:
    with pytest.raises(PolicyError) as error:
        load_policy_texts(
            [
                ("a.yaml", _policy(VALID_SPEC)),
                (
                    "b.yaml",
                    _policy(VALID_SPEC.replace("default: true", "default: true\npriority: 1")),
                ),
            ]
        )
    # (the line number is checked by test_problems_across_policies_name_the_line_too)
    [problem] = error.value.problems
    assert problem.startswith(
        "b.yaml: metadata.name: policy 'team' is also defined in a.yaml; policy names must be "
        "unique"
    )


def test_two_defaults_with_the_same_priority_are_refused() -> None:
    other = _policy(VALID_SPEC).replace("name: team", "name: fallback")
    with pytest.raises(PolicyError) as error:
        load_policy_texts([("a.yaml", _policy(VALID_SPEC)), ("b.yaml", other)])
    [problem] = error.value.problems
    assert problem.startswith(
        "b.yaml: spec.default: policies 'team' and 'fallback' are both default with priority 0, "
        "so neither wins: keep one default or give them different priorities"
    )


def test_two_defaults_with_different_priorities_load() -> None:
    other = _policy(VALID_SPEC + "priority: 1\n").replace("name: team", "name: fallback")
    policies = load_policy_texts([("a.yaml", _policy(VALID_SPEC)), ("b.yaml", other)])
    assert len(policies.policies) == 2


@pytest.mark.parametrize(
    ("case", "line"),
    [("duplicate-name", 4), ("two-defaults", 6)],
)
def test_problems_across_policies_name_the_line_too(case: str, line: int) -> None:
    # Every other problem ends with "(line N)"; duplicate names and competing defaults
    # should point at the second document's metadata.name / spec.default as well.
    if case == "two-defaults":
        second = _policy(VALID_SPEC).replace("name: team", "name: fallback")
    else:
        second = _policy(VALID_SPEC + "priority: 1\n")
    with pytest.raises(PolicyError) as error:
        load_policy_texts([("a.yaml", _policy(VALID_SPEC)), ("b.yaml", second)])
    assert error.value.problems[-1].endswith(f"(line {line})")


def test_policy_matching_no_namespace_and_not_default_is_refused() -> None:
    text = _policy(VALID_SPEC.replace("default: true", "default: false"))
    assert _problems(text) == [
        "team.yaml: spec.match: this policy matches no namespace: add match.namespaces, or "
        "default: true (line 6)"
    ]


def test_headroom_as_large_as_min_fraction_is_refused() -> None:
    text = _policy(VALID_SPEC + "fraction: {min: 0.05}\nheadroom: '5%'\n")
    [problem] = _problems(text)
    assert problem == (
        "team.yaml: spec.headroom: headroom '5%' leaves less than 0.001 of a GPU of the "
        "smallest allowed fraction (0.05); lower the headroom or raise fraction.min (line 12)"
    )


def test_headroom_as_memory_needs_pool_memory() -> None:
    text = _policy(VALID_SPEC + "headroom: 1Gi\n")
    [problem] = _problems(text)
    assert problem.startswith(
        "team.yaml: spec.headroom: a headroom given as memory needs gpuMemory"
    )


def test_whole_gpus_on_the_shared_resource_is_refused() -> None:
    text = _policy(VALID_SPEC + "wholeGpus: {resourceName: nvidia.com/gpu.shared}\n")
    [problem] = _problems(text)
    assert problem.startswith("team.yaml: spec.wholeGpus: whole GPUs and shared slots both use")
    assert problem.endswith("(line 11)")


def test_bad_gpu_memory_names_the_value() -> None:
    text = _policy(VALID_SPEC.replace("mode: time-slicing", "mode: mps\ngpuMemory: 80GB"))
    [problem, *_] = _problems(text)
    assert problem.startswith("team.yaml: spec.gpuMemory: '80GB' does not have the expected form")
    assert problem.endswith("(line 8)")


def test_wrong_api_version_and_kind_are_refused() -> None:
    text = (
        _policy(VALID_SPEC)
        .replace("gpushare.io/v1alpha1", "gpushare.io/v1")
        .replace("GpuSharingPolicy", "GpuPolicy")
    )
    assert _problems(text) == [
        "team.yaml: apiVersion: 'gpushare.io/v1' must be 'gpushare.io/v1alpha1' (line 1)",
        "team.yaml: kind: 'GpuPolicy' must be 'GpuSharingPolicy' (line 2)",
    ]


def test_missing_required_fields_are_named() -> None:
    text = _policy("default: true\n")
    problems = _problems(text)
    assert "team.yaml: spec: 'mode' is a required property (line 6)" in problems
    assert "team.yaml: spec: 'pools' is a required property (line 6)" in problems


def test_invalid_yaml_names_the_line() -> None:
    text = _policy(VALID_SPEC) + "  pools: [\n"
    [problem] = _problems(text)
    assert problem.startswith("team.yaml: <yaml>: is not valid YAML: ")
    assert problem.endswith("(line 12)")


def test_a_document_that_is_not_a_mapping_is_refused() -> None:
    assert _problems("- a\n- b\n") == [
        "team.yaml: <document>: is a list, expected a mapping with apiVersion "
        "gpushare.io/v1alpha1 and kind GpuSharingPolicy or GpuSharingSettings (line 1)"
    ]


def test_problems_in_several_documents_are_all_reported_with_document_numbers() -> None:
    first = _policy(VALID_SPEC.replace("replicas: 2", "replicas: 1"))
    second = _policy(VALID_SPEC.replace("time-slicing", "mps")).replace("name: team", "name: b")
    problems = _problems(first + "---\n" + second)
    assert problems == [
        "team.yaml: [document 1].spec.pools[0].replicas: 1 is less than the minimum of 2 (line 10)",
        "team.yaml: [document 2].spec.pools[0]: mode mps limits each pod's device memory, which "
        "needs the GPU memory of this pool: set gpuMemory here or at spec.gpuMemory (e.g. 80Gi) "
        "(line 20)",
    ]


def test_settings_alone_is_not_a_policy_set() -> None:
    text = (
        "apiVersion: gpushare.io/v1alpha1\nkind: GpuSharingSettings\nmetadata: {name: s}\n"
        "spec: {}\n"
    )
    assert _problems(text) == ["team.yaml: <files>: no GpuSharingPolicy found."]


def test_missing_path_and_empty_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as error:
        load_policies(tmp_path / "nope")
    assert error.value.problems == [f"{tmp_path / 'nope'}: <path>: no such file or directory."]
    with pytest.raises(PolicyError) as error:
        load_policies(tmp_path)
    assert error.value.problems[0].startswith(f"{tmp_path}: <directory>: holds no .yaml or .yml")


# -- gpushare policy check / schema ------------------------------------------------------------


def test_policy_check_accepts_the_bundled_policies(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        ["policy", "check", str(POLICIES_DIR), str(MPS_EXAMPLE), str(MPS_DAEMON_EXAMPLE)]
    )
    out, err = capsys.readouterr()
    assert code == 0
    assert err == ""
    # The paths together are one set, as the webhook would load them from one directory.
    assert out.splitlines() == [
        f"{POLICIES_DIR}, {MPS_EXAMPLE}, {MPS_DAEMON_EXAMPLE}: ok (3 policies: default, "
        "ml-mps, inference-mps-daemon)"
    ]


def test_policy_check_exits_2_with_one_line_per_problem_and_checks_every_path(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(_policy(VALID_SPEC.replace("time-slicing", "timeslicing").replace("2", "1")))
    missing = tmp_path / "missing.yaml"
    run = run_cli("policy", "check", str(bad), str(MPS_EXAMPLE))
    assert run.returncode == 2
    unloaded = "(the set does not load: the checks across policies run once these are fixed)"
    assert run.stderr.splitlines() == [
        f"{bad}: spec.mode: error: 'timeslicing' is not one of time-slicing, mps, mps-daemon, "
        "dra, aws-vgpu, tencent-vcuda, aliyun-gpushare, hami, kai (line 7)",
        f"{bad}: spec.pools[0].replicas: error: 1 is less than the minimum of 2 (line 10)",
        f"{bad}, {MPS_EXAMPLE}: 2 error(s), 0 warning(s) {unloaded}",
    ]
    assert run.stdout == ""  # one invalid file makes the set invalid
    run = run_cli("policy", "check", str(missing), str(MPS_EXAMPLE), str(tmp_path / "gone"))
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        f"{missing}: <path>: error: no such file or directory.",
        f"{tmp_path / 'gone'}: <path>: error: no such file or directory.",
        f"{missing}, {MPS_EXAMPLE}, {tmp_path / 'gone'}: 2 error(s), 0 warning(s) {unloaded}",
    ]


def test_policy_check_without_paths_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["policy", "check"])
    assert exit_info.value.code == 2
    assert "PATH" in capsys.readouterr().err


@pytest.fixture(scope="module")
def schema() -> dict[str, object]:
    run = run_cli("policy", "schema")
    assert run.returncode == 0, run.stderr
    parsed: dict[str, object] = json.loads(run.stdout)
    return parsed


def test_policy_schema_is_a_valid_draft_2020_12_schema(schema: dict[str, object]) -> None:
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("path", [POLICIES_DIR / "default.yaml", MPS_EXAMPLE, MPS_DAEMON_EXAMPLE])
def test_bundled_policy_documents_validate_against_the_schema(
    schema: dict[str, object], path: Path
) -> None:
    documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    assert documents
    for document in documents:
        Draft202012Validator(schema).validate(document)


@pytest.mark.parametrize(
    "change",
    [
        {"mode": "timeslicing"},
        {"replica": 3},
        {"pools": [{"name": "one", "replicas": 1}]},
        {"fraction": {"min": 0}},
        {"headroom": "lots"},
    ],
)
def test_schema_rejects_what_the_loader_rejects(
    schema: dict[str, object], change: dict[str, object]
) -> None:
    document = yaml.safe_load(_policy(VALID_SPEC))
    document["spec"].update(change)
    with pytest.raises(jsonschema.ValidationError):
        Draft202012Validator(schema).validate(document)
    with pytest.raises(PolicyError):
        load_policy_text(yaml.safe_dump(document))
