"""``gpushare mutate`` / ``explain`` on what people keep in git: workloads, multi-document
files, directories and stdin; order, labels, exit codes, the JSON report, clear errors."""

from __future__ import annotations

import copy
import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.core.support import controller_pod, pod_template, run_cli
from webhook import cli
from webhook.core import builtin_kinds, load_policies, mutate, mutated_pod

# Kubernetes' own kinds (one template each, at one path).
KUBERNETES_KINDS = tuple(k for k in builtin_kinds() if k.group in {"", "apps", "batch"})

POLICIES = Path(__file__).resolve().parent / "workload_corpus" / "policies.yaml"


def deployment(
    name: str = "train", fraction: str | float = "0.5", **template_spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "research"},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": {"gpu-fraction": fraction}},
                "spec": {"containers": [{"name": "main", "image": "python:3.12"}], **template_spec},
            },
        },
    }


def pod(name: str = "p", fraction: str = "0.25") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"gpu-fraction": fraction}},
        "spec": {"containers": [{"name": "main", "image": "python:3.12"}]},
    }


SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {}}


def write(path: Path, *docs: Any) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(list(docs), sort_keys=False), encoding="utf-8")
    return str(path)


def run(*args: str, stdin: str | None = None) -> tuple[int, str, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        if stdin is not None:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr("sys.stdin", io.StringIO(stdin))
                code = cli.main(list(args))
        else:
            code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue().splitlines()


def mutate_cli(*args: str, stdin: str | None = None) -> tuple[int, str, list[str]]:
    return run("mutate", "--policies", str(POLICIES), *args, stdin=stdin)


def expected_template(document: dict[str, Any]) -> dict[str, Any]:
    """The template as its pods are admitted, from the core's pod verdict."""
    template = document["spec"]["template"]
    as_pod = controller_pod(template, "research", document["metadata"]["name"])
    verdict = mutate(as_pod, "research", load_policies(POLICIES))
    assert verdict.decision is not None
    admitted = mutated_pod(as_pod, verdict.decision)
    metadata = {
        k: v for k, v in admitted["metadata"].items() if k not in ("namespace", "generateName")
    }
    return {"metadata": metadata, "spec": admitted["spec"]}


# -- mutate ---------------------------------------------------------------------------------


def test_a_deployment_is_printed_with_its_template_as_the_pods_will_be(tmp_path: Path) -> None:
    document = deployment()
    code, out, err = mutate_cli("-f", write(tmp_path / "d.yaml", document))
    assert code == 0
    printed = yaml.safe_load(out)
    assert printed["spec"]["template"] == expected_template(document)
    assert {k: v for k, v in printed["spec"].items() if k != "template"} == {
        k: v for k, v in document["spec"].items() if k != "template"
    }
    assert err[:2] == [
        "Deployment/research/train: warning: each pod will get nvidia.com/gpu.shared: 1 in "
        'container "main"',
        "Deployment/research/train: warning: each pod's share: 0.5 of a GPU on pool ts-half, "
        "time-slicing, policy shared",
    ]


def test_documents_keep_their_order_others_pass_through_and_denied_ones_are_left_out(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "all.yaml", SERVICE, deployment("bad", "abc"), pod(), deployment())
    code, out, err = mutate_cli("-f", path)
    assert code == 3
    printed = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in printed] == ["Service", "Pod", "Deployment"]
    assert printed[0] == SERVICE
    assert printed[1]["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu.shared": "1"
    }
    assert [line.split(": ", 1)[0] for line in err] == [
        "Deployment/research/bad",
        *["Deployment/research/train"] * 4,
    ]
    assert err[0].startswith('Deployment/research/bad: denied: gpu-fraction "abc" is not')


def test_directories_sorted_recursively_with_r_repeated_f_and_stdin(tmp_path: Path) -> None:
    write(tmp_path / "tree" / "b.yaml", deployment("b"))
    write(tmp_path / "tree" / "a.yaml", deployment("a"), SERVICE)
    write(tmp_path / "tree" / "nested" / "c.yml", deployment("c"))
    (tmp_path / "tree" / "README.md").write_text("not a manifest")
    tree = str(tmp_path / "tree")
    extra = write(tmp_path / "z.json", pod("z"))
    stdin = yaml.safe_dump(pod("from-stdin"))

    _, out, _ = mutate_cli("-f", tree, "-o", "json")
    names = [e["name"] for e in json.loads(out)["documents"]]
    assert names == ["a", "web", "b"]

    _, out, _ = mutate_cli("-f", extra, "-f", tree, "-R", "-f", "-", "-o", "json", stdin=stdin)
    entries = json.loads(out)["documents"]
    assert [(Path(e["source"]).name, e["index"], e["name"]) for e in entries] == [
        ("z.json", 0, "z"),
        ("a.yaml", 0, "a"),
        ("a.yaml", 1, "web"),
        ("b.yaml", 0, "b"),
        ("c.yml", 0, "c"),
        ("<stdin>", 0, "from-stdin"),
    ]


def test_the_json_report_says_everything_ci_needs(tmp_path: Path) -> None:
    docs = [deployment(), SERVICE, deployment("bad", "0.9"), pod()]
    path = write(tmp_path / "all.yaml", *docs)
    code, out, err = mutate_cli("-f", path, "-o", "json")
    assert code == 3
    report = json.loads(out)
    assert report["apiVersion"] == "gpushare.io/v1alpha1" and report["kind"] == "MutateReport"
    assert report["summary"] == {"documents": 4, "allowed": 2, "denied": 1, "untouched": 1}
    good, service, bad, plain_pod = report["documents"]
    assert {k: good[k] for k in ("source", "index", "line", "kind", "namespace", "name")} == {
        "source": path,
        "index": 0,
        "line": 1,
        "kind": "Deployment",
        "namespace": "research",
        "name": "train",
    }
    assert (good["template"], good["verdict"], good["policy"]) == (
        "spec.template",
        "allowed",
        "shared",
    )
    assert jsonpatch.apply_patch(copy.deepcopy(docs[0]), good["patch"]) == good["result"]
    assert all(op["path"].startswith("/spec/template/") for op in good["patch"])
    assert good["warnings"] and good["reasons"] == []
    assert (
        service["verdict"] == "untouched"
        and service["untouched"] == "a Service has no pod template gpushare knows of"
    )
    assert service["result"] == SERVICE and service["namespace"] is None
    assert bad["verdict"] == "denied" and bad["result"] is None and bad["patch"] == []
    assert bad["reasons"] and bad["policy"] == "shared"
    assert plain_pod["namespace"] == "default" and plain_pod["template"] is None
    assert jsonpatch.apply_patch(copy.deepcopy(docs[3]), plain_pod["patch"]) == plain_pod["result"]
    # stderr still says it, one line per warning or reason, for people reading CI logs.
    assert sum(1 for line in err if ": denied: " in line) == len(bad["reasons"])


def test_patch_output_for_one_workload_is_a_patch_of_the_workload(tmp_path: Path) -> None:
    document = deployment()
    code, out, _ = mutate_cli("-f", write(tmp_path / "d.yaml", document), "-o", "patch")
    assert code == 0
    patched = jsonpatch.apply_patch(copy.deepcopy(document), json.loads(out))
    assert patched["spec"]["template"] == expected_template(document)


def test_patch_output_wants_exactly_one_document_with_a_pod(tmp_path: Path) -> None:
    # A Service beside the one pod: the pod's patch.
    code, out, _ = mutate_cli("-f", write(tmp_path / "two.yaml", pod(), SERVICE), "-o", "patch")
    assert code == 0
    assert json.loads(out) == mutate(pod(), "default", load_policies(POLICIES)).patch
    path = write(tmp_path / "pods.yaml", pod(), SERVICE, pod("q"))
    code, out, err = mutate_cli("-f", path, "-o", "patch")
    assert (code, out) == (2, "")
    assert err == [
        f"-o patch prints one JSON Patch, but the input holds 2 documents with a pod: "
        f"Pod/default/p ({path}:1), Pod/default/q ({path}:18): pass one of them, or use -o "
        "json (a report with each document's patch)."
    ]


def test_namespace_flag_applies_to_every_document(tmp_path: Path) -> None:
    path = write(tmp_path / "d.yaml", deployment(), pod())
    _, out, err = mutate_cli("-f", path, "-n", "ml-serving", "-o", "json")
    entries = json.loads(out)["documents"]
    assert [e["namespace"] for e in entries] == ["ml-serving", "ml-serving"]
    assert [e["policy"] for e in entries] == ["ml-mps", "ml-mps"]
    assert all(line.split("/")[1] == "ml-serving" for line in err)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            pod("p", 0.5),  # type: ignore[arg-type]
            "{path}:6: Pod/default/p: metadata.annotations.gpu-fraction is the number 0.5, "
            "which the apiserver refuses (annotation values are strings): quote it, "
            'gpu-fraction: "0.5"',
        ),
        (
            deployment("d", 1),
            "{path}:15: Deployment/research/d: spec.template.metadata.annotations.gpu-fraction "
            "is the number 1, which the apiserver refuses (annotation values are strings): "
            'quote it, gpu-fraction: "1"',
        ),
        (
            deployment("d", "0.5", containers={"name": "x"}),
            "{path}:1: Deployment/research/d: spec.template.spec.containers must be an array, "
            "not an object.",
        ),
    ],
    ids=["pod-number", "template-number", "template-shape"],
)
def test_what_the_apiserver_would_refuse_is_said_before_any_verdict(
    tmp_path: Path, document: dict[str, Any], message: str
) -> None:
    path = write(tmp_path / "bad.yaml", document)
    good = write(tmp_path / "good.yaml", deployment())
    code, out, err = mutate_cli("-f", good, "-f", path)
    assert (code, out) == (2, "")
    assert err == [message.format(path=path)]


def test_an_unquoted_number_from_yaml_text_gets_the_quote_it_message(tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations:\n    gpu-fraction: .5\n"
        "spec:\n  containers: [{name: a, image: x}]\n"
    )
    code, _, err = mutate_cli("-f", str(path))
    assert code == 2
    assert err[0].endswith('quote it, gpu-fraction: "0.5"')


def test_an_empty_or_unreadable_input_exits_2(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    code, _, err = mutate_cli("-f", str(tmp_path / "empty"))
    assert code == 2 and "holds no .yaml, .yml, .json files" in err[0]
    code, _, err = mutate_cli("-f", "-", stdin="")
    assert (code, err) == (
        2,
        ["<stdin>: holds no documents; pass a manifest with a Pod or workload"],
    )


def test_help_says_how_workloads_are_printed() -> None:
    run_ = run_cli("mutate", "--help")
    text = " ".join(run_.stdout.split())
    assert "with its pod templates as each of its pods will be admitted" in text
    assert "RayCluster" in text and "docs/workloads.md" in text
    assert "the webhook itself never changes templates" in text
    assert "-R, --recursive" in run_.stdout


# -- explain --------------------------------------------------------------------------------


def test_explain_names_each_document_and_exits_3_when_any_is_denied(tmp_path: Path) -> None:
    path = write(tmp_path / "all.yaml", SERVICE, deployment(), deployment("bad", "abc"))
    code, out, err = run("explain", "-f", path, "--policies", str(POLICIES))
    assert code == 3 and err == []
    blocks = out.split("\n\n")
    text = Path(path).read_text().splitlines()
    starts = [1] + [number + 2 for number, line in enumerate(text) if line == "---"]
    assert [block.splitlines()[0] for block in blocks] == [
        f"Service/web ({path}:{starts[0]})",
        f"Deployment/research/train ({path}:{starts[1]})",
        f"Deployment/research/bad ({path}:{starts[2]})",
    ]
    assert (
        blocks[0].splitlines()[1]
        == "decision: untouched (a Service has no pod template gpushare knows of)"
    )
    train = blocks[1].splitlines()
    assert train[1:4] == [
        "namespace: research",
        "pod template: spec.template, evaluated as the pods it creates",
        "decision: mutated",
    ]
    assert any(
        line.startswith("warning: each pod will get nvidia.com/gpu.shared") for line in train
    )
    assert blocks[2].splitlines()[3] == "decision: denied by policy 'shared'"


def test_explain_json_report_carries_the_explanation(tmp_path: Path) -> None:
    path = write(tmp_path / "d.yaml", deployment(), SERVICE)
    code, out, _ = run("explain", "-f", path, "--policies", str(POLICIES), "-o", "json")
    assert code == 0
    report = json.loads(out)
    assert report["kind"] == "ExplainReport"
    train, service = report["documents"]
    assert train["verdict"] == "allowed"
    assert any(line.startswith("placement: pool 'ts-half'") for line in train["explanation"])
    assert "patch" not in train and "result" not in train
    assert service["verdict"] == "untouched" and "explanation" not in service


def test_every_workload_kind_is_read(tmp_path: Path) -> None:
    """Each kind with a pod template, written as its template path says."""
    docs = []
    for kind in KUBERNETES_KINDS:
        inner: Any = deployment()["spec"]["template"]
        for key in reversed(kind.path):
            inner = {key: inner}
        api_version = {"apps": "apps/v1", "batch": "batch/v1", "": "v1"}[kind.group]
        docs.append(
            {"apiVersion": api_version, "kind": kind.kind, "metadata": {"name": "w"}, **inner}
        )
    _, out, _ = mutate_cli("-f", write(tmp_path / "all.yaml", *docs), "-o", "json")
    entries = json.loads(out)["documents"]
    assert [(e["kind"], e["template"], e["verdict"]) for e in entries] == [
        (k.kind, k.where, "allowed") for k in KUBERNETES_KINDS
    ]
    for kind, entry in zip(KUBERNETES_KINDS, entries, strict=True):
        template = pod_template(entry["result"], kind)
        assert template["spec"]["containers"][0]["resources"]["limits"] == {
            "nvidia.com/gpu.shared": "1"
        }


def test_a_directory_in_a_fresh_process(tmp_path: Path) -> None:
    """As a CI job runs it: exit 3, stderr lines prefixed, the report on stdout."""
    write(tmp_path / "m" / "app.yaml", deployment(), deployment("bad", "2.5"))
    run_ = run_cli("mutate", "-f", str(tmp_path / "m"), "--policies", str(POLICIES), "-o", "json")
    assert run_.returncode == 3
    assert json.loads(run_.stdout)["summary"]["denied"] == 1
    assert any(
        line.startswith("Deployment/research/bad: denied: ") for line in run_.stderr.splitlines()
    )


def test_kubectl_get_output_a_v1_list_is_read_item_by_item(tmp_path: Path) -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": [deployment("a"), deployment("b", "x")]}
    code, out, err = mutate_cli("-f", "-", "-o", "json", stdin=json.dumps(listed))
    assert code == 3
    entries = json.loads(out)["documents"]
    assert [(e["index"], e["item"], e["name"], e["verdict"]) for e in entries] == [
        (0, 0, "a", "allowed"),
        (0, 1, "b", "denied"),
    ]
    assert err[-1].startswith("Deployment/research/b: denied: ")


def test_kinds_without_apiversion_are_known_and_unknown_versions_are_said(tmp_path: Path) -> None:
    bare = deployment()
    del bare["apiVersion"]
    bare_pod = pod()
    del bare_pod["apiVersion"]
    old = {**deployment("old"), "apiVersion": "extensions/v1beta1"}
    _, out, _ = mutate_cli("-f", write(tmp_path / "m.yaml", bare, bare_pod, old), "-o", "json")
    entries = json.loads(out)["documents"]
    assert [e["verdict"] for e in entries] == ["allowed", "allowed", "untouched"]
    assert entries[2]["untouched"] == (
        "Deployment of apiVersion 'extensions/v1beta1' is not one gpushare checks"
    )


def test_a_pod_the_safety_net_would_refuse_is_denied_offline_too(tmp_path: Path) -> None:
    """An unannotated pod is the mutating webhook's to leave alone, but the validating checks
    (the safety net in the cluster) still refuse a device variable set by hand; `gpushare
    mutate` says so before it is applied, and passes a privileged one."""
    sneaky = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sneaky", "namespace": "team"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}],
                }
            ]
        },
    }
    privileged = copy.deepcopy(sneaky)
    privileged["metadata"]["name"] = "operator"
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump_all([sneaky, privileged]))

    code, out, errors = run("mutate", "-f", str(path))

    assert code == 3
    assert [doc["metadata"]["name"] for doc in yaml.safe_load_all(out)] == ["operator"]
    assert any(
        "Pod/team/sneaky: denied: CUDA_VISIBLE_DEVICES is set by hand in container 'c'" in e
        for e in errors
    )
