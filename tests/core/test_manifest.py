"""Reading the Pod manifest given to the CLI: YAML or JSON, one Pod, clear errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from webhook.errors import ManifestError
from webhook.manifest import read_pod

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pod.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_yaml_and_json_files_are_read(tmp_path: Path) -> None:
    assert read_pod(_write(tmp_path, json.dumps(POD))) == POD
    text = (
        "---\n# comment\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n"
    )
    assert read_pod(_write(tmp_path, text)) == POD


def test_stdin_is_read_for_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(POD)))
    assert read_pod("-") == POD


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds 0 documents; pass exactly one Pod manifest."),
        (json.dumps(POD) + "\n---\n" + json.dumps(POD), "holds 2 documents; pass exactly one Pod"),
        ("apiVersion: apps/v1\nkind: Deployment\n", "is a Deployment, not a Pod; pass a manifest"),
        ("- a\n- b\n", "is a list, not a Pod"),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n",
            "the Pod has no spec; add spec.containers.",
        ),
        ("kind: Pod\nspec: [\n", "is neither valid YAML nor JSON"),
    ],
)
def test_anything_but_one_pod_is_refused_with_the_file_name(
    tmp_path: Path, text: str, message: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ManifestError) as error:
        read_pod(path)
    assert str(error.value).startswith(f"{path}: ")
    assert message in str(error.value)


def test_stdin_errors_name_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("kind: Service\n"))
    with pytest.raises(ManifestError, match=r"^<stdin>: is a Service, not a Pod"):
        read_pod("-")
