"""The workload corpus (tests/workload_corpus/<case>/): manifests as people keep them in git,
through ``gpushare mutate`` and through the validating webhook.

A case folder holds ``manifest.yaml`` (one or more documents), ``output.yaml`` (what
``gpushare mutate`` prints: every admitted document in order, workloads with their pod
template as the pods will be admitted; empty when nothing is) and ``stderr.txt`` (its exact
stderr lines). Every case runs with ``tests/workload_corpus/policies.yaml``. The command
exits 3 exactly when a line says ``denied``.
"""

from __future__ import annotations

import copy
import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml
from werkzeug.test import Client

from tests.core.support import assert_schema_valid, assert_valid_kubernetes_pod, pod_template
from tests.policy_versions import with_policy_versions
from webhook import cli
from webhook.core import api_group, workload_kind
from webhook.policy_store import PolicyStore
from webhook.server.app import create_app
from webhook.server.review import clean_warnings

CORPUS = Path(__file__).resolve().parent / "workload_corpus"
POLICIES = CORPUS / "policies.yaml"
CASES = sorted(p.name for p in CORPUS.iterdir() if p.is_dir())
FILES = {"manifest.yaml", "output.yaml", "stderr.txt"}


def documents(path: Path) -> list[Any]:
    """The documents of ``path``, applied records completed with their policy's version."""
    loaded = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    return with_policy_versions(loaded, POLICIES)  # type: ignore[no-any-return]


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def mutate(case: str, *extra: str) -> tuple[int, str, str]:
    manifest = str(CORPUS / case / "manifest.yaml")
    return run("mutate", "-f", manifest, "--policies", str(POLICIES), *extra)


def test_the_corpus_covers_every_kind_and_verdict() -> None:
    kinds = {d["kind"] for case in CASES for d in documents(CORPUS / case / "manifest.yaml")}
    assert {
        "Deployment",
        "StatefulSet",
        "DaemonSet",
        "ReplicaSet",
        "Job",
        "CronJob",
        "PodTemplate",
    } <= kinds
    stderr = "".join((CORPUS / case / "stderr.txt").read_text() for case in CASES)
    assert ": denied: " in stderr and ": warning: each pod will get " in stderr


@pytest.mark.parametrize("case", CASES)
def test_case_folder_is_well_formed(case: str) -> None:
    assert {p.name for p in (CORPUS / case).iterdir()} == FILES
    for document in documents(CORPUS / case / "manifest.yaml"):
        assert_schema_valid(document)


@pytest.mark.parametrize("case", CASES)
def test_mutate_prints_the_expected_documents_and_lines(case: str) -> None:
    code, out, err = mutate(case)
    expected_err = (CORPUS / case / "stderr.txt").read_text(encoding="utf-8").splitlines()
    assert err.splitlines() == expected_err
    assert code == (3 if any(": denied: " in line for line in expected_err) else 0)
    assert list(yaml.safe_load_all(out)) == documents(CORPUS / case / "output.yaml")


@pytest.mark.parametrize("case", CASES)
def test_the_output_differs_from_the_input_only_in_pod_templates(case: str) -> None:
    _, out, _ = mutate(case, "-o", "json")
    for entry in json.loads(out)["documents"]:
        if entry["verdict"] == "denied":
            assert entry["result"] is None and entry["patch"] == []
            continue
        original = documents(Path(entry["source"]))[entry["index"]]
        result = entry["result"]
        assert_schema_valid(result)
        kind = workload_kind(api_group(result.get("apiVersion")), result.get("kind"))
        if kind is None:
            assert result == original, "other documents pass through unchanged"
            continue
        assert_valid_kubernetes_pod(
            {"apiVersion": "v1", "kind": "Pod", **pod_template(result, kind)}
        )
        stripped = [copy.deepcopy(d) for d in (original, result)]
        for document in stripped:
            parent = document
            for key in kind.path[:-1]:
                parent = parent[key]
            del parent[kind.path[-1]]
        assert stripped[0] == stripped[1]


@pytest.mark.parametrize("case", CASES)
def test_mutating_the_output_again_changes_nothing(case: str, tmp_path: Path) -> None:
    expected = documents(CORPUS / case / "output.yaml")
    if not expected:
        return
    output = tmp_path / "output.yaml"  # with the versions the golden file leaves out
    output.write_text(yaml.safe_dump_all(expected, sort_keys=False), encoding="utf-8")
    code, out, _ = run("mutate", "-f", str(output), "--policies", str(POLICIES), "-o", "json")
    assert code == 0
    report = json.loads(out)["documents"]
    assert all(entry["patch"] == [] for entry in report)
    assert [entry["result"] for entry in report] == documents(output)


@pytest.fixture(scope="module")
def webhook() -> Client:
    return Client(create_app(PolicyStore.loaded(POLICIES)))


def validate(client: Client, document: dict[str, Any]) -> dict[str, Any]:
    group = api_group(document["apiVersion"])
    kind = workload_kind(group, document["kind"])
    assert kind is not None
    request = {
        "uid": "u",
        "kind": {"group": group, "version": "v1", "kind": kind.kind},
        "resource": {"group": group, "version": "v1", "resource": kind.resource},
        "namespace": document["metadata"]["namespace"],
        "name": document["metadata"]["name"],
        "operation": "CREATE",
        "object": document,
    }
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    answer: dict[str, Any] = client.post("/validate", json=body).get_json()["response"]
    return answer


@pytest.mark.parametrize("case", CASES)
def test_the_webhook_answers_each_workload_as_the_cli_says(case: str, webhook: Client) -> None:
    """At the workload's CREATE the validating webhook denies with the CLI's reasons after
    the template prefix, or allows with the CLI's warnings; it never patches."""
    _, out, _ = mutate(case, "-o", "json")
    for entry in json.loads(out)["documents"]:
        if entry["template"] is None:
            continue
        document = documents(Path(entry["source"]))[entry["index"]]
        answer = validate(webhook, document)
        assert "patch" not in answer
        if entry["verdict"] == "denied":
            assert answer["allowed"] is False
            prefix = f"pod template of {entry['kind']} '{entry['name']}':"
            assert answer["status"]["message"] == " ".join([prefix, *entry["reasons"]])
        else:
            assert answer["allowed"] is True
            assert answer.get("warnings", []) == clean_warnings(entry["warnings"])
