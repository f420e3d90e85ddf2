"""Defects of the CLI's edges, each pinned: a manifest given to ``policy check``, ``mutate -o
patch`` on a file with one pod among other documents, ``compile``'s multi-line refusal, and
the line of an unquoted annotation value."""

from __future__ import annotations

import io
import json
import textwrap
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from webhook import cli
from webhook.manifest import Document, key_lines, list_items, parse_documents, read_manifests

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO / "policies" / "default.yaml"
POLICIES = REPO / "tests" / "workload_corpus" / "policies.yaml"

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: trainer
  namespace: research
  labels: {app: trainer}
spec:
  replicas: 2
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  selector:
    matchLabels: {app: trainer}
  template:
    metadata:
      labels: {app: trainer}
      annotations:
        gpu-fraction: "0.5"
    spec:
      serviceAccountName: trainer
      securityContext: {runAsNonRoot: true, fsGroup: 1000}
      volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
      containers:
        - name: main
          image: python:3.12
          args: [train.py, --epochs, "10"]
          ports: [{containerPort: 8080, name: http}]
          env: [{name: MODE, value: train}]
          volumeMounts: [{name: data, mountPath: /data}]
          readinessProbe: {httpGet: {path: /healthz, port: http}, periodSeconds: 5}
          resources: {requests: {cpu: "2", memory: 8Gi}}
"""
NAMESPACE = "apiVersion: v1\nkind: Namespace\nmetadata: {name: research}\n"
SERVICE = (
    "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: research}\n"
    "spec: {ports: [{port: 80}], selector: {app: trainer}}\n"
)


def run(*args: str, stdin: str | None = None) -> tuple[int, list[str], list[str]]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        if stdin is None:
            code = cli.main(list(args))
        else:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr("sys.stdin", io.StringIO(stdin))
                code = cli.main(list(args))
    return code, out.getvalue().splitlines(), err.getvalue().splitlines()


def write(path: Path, *documents: str) -> str:
    path.write_text("---\n".join(documents), encoding="utf-8")
    return str(path)


# -- 1. policy check given a manifest -------------------------------------------------------


def _manifest_line(path: str) -> str:
    return (
        f"{path}: <file>: error: this is a Deployment manifest, not a gpushare policy file: "
        f"check it with `gpushare mutate -f {path}`"
    )


def test_a_deployment_among_policies_is_one_error_line_and_the_rest_is_checked(
    tmp_path: Path,
) -> None:
    deployment = write(tmp_path / "deployment.yaml", DEPLOYMENT)
    code, out, err = run("policy", "check", str(DEFAULT), deployment)
    assert code == 2
    assert err == [_manifest_line(deployment)]
    assert out == [f"{DEFAULT}, {deployment}: 1 error(s), 0 warning(s) (1 policy: default)"]


def test_a_deployment_alone_is_one_error_line_and_a_summary(tmp_path: Path) -> None:
    deployment = write(tmp_path / "deployment.yaml", DEPLOYMENT)
    code, out, err = run("policy", "check", deployment)
    assert (code, out) == (2, [])
    assert err == [
        _manifest_line(deployment),
        f"{deployment}: 1 error(s), 0 warning(s) (no policy file left to check)",
    ]


def test_a_deployment_in_a_policy_directory(tmp_path: Path) -> None:
    (tmp_path / "default.yaml").write_text(DEFAULT.read_text())
    deployment = write(tmp_path / "trainer.yaml", DEPLOYMENT)
    code, out, err = run("policy", "check", str(tmp_path))
    assert code == 2
    assert err == [_manifest_line(deployment)]
    assert out == [f"{tmp_path}: 1 error(s), 0 warning(s) (1 policy: default)"]


def test_manifests_without_pods_and_several_kinds(tmp_path: Path) -> None:
    service = write(tmp_path / "service.yaml", SERVICE)
    bundle = write(tmp_path / "bundle.yaml", NAMESPACE, SERVICE, DEPLOYMENT)
    code, out, err = run("policy", "check", str(DEFAULT), service, bundle)
    assert code == 2
    assert err == [
        f"{service}: <file>: error: this is a Service manifest, not a gpushare policy file: "
        "policies have apiVersion gpushare.io/v1alpha1 and kind GpuSharingPolicy",
        f"{bundle}: <file>: error: this holds Kubernetes manifests (Namespace, Service, "
        f"Deployment), not a gpushare policy file: check it with `gpushare mutate -f {bundle}`",
    ]
    assert out == [f"{DEFAULT}, {service}, {bundle}: 2 error(s), 0 warning(s) (1 policy: default)"]


def test_a_deployment_inside_a_policy_file_names_its_document(tmp_path: Path) -> None:
    mixed = write(tmp_path / "mixed.yaml", DEFAULT.read_text(), DEPLOYMENT)
    documents = [d for d in yaml.safe_load_all(DEFAULT.read_text()) if d]
    line = 1 + DEFAULT.read_text().count("\n") + 1  # after the policies and the `---`
    code, _, err = run("policy", "check", mixed)
    assert code == 2
    assert err[0] == (
        f"{mixed}: [document {len(documents) + 1}]: error: is a Deployment manifest, not a "
        f"gpushare policy: keep it out of policy files (check it with `gpushare mutate -f "
        f"{mixed}`); nothing else in this file was checked (line {line})"
    )
    assert len(err) == 2 and err[1].startswith(f"{mixed}: 1 error(s), 0 warning(s) (")


def test_every_line_of_a_set_that_does_not_load_is_an_error_then_a_summary(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: gpushare.io/v1alpha1\nkind: GpuSharingPolicy\nmetadata: {name: a}\n"
        "spec:\n  default: true\n  mode: timeslicing\n  replica: 2\n"
        "  fraction: {min: 0.1, max: 0.5}\n  pools: [{name: p, replicas: 2}]\n"
    )
    missing = tmp_path / "missing.yaml"
    code, out, err = run("policy", "check", str(bad))
    assert (code, out) == (2, [])
    *problems, summary = err
    assert [problem.partition(": error: ")[0] for problem in problems] == [
        f"{bad}: spec.replica",
        f"{bad}: spec.mode",
    ]
    assert problems[0].endswith("(line 7)") and "unknown field 'replica'" in problems[0]
    assert problems[1].endswith("(line 6)") and "'timeslicing' is not one of" in problems[1]
    assert summary == (
        f"{bad}: 2 error(s), 0 warning(s) (the set does not load: the checks across policies "
        "run once these are fixed)"
    )
    code, out, err = run("policy", "check", str(missing))
    assert (code, out) == (2, [])
    assert err == [
        f"{missing}: <path>: error: no such file or directory.",
        f"{missing}: 1 error(s), 0 warning(s) (the set does not load: the checks across "
        "policies run once these are fixed)",
    ]


def test_a_clean_set_and_a_policy_with_findings_are_as_before(tmp_path: Path) -> None:
    code, out, err = run("policy", "check", str(DEFAULT))
    assert (code, err) == (0, [])
    assert out == [f"{DEFAULT}: ok (1 policy: default)"]


# -- 2. mutate -o patch with one pod among other documents ----------------------------------


def test_patch_of_the_one_workload_among_a_namespace_and_a_service(tmp_path: Path) -> None:
    bundle = write(tmp_path / "bundle.yaml", NAMESPACE, SERVICE, DEPLOYMENT)
    alone = write(tmp_path / "alone.yaml", DEPLOYMENT)
    code, out, _ = run("mutate", "--policies", str(POLICIES), "-f", bundle, "-o", "patch")
    assert code == 0
    patch = json.loads("\n".join(out))
    assert patch and all(op["path"].startswith("/spec/template/") for op in patch)
    _, alone_out, _ = run("mutate", "--policies", str(POLICIES), "-f", alone, "-o", "patch")
    assert json.loads("\n".join(alone_out)) == patch


def test_patch_refuses_two_documents_with_pods_naming_them(tmp_path: Path) -> None:
    other = DEPLOYMENT.replace("name: trainer\n", "name: second\n", 1)
    bundle = write(tmp_path / "bundle.yaml", NAMESPACE, DEPLOYMENT, SERVICE, other)
    code, out, err = run("mutate", "--policies", str(POLICIES), "-f", bundle, "-o", "patch")
    assert (code, out) == (2, [])
    assert err == [
        f"-o patch prints one JSON Patch, but the input holds 2 documents with a pod: "
        f"Deployment/research/trainer ({bundle}:5), Deployment/research/second ({bundle}:"
        f"{5 + DEPLOYMENT.count(chr(10)) + SERVICE.count(chr(10)) + 2}): pass one of them, or "
        "use -o json (a report with each document's patch)."
    ]


def test_patch_refuses_documents_without_a_pod(tmp_path: Path) -> None:
    bundle = write(tmp_path / "bundle.yaml", NAMESPACE, SERVICE)
    code, out, err = run("mutate", "--policies", str(POLICIES), "-f", bundle, "-o", "patch")
    assert (code, out) == (2, [])
    assert err == [
        "-o patch prints the JSON Patch of a Pod or workload, but none of the input's 2 "
        "documents has a pod: pass one, or use -o json (a report with each document's patch)."
    ]


# -- 3. compile's refusal: every line prefixed ----------------------------------------------


def test_every_line_of_a_compile_refusal_is_prefixed() -> None:
    code, out, err = run("compile", "--policies", str(REPO / "policies/examples/mps.yaml"))
    assert (code, out) == (2, [])
    assert len(err) == 2  # the example has two fields CEL cannot do as the webhook does
    assert all(line.startswith(f"error: {REPO / 'policies/examples/mps.yaml'}: ") for line in err)
    assert any("spec.frameworks.pytorch.memoryFraction" in line for line in err)


# -- 4. the line of an unquoted value is the line of its key --------------------------------


UNQUOTED = """\
apiVersion: v1
kind: Service
metadata: {name: web}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: trainer
  namespace: research
  labels:
    team: 7
spec:
  template:
    metadata:
      labels: {app: trainer}
      annotations:
        other: "x"
        gpu-fraction: 0.5
    spec:
      containers: [{name: main, image: python:3.12}]
"""


def _unquoted_lines(source: str, label_line: int, annotation_line: int) -> list[str]:
    label = "Deployment/research/trainer"
    return [
        f"{source}:{label_line}: {label}: metadata.labels.team is the number 7, which the "
        'apiserver refuses (label values are strings): quote it, team: "7"',
        f"{source}:{annotation_line}: {label}: spec.template.metadata.annotations.gpu-fraction "
        "is the number 0.5, which the apiserver refuses (annotation values are strings): quote "
        'it, gpu-fraction: "0.5"',
    ]


def test_an_unquoted_value_is_reported_on_its_own_line(tmp_path: Path) -> None:
    path = write(tmp_path / "unquoted.yaml", UNQUOTED)
    code, out, err = run("mutate", "--policies", str(POLICIES), "-f", path)
    assert (code, out) == (2, [])
    assert err == _unquoted_lines(path, 11, 18)


def test_stdin_gives_the_same_lines() -> None:
    code, _, err = run("mutate", "--policies", str(POLICIES), "-f", "-", stdin=UNQUOTED)
    assert code == 2
    assert err == _unquoted_lines("<stdin>", 11, 18)


def test_json_gives_the_lines_of_its_keys_tabs_and_all(tmp_path: Path) -> None:
    deployment = list(yaml.safe_load_all(UNQUOTED))[1]
    text = json.dumps(deployment, indent="\t")
    path = tmp_path / "unquoted.json"
    path.write_text("\n" + text)
    lines = text.splitlines()
    team = 1 + next(n for n, line in enumerate(lines, 1) if '"team"' in line)
    fraction = 1 + next(n for n, line in enumerate(lines, 1) if '"gpu-fraction"' in line)
    code, _, err = run("mutate", "--policies", str(POLICIES), "-f", str(path))
    assert code == 2
    assert err == _unquoted_lines(str(path), team, fraction)


def test_a_list_item_gives_the_line_within_the_list(tmp_path: Path) -> None:
    listed = "apiVersion: v1\nkind: List\nitems:\n" + textwrap.indent(
        "- " + UNQUOTED.split("---\n")[1].replace("\n", "\n  ").rstrip() + "\n", ""
    )
    path = write(tmp_path / "list.yaml", listed)
    code, _, err = run("mutate", "--policies", str(POLICIES), "-f", path)
    assert code == 2
    assert err == _unquoted_lines(path, 10, 17)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a: 1\n---\n  kind: Pod\n  metadata:\n    annotations: {a: 1,\n      x: 2}\n", 6),
        ("--- {kind: Pod,\n  metadata: {annotations: {x: 1}}}\n--- {b: 1}\n", 2),
        ("a: 1\r\n---\r\nkind: Pod\r\nmetadata:\r\n  annotations:\r\n    x: 1\r\n", 6),
        ("# c\n--- !!map\nkind: Pod\nmetadata:\n  annotations:\n    'x': 1\n...\n", 6),
        ("kind: Pod\nmetadata:\n  annotations:\n    y: |\n      a\n      b\n    x: 1\n", 7),
    ],
    ids=["indented", "flow", "crlf", "tagged", "after-a-block-scalar"],
)
def test_key_lines_finds_the_key_in_the_documents_own_text(text: str, line: int) -> None:
    *_, document = parse_documents("m.yaml", text)
    if document.content.get("kind") != "Pod":
        document = parse_documents("m.yaml", text)[0]
    path = ("metadata", "annotations", "x")
    assert key_lines(document, [path, ("metadata", "nope"), ()]) == [
        line,
        key_lines(document, [("metadata",)])[0],
        document.line,
    ]


def test_key_lines_without_a_text_falls_back_to_the_documents_line(tmp_path: Path) -> None:
    document = Document("x.yaml", 0, 4, {"metadata": {"annotations": {"x": 1}}})
    assert key_lines(document, [("metadata", "annotations", "x")]) == [4]
    assert key_lines(document, []) == []
    # Documents still compare by what they hold and where, not by the text they came from.
    path = write(tmp_path / "pod.yaml", "kind: Pod\n")
    assert read_manifests([path]) == [Document(path, 0, 1, {"kind": "Pod"})]
    [item] = list_items(
        parse_documents("l.yaml", "kind: List\napiVersion: v1\nitems:\n- kind: Pod\n")[0]
    )
    assert key_lines(item, [("kind",)]) == [4]
