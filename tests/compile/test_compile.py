"""``gpushare compile``: the documents it prints, and what it refuses, by field.

Whether the compiled policies do what the webhook does is for the real apiserver to say:
tests/e2e/test_compiled_policies.py.
"""

from __future__ import annotations

import dataclasses
import io
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from webhook import cli
from webhook.compile import CompileRefusedError, compile_policies, notes
from webhook.compile.common_shares import common_shares
from webhook.compile.plan import DENIAL_ANNOTATION
from webhook.compile.refusals import refusals
from webhook.core import DeviceVariables, load_policies
from webhook.core.policy.model import PolicySet, ServerMemory

REPO = Path(__file__).resolve().parents[2]
DEFAULT = REPO / "policies/default.yaml"


def _kinds(documents: list[dict]) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(d["kind"], d["metadata"]["name"]) for d in documents]


def test_the_default_policy_compiles_to_mutating_and_validating_policies() -> None:
    documents = compile_policies(load_policies(DEFAULT))
    assert _kinds(documents) == [
        ("MutatingAdmissionPolicy", "gpushare-default"),
        ("MutatingAdmissionPolicyBinding", "gpushare-default"),
        ("ValidatingAdmissionPolicy", "gpushare-denials"),
        ("ValidatingAdmissionPolicyBinding", "gpushare-denials"),
    ]
    assert {d["apiVersion"] for d in documents} == {"admissionregistration.k8s.io/v1"}
    mutating = documents[0]["spec"]
    # Never by default: the apiserver calls an IfNeeded policy again after its own change.
    assert mutating["reinvocationPolicy"] == "Never"
    assert mutating["failurePolicy"] == "Fail"
    assert [m["patchType"] for m in mutating["mutations"]] == ["JSONPatch"]
    conditions = {c["name"]: c["expression"] for c in mutating["matchConditions"]}
    # The default policy denies asking by hand and device variables set by hand: its
    # mutating policy refuses those pods too.
    # One condition (the apiserver evaluates each one for every pod create): the pod
    # filter first, then no mirror pod, then the namespaces the policy governs.
    assert set(conditions) == {"requests-gpu-share-or-asks-by-hand-or-sets-devices"}
    (joined,) = conditions.values()
    assert joined.index("gpu-fraction") < joined.index("kubernetes.io/config.mirror")
    assert joined.index("kubernetes.io/config.mirror") < joined.index("kube-system")
    patch = mutating["mutations"][0]["jsonPatch"]["expression"]
    # nodeSelector is atomic for ApplyConfiguration: set key by key with JSONPatch.
    assert "/spec/nodeSelector/" in patch and "gpushare.io~1applied" in patch
    assert "gpushare.io~1denied" in patch


def test_reinvocation_is_a_choice_and_only_the_two_kubernetes_values() -> None:
    policies = load_policies(DEFAULT)
    documents = compile_policies(policies, "IfNeeded")
    assert documents[0]["spec"]["reinvocationPolicy"] == "IfNeeded"
    # Only the reinvocation policy differs.
    never = compile_policies(policies, "Never")
    never[0]["spec"]["reinvocationPolicy"] = "IfNeeded"
    assert never == documents
    with pytest.raises(ValueError, match="Never, IfNeeded"):
        compile_policies(policies, "Always")


def test_bindings_keep_system_namespaces_and_opted_out_ones_away() -> None:
    documents = compile_policies(load_policies(DEFAULT))
    for binding in (d for d in documents if d["kind"].endswith("Binding")):
        expressions = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
        names = next(e for e in expressions if e["key"] == "kubernetes.io/metadata.name")
        assert {"kube-system", "gpushare-system"} <= set(names["values"])
        assert {"key": "gpushare.io/webhook", "operator": "NotIn", "values": ["exclude"]} in (
            expressions
        )


def test_the_denials_policy_reads_only_the_refusal_annotation() -> None:
    denials = compile_policies(load_policies(DEFAULT))[-2]["spec"]
    assert DENIAL_ANNOTATION in denials["matchConditions"][0]["expression"]
    assert [v["reason"] for v in denials["validations"]] == ["Invalid", "Forbidden"]
    assert "variables" not in denials  # no planning here: the mutating policy did it


def test_only_a_policy_denying_requests_by_hand_matches_pods_without_annotations() -> None:
    policies = load_policies(DEFAULT)
    enforcement = dataclasses.replace(
        policies.policies[0].enforcement, device_variables=DeviceVariables.ALLOW
    )
    allowing = dataclasses.replace(
        policies.policies[0], direct_requests="allow", enforcement=enforcement
    )
    documents = compile_policies(PolicySet((allowing,), policies.excluded_namespaces))
    conditions = {c["name"]: c["expression"] for c in documents[0]["spec"]["matchConditions"]}
    assert "nvidia.com/gpu.shared" not in conditions["requests-gpu-share"]
    assert "NVIDIA_VISIBLE_DEVICES" not in conditions["requests-gpu-share"]
    denying = compile_policies(policies)[0]["spec"]
    conditions = {c["name"]: c["expression"] for c in denying["matchConditions"]}
    either = conditions["requests-gpu-share-or-asks-by-hand-or-sets-devices"]
    assert "nvidia.com/gpu.shared" in either and "NVIDIA_VISIBLE_DEVICES" in either
    patch = denying["mutations"][0]["jsonPatch"]["expression"]
    assert "asks for nvidia.com/gpu.shared directly, which policy 'default'" in patch


def _with(**changes: object) -> PolicySet:
    policies = load_policies(DEFAULT)
    policy = dataclasses.replace(policies.policies[0], **changes)  # type: ignore[arg-type]
    return PolicySet((policy,), policies.excluded_namespaces)


def test_a_mode_without_compiled_form_is_refused_by_name() -> None:
    [refusal] = refusals(_with(mode="hami"))
    assert refusal.field == "mode"
    assert "mode 'hami' has no compiled form" in str(refusal)
    assert str(refusal).startswith(f"{DEFAULT}: policy 'default': spec.mode: ")


def test_the_pytorch_key_and_setting_server_flags_are_refused_by_field() -> None:
    policies = load_policies(REPO / "policies/examples/mps.yaml")
    with pytest.raises(CompileRefusedError) as refused:
        compile_policies(policies)
    fields = [r.field for r in refused.value.refusals]
    assert fields == ["frameworks.pytorch.memoryFraction", "inferenceServers.memory"]
    assert "keep the webhook" in str(refused.value)


def test_injected_env_colliding_with_a_limit_is_refused() -> None:
    policies = _with(
        inject=dataclasses.replace(
            load_policies(DEFAULT).policies[0].inject,
            env=(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50"),),
        )
    )
    [refusal] = refusals(policies)
    assert refusal.field == "inject.env"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in refusal.why


def test_notes_say_which_warnings_are_left_out() -> None:
    text = "\n".join(notes(load_policies(DEFAULT)))
    assert "spec.inferenceServers.memory: warn" in text
    ignoring = _with(
        inference_servers=dataclasses.replace(
            load_policies(DEFAULT).policies[0].inference_servers, memory=ServerMemory.IGNORE
        )
    )
    assert "inferenceServers" not in "\n".join(notes(ignoring))


def _run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_cli_prints_the_documents_and_the_notes() -> None:
    code, out, err = _run("compile", "--policies", str(DEFAULT))
    assert code == 0
    assert next(d["kind"] for d in yaml.safe_load_all(out)) == "MutatingAdmissionPolicy"
    assert err.startswith("note: ")


def test_cli_refusal_exits_2_naming_the_field(tmp_path: Path) -> None:
    code, out, err = _run("compile", "--policies", str(REPO / "policies/examples/mps.yaml"))
    assert code == 2 and out == ""
    assert "spec.frameworks.pytorch.memoryFraction" in err


def test_cli_writes_to_a_file(tmp_path: Path) -> None:
    target = tmp_path / "compiled.yaml"
    code, out, _ = _run("compile", "--policies", str(DEFAULT), "--out", str(target))
    assert code == 0 and out == ""
    assert len(list(yaml.safe_load_all(target.read_text()))) == 4


def test_common_shares_are_what_the_core_decides() -> None:
    policy = load_policies(DEFAULT).policies[0]
    shares = {share.text: share for share in common_shares(policy)}
    # The default policy: 0.05 .. 0.5, pools ts-half (2 slots) and ts-quarter (4).
    assert shares["0.5"].pool_index == 0 and shares["0.5"].formatted == "0.5"
    assert shares["0.25"].pool_index == 1 and shares["0.1"].pool_index == 1
    assert shares["0.3333"].formatted == "0.3333" and shares["0.3333"].pool_index == 0
    # Refused shares are left to the general path, which says why.
    assert "0.04" not in shares and "0.51" not in shares and "0.75" not in shares
    assert all(share.slots == 1 for share in shares.values())


def test_a_policy_without_common_shares_takes_the_general_path_only() -> None:
    policies = load_policies(DEFAULT)
    tiny = dataclasses.replace(policies.policies[0], min_fraction=0.001, max_fraction=0.002)
    documents = compile_policies(PolicySet((tiny,), policies.excluded_namespaces))
    names = {v["name"] for v in documents[0]["spec"]["variables"]}
    assert "common" not in names
    names = {v["name"] for v in compile_policies(policies)[0]["spec"]["variables"]}
    assert "common" in names


def test_the_usual_pod_evaluates_few_variables() -> None:
    """A common share on a clean pod reads the share's pool, slots and record inline
    (``cel_inlining.specialize``): its branch of the patch names only the variables the pod
    still decides (image, env names, framework knobs, tolerations, selector), not the
    request parsing and problem lists of the general path."""
    policy = compile_policies(load_policies(DEFAULT))[0]["spec"]
    patch = policy["mutations"][0]["jsonPatch"]["expression"]
    guard = '"gpu-fraction" in object.metadata.annotations && '
    usual = patch[patch.index(guard) :]
    usual = usual[: usual.index(" : (variables.bad.size() > 0")]
    named = set(re.findall(r"variables\.([A-Za-z0-9_]+)", usual))
    assert named and all(name.startswith("u_") for name in named), named
    declared = {v["name"]: v["expression"] for v in policy["variables"]}
    copies = {name for name in declared if name.startswith("u_")}
    assert named <= copies
    # The copies too read only copies: no variable of the general path is evaluated.
    for name in copies:
        used = set(re.findall(r"variables\.([A-Za-z0-9_]+)", declared[name]))
        assert used <= copies, (name, used - copies)
    assert len(copies) <= 14, sorted(copies)


def test_counting_shares_in_quota_is_refused_by_field() -> None:
    from webhook.core.policy.quota import QuotaSettings

    found = refusals(_with(quota=QuotaSettings(share_resource=True, showback_labels=True)))
    assert [r.field for r in found] == ["quota.shareResource", "quota.showbackLabels"]
    assert "keep the webhook" in str(found[0])
