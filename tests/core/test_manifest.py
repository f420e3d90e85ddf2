"""Reading the manifests given to the CLI: files, directories, stdin; order, bounds, errors."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from webhook import manifest
from webhook.errors import ManifestError
from webhook.manifest import Document, manifest_files, parse_documents, read_manifests

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}


def _write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_yaml_and_json_files_are_read(tmp_path: Path) -> None:
    as_json = _write(tmp_path / "pod.json", json.dumps(POD))
    assert read_manifests([as_json]) == [Document(as_json, 0, 1, POD)]
    text = (
        "---\n# comment\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n"
    )
    as_yaml = _write(tmp_path / "pod.yaml", text)
    assert read_manifests([as_yaml]) == [Document(as_yaml, 0, 3, POD)]


def test_json_indented_with_tabs_is_json_not_yaml(tmp_path: Path) -> None:
    path = _write(tmp_path / "pod.json", json.dumps(POD, indent="\t"))
    assert read_manifests([path])[0].content == POD


def test_multi_document_files_keep_order_lines_and_skip_empty_documents(tmp_path: Path) -> None:
    text = "kind: A\n---\n---\n# only a comment\n---\nkind: B\n...\n---\n- 1\n- 2\n"
    path = _write(tmp_path / "all.yaml", text)
    assert read_manifests([path]) == [
        Document(path, 0, 1, {"kind": "A"}),
        Document(path, 1, 6, {"kind": "B"}),
        Document(path, 2, 9, [1, 2]),
    ]


def test_stdin_is_read_for_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(POD)))
    assert read_manifests(["-"]) == [Document("<stdin>", 0, 1, POD)]


def test_directories_are_read_in_name_order_and_recursively_only_with_r(tmp_path: Path) -> None:
    for name in ["b.yaml", "a.yml", "c.json", "notes.txt", ".hidden.yaml", "sub/d.yaml"]:
        _write(tmp_path / "tree" / name, '{"kind": "X"}')
    _write(tmp_path / "tree" / ".git" / "e.yaml", "kind: X\n")
    tree = tmp_path / "tree"
    assert manifest_files([str(tree)]) == [str(tree / n) for n in ("a.yml", "b.yaml", "c.json")]
    assert manifest_files([str(tree)], recursive=True) == [
        str(tree / n) for n in ("a.yml", "b.yaml", "c.json", "sub/d.yaml")
    ]
    single = _write(tmp_path / "z.yaml", "kind: Z\n")
    assert manifest_files([single, str(tree / "sub"), "-"]) == [
        single,
        str(tree / "sub" / "d.yaml"),
        "-",
    ]


def test_an_empty_directory_says_what_it_looked_for(tmp_path: Path) -> None:
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    _write(tmp_path / "empty" / "sub" / "x.yaml", "kind: X\n")
    with pytest.raises(ManifestError, match=r"holds no \.yaml, \.yml, \.json files \(add -R"):
        manifest_files([str(tmp_path / "empty")])
    assert manifest_files([str(tmp_path / "empty")], recursive=True)


def test_stdin_only_once() -> None:
    with pytest.raises(ManifestError, match="only once"):
        manifest_files(["-", "-"])


def test_timestamps_stay_strings_as_kubectl_sends_them(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.yaml", "kind: X\nmetadata: {annotations: {since: 2024-01-02}}\n")
    assert read_manifests([path])[0].content["metadata"]["annotations"]["since"] == "2024-01-02"


def test_anchors_and_aliases_within_bounds_are_fine() -> None:
    text = "env: &env [{name: A, value: x}]\nother: *env\n"
    (document,) = parse_documents("f.yaml", text)
    assert document.content["other"] == [{"name": "A", "value": "x"}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", None),
        (
            "kind: Pod\nspec: [\n",
            "f.yaml: expected the node content, but found '<stream end>' (line 3)",
        ),
        ("a: 1\na: 2\n", "f.yaml: has the key 'a' twice in one mapping (line 2)"),
        ('{"a": 1, "a": 2}', "f.yaml: has the key 'a' twice in one mapping (line 1)"),
        ("a: &a [*a]\n", "f.yaml: holds a YAML alias to itself (line 1)"),
        (
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n"
                for i in range(6)
            ),
            "f.yaml: expands its YAML aliases to more than 1,000,000 values (line 1)",
        ),
        ("a: " + "[" * 101 + "]" * 101 + "\n", "f.yaml: nests deeper than 100 levels (line 1)"),
    ],
    ids=["empty", "invalid", "duplicate", "json-duplicate", "self-alias", "bomb", "deep"],
)
def test_unusable_or_unbounded_yaml_is_refused_with_the_line(
    text: str, message: str | None
) -> None:
    if message is None:
        assert parse_documents("f.yaml", text) == []
        return
    with pytest.raises(ManifestError) as error:
        parse_documents("f.yaml", text)
    assert str(error.value) == message


@pytest.mark.parametrize(
    "text",
    [
        "{[a]: b}\n",
        "? {a: 1}\n: b\n",
        "!!set [a]\n",
        "!!map x\n",
        "a: \x1f\n",
        "!!python/name:os.system x\n",
    ],
)
def test_yaml_that_is_no_json_value_is_one_line_of_error(text: str) -> None:
    with pytest.raises(ManifestError) as error:
        parse_documents("f.yaml", text)
    assert str(error.value).startswith("f.yaml: ")
    assert "\n" not in str(error.value)


def test_deep_json_is_refused() -> None:
    text = '{"a": ' + "[" * 200 + "]" * 200 + "}"
    with pytest.raises(ManifestError, match=re.escape("f.json: nests deeper than 100 levels")):
        parse_documents("f.json", text)


def test_invalid_json_in_a_json_file_is_a_json_error() -> None:
    with pytest.raises(ManifestError, match=r"f.json: is not valid JSON: Expecting .*\(line 1\)"):
        parse_documents("f.json", '{"kind": }')


def test_a_chain_of_aliases_is_bounded_in_depth_without_exhausting_the_stack() -> None:
    lines = ["a0: &a0 [x]"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, 50)]
    (document,) = parse_documents("f.yaml", "\n".join(lines) + "\n")
    assert document.content["a49"][0][0][0] is not None
    lines += [f"a{i}: &a{i} [*a{i - 1}]" for i in range(50, 5000)]
    with pytest.raises(ManifestError, match=r"expands its YAML aliases deeper than 100 levels"):
        parse_documents("f.yaml", "\n".join(lines) + "\n")


def test_too_many_documents_or_bytes_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manifest, "MAX_DOCUMENTS", 3)
    many = _write(tmp_path / "many.yaml", "---\n".join(["kind: X\n"] * 4))
    with pytest.raises(ManifestError, match=re.escape("many.yaml: holds more than 3 documents")):
        read_manifests([many])
    two = _write(tmp_path / "two.yaml", "kind: X\n---\nkind: Y\n")
    with pytest.raises(ManifestError, match="the manifests hold more than 3 documents"):
        read_manifests([two, two])
    monkeypatch.setattr(manifest, "MAX_FILE_BYTES", 4 * 1024 * 1024)
    big = _write(tmp_path / "big.yaml", "kind: X\n" + "#" * (4 * 1024 * 1024))
    with pytest.raises(ManifestError, match=re.escape("big.yaml: is larger than 4 MiB")):
        read_manifests([big])


def test_unreadable_sources_name_themselves(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.yaml")
    with pytest.raises(ManifestError, match=f"^{missing}: cannot be read: No such file"):
        read_manifests([missing])
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00kind")
    with pytest.raises(ManifestError, match=re.escape("binary.yaml: is not UTF-8 text")):
        read_manifests([str(binary)])
    blank = _write(tmp_path / "blank.yaml", "# nothing\n")
    with pytest.raises(ManifestError, match=re.escape("blank.yaml: holds no documents")):
        read_manifests([blank])


def test_a_v1_list_counts_as_its_items(tmp_path: Path) -> None:
    """What `kubectl get deploy -o yaml` prints; kubectl apply reads it item by item."""
    listed = {"apiVersion": "v1", "kind": "List", "items": [POD, {"kind": "Service"}]}
    path = _write(tmp_path / "list.yaml", "kind: X\n---\n" + json.dumps(listed))
    assert read_manifests([path]) == [
        Document(path, 0, 1, {"kind": "X"}),
        Document(path, 1, 3, POD, 0),
        Document(path, 1, 3, {"kind": "Service"}, 1),
    ]
    other = {"apiVersion": "example.com/v1", "kind": "List", "items": [POD]}
    assert read_manifests([_write(tmp_path / "o.json", json.dumps(other))])[0].content == other
