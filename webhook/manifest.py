"""Reading the manifests given to the offline CLI: files, directories and stdin, with bounds.

What people keep in git: multi-document YAML, JSON, folders of both. ``read_manifests``
turns ``-f`` arguments into ``Document``s in a stable order (arguments in the order given;
a directory's files sorted by name; ``recursive`` descends into subdirectories, sorted too,
never into hidden ones or through links to directories) and keeps each document's file,
position and line, so every verdict and error can say where it came from; ``key_lines``
finds the line of a key within a document (reading that document again, on demand). A v1
``List`` (``kubectl get -o yaml``) counts as its items.

Reading is bounded, since a manifest may come from anywhere in a CI pipeline: files over
8 MiB, more than 10,000 documents, nesting deeper than 100 levels, YAML aliases that expand
past a million nodes or refer to themselves, and duplicate keys (kubectl refuses them too)
are refused with ``ManifestError``, naming the file and line. Timestamps stay strings, as
they do when kubectl turns YAML into JSON.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from webhook.errors import ManifestError

STDIN = "-"
STDIN_NAME = "<stdin>"
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_DOCUMENTS = 10_000
MAX_DEPTH = 100
MAX_EXPANDED_NODES = 1_000_000


@dataclass(frozen=True)
class Origin:
    """The text a document was read from and where in it the document begins: what
    ``key_lines`` reads again to say on which line a key is written."""

    text: str  # the whole file's (shared by its documents, not copied)
    start: int  # the offset of the line the document begins on
    end: int  # the offset where it ends
    line: int  # the line it begins on, from 1
    json: bool = False


@dataclass(frozen=True)
class Document:
    """One document of a manifest: where it came from and what it holds."""

    source: str  # the file's path as found, or <stdin>
    index: int  # its position among the file's documents, from 0 (empty ones not counted)
    line: int  # the line it starts on, from 1
    content: Any
    item: int | None = None  # its position in the items of a v1 List document
    origin: Origin | None = field(default=None, repr=False, compare=False)


def list_items(document: Document) -> list[Document]:
    """A ``kind: List`` (what ``kubectl get -o yaml`` prints) as one document per item, as
    kubectl apply reads it; any other document as itself."""
    content = document.content
    if (
        not isinstance(content, dict)
        or content.get("kind") != "List"
        or content.get("apiVersion") != "v1"
        or not isinstance(content.get("items"), list)
    ):
        return [document]
    return [
        Document(document.source, document.index, document.line, item, number, document.origin)
        for number, item in enumerate(content["items"])
    ]


class ManifestLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with this module's bounds; timestamps are left as strings."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            self._aliases += 1
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise ComposerError(None, None, f"nests deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Node | None:
        self._aliases = 0
        node: Node | None = super().compose_document()
        if node is not None and self._aliases:
            _check_expansion(node)
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConstructorError(
                    None, None, f"has the key {key!r} twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_timestamp_text(self, node: ScalarNode) -> str:
        """A timestamp as written: JSON has no dates, and kubectl sends the text."""
        return str(self.construct_scalar(node))


ManifestLoader.add_constructor(
    "tag:yaml.org,2002:timestamp", ManifestLoader.construct_timestamp_text
)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_expansion(root: Node) -> None:
    """Refuse a document whose aliases expand past the bounds (values, depth) or refer to
    themselves. Iterative (post-order, memoized by node): chains of aliases cannot exhaust
    the stack."""
    sizes: dict[int, tuple[int, int]] = {}  # node -> (values, depth) once expanded
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            on_path.discard(key)
            below = [sizes[id(child)] for child in _children(node)]
            values = 1 + sum(size for size, _ in below)
            depth = 1 + max((depth for _, depth in below), default=0)
            if values > MAX_EXPANDED_NODES or depth > MAX_DEPTH:
                limit = (
                    f"to more than {MAX_EXPANDED_NODES:,} values"
                    if values > MAX_EXPANDED_NODES
                    else f"deeper than {MAX_DEPTH} levels"
                )
                raise ComposerError(
                    None, None, f"expands its YAML aliases {limit}", root.start_mark
                )
            sizes[key] = (values, depth)
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise ComposerError(None, None, "holds a YAML alias to itself", node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        stack += [(child, False) for child in _children(node) if id(child) not in sizes]


def _line_of(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    return f" (line {mark.line + 1})" if mark is not None else ""


def _yaml_documents(name: str, text: str) -> Iterator[Document]:
    loader: ManifestLoader | None = None
    index = 0
    try:
        loader = ManifestLoader(text)  # refuses characters YAML does not allow
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            content = loader.construct_document(node)
            if content is None:
                continue
            mark = node.start_mark
            origin = Origin(text, mark.index - mark.column, node.end_mark.index, mark.line + 1)
            yield Document(name, index, mark.line + 1, content, origin=origin)
            index += 1
    except yaml.MarkedYAMLError as error:
        problem = error.problem or error.context or "is not valid YAML"
        raise ManifestError(f"{name}: {problem}{_line_of(error)}") from None
    except yaml.YAMLError as error:
        text = " ".join(str(error).split())
        raise ManifestError(f"{name}: is not valid YAML: {text}") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as error:
        # SafeLoader's constructors raise these on some tags and keys ("!!set", "{[a]: b}").
        text = " ".join(str(error).split()) or type(error).__name__
        raise ManifestError(f"{name}: holds YAML that is no JSON value ({text})") from None
    except RecursionError:
        raise ManifestError(f"{name}: nests deeper than {MAX_DEPTH} levels") from None
    finally:
        if loader is not None:
            loader.dispose()


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"has the key {key!r} twice in one object")
        result[key] = value
    return result


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack += [(child, level + 1) for child in item.values()]
        elif isinstance(item, list):
            stack += [(child, level + 1) for child in item]
    return deepest


def _json_document(name: str, text: str) -> Document:
    try:
        content = json.loads(text, object_pairs_hook=_refuse_duplicates)
    except json.JSONDecodeError as error:
        raise ManifestError(
            f"{name}: is not valid JSON: {error.msg} (line {error.lineno})"
        ) from None
    except ValueError as error:
        raise ManifestError(f"{name}: {error}") from None
    except RecursionError:
        raise ManifestError(f"{name}: nests deeper than {MAX_DEPTH} levels") from None
    if _depth(content) > MAX_DEPTH:
        raise ManifestError(f"{name}: nests deeper than {MAX_DEPTH} levels")
    start = len(text) - len(text.lstrip())
    origin = Origin(text, 0, len(text), 1, json=True)
    return Document(name, 0, text.count("\n", 0, start) + 1, content, origin=origin)


def parse_documents(name: str, text: str) -> list[Document]:
    """The documents of one manifest text: JSON when it is one JSON value, else YAML."""
    if text.lstrip().startswith(("{", "[")):
        try:
            return [_json_document(name, text)]
        except ManifestError:
            if name.endswith(".json"):
                raise
    documents = []
    for document in _yaml_documents(name, text):
        documents.append(document)
        if len(documents) > MAX_DOCUMENTS:
            raise ManifestError(f"{name}: holds more than {MAX_DOCUMENTS:,} documents")
    return documents


def key_lines(document: Document, paths: Sequence[Sequence[object]]) -> list[int]:
    """The line (from 1) each path's last mapping key or sequence item is written on (a
    path from the document's root; a List item's from the item), or its nearest written
    parent's; the document's line where its text cannot be read again (one built by hand).

    The document is composed again from its ``Origin``, once for all the paths: reading
    keeps nothing per key, so only a document found wanting costs the extra reading.
    """
    origin = document.origin
    if origin is None or not paths:
        return [document.line for _ in paths]
    text = origin.text[origin.start : origin.end]  # this document alone: a copy of its own
    loader: ManifestLoader | None = None
    try:
        # Whitespace is all a tab may be in JSON outside strings; YAML wants spaces.
        loader = ManifestLoader(text.replace("\t", " ") if origin.json else text)
        root = loader.get_node() if loader.check_node() else None
        prefix = () if document.item is None else ("items", document.item)
        if root is None:
            return [document.line for _ in paths]
        return [origin.line + _line_at(root, (*prefix, *path)) for path in paths]
    except (yaml.YAMLError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return [document.line for _ in paths]  # read once already; never worse than before
    finally:
        if loader is not None:
            loader.dispose()


def _line_at(node: Node, path: Sequence[object]) -> int:
    """The line (from 0) of ``path``'s last key or item found below ``node``."""
    line: int = node.start_mark.line
    for part in path:
        child: Node | None = None
        if isinstance(node, MappingNode):
            for key, value in node.value:  # no key twice: refused when read
                if isinstance(key, ScalarNode) and key.value == str(part):
                    child, line = value, key.start_mark.line
        elif isinstance(node, SequenceNode) and isinstance(part, int):
            child = node.value[part] if 0 <= part < len(node.value) else None
            line = line if child is None else child.start_mark.line
        if child is None:
            break
        node = child
    return line


def _read_text(source: str) -> tuple[str, str]:
    """(name, text) of a file or stdin, refusing more than ``MAX_FILE_BYTES``."""
    name = STDIN_NAME if source == STDIN else source
    try:
        if source == STDIN:
            # Bytes where there is a buffer; a replaced stdin (tests, embedding) gives text.
            stream = getattr(sys.stdin, "buffer", None)
            data = (
                stream.read(MAX_FILE_BYTES + 1)
                if stream is not None
                else sys.stdin.read(MAX_FILE_BYTES + 1).encode("utf-8")
            )
        else:
            with open(source, "rb") as file:
                data = file.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise ManifestError(f"{name}: cannot be read: {error.strerror or error}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ManifestError(f"{name}: is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    try:
        return name, data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ManifestError(f"{name}: is not UTF-8 text ({error.reason})") from None


def _directory_files(directory: Path, recursive: bool) -> list[str]:
    files: list[str] = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if recursive else []
        files += [
            os.path.join(root, name)
            for name in sorted(names)
            if name.endswith(MANIFEST_SUFFIXES) and not name.startswith(".")
        ]
    return files


def manifest_files(sources: Sequence[str], *, recursive: bool = False) -> list[str]:
    """The files ``-f`` arguments name, in the order to read them ("-" for stdin)."""
    if list(sources).count(STDIN) > 1:
        raise ManifestError("-f - (stdin) can be given only once.")
    files: list[str] = []
    for source in sources:
        path = Path(source)
        if source == STDIN or not path.is_dir():
            files.append(source)
            continue
        found = _directory_files(path, recursive)
        if not found:
            where = "or below it" if recursive else "(add -R to read its subdirectories)"
            raise ManifestError(f"{source}: holds no {', '.join(MANIFEST_SUFFIXES)} files {where}")
        files += found
    return files


def read_manifests(sources: Sequence[str], *, recursive: bool = False) -> list[Document]:
    """Every document of every source, in order; ``ManifestError`` says what is wrong."""
    documents: list[Document] = []
    for source in manifest_files(sources, recursive=recursive):
        documents += [
            item
            for document in parse_documents(*_read_text(source))
            for item in list_items(document)
        ]
        if len(documents) > MAX_DOCUMENTS:
            raise ManifestError(f"the manifests hold more than {MAX_DOCUMENTS:,} documents")
    if not documents:
        named = ", ".join(STDIN_NAME if s == STDIN else s for s in sources)
        raise ManifestError(f"{named}: holds no documents; pass a manifest with a Pod or workload")
    return documents
