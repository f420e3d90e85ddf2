"""No code of the project reaches into a dependency's private names.

A private name (one leading underscore) of another project can change in any release; the
transport once rested on twenty of gunicorn's and pinned it to one minor version. Checked on
the source of webhook/, bench/, harness/ and tests/:

- no ``from dep import _name``, no ``import dep._module``;
- no ``._name`` attribute read on another project's module or class, or on a value that
  is evidently one of its objects: made by a call to it (``parser =
  argparse.ArgumentParser()``) or annotated with its type (``parser:
  argparse.ArgumentParser``). The first party's own private names are its own business;
  the few underscore names other projects document (``os._exit``, a namedtuple's
  ``_asdict``) are allowed;
- a class derived from another project's class overrides only the hooks that class
  documents for subclasses (``DOCUMENTED_HOOKS``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("webhook", "bench", "harness", "tests")
FIRST_PARTY = {"webhook", "bench", "harness", "tests", "__future__"}

# Base class (as imported) -> the methods its documentation invites subclasses to define.
DOCUMENTED_HOOKS: dict[str, set[str]] = {
    # https://docs.gunicorn.org/en/stable/settings.html#worker-class and the docstrings of
    # gunicorn.workers.base.Worker: run() is the worker's main loop.
    "Worker": {"run"},
    # https://docs.python.org/3/library/asyncio-protocol.html#base-protocol
    "asyncio.Protocol": {
        "connection_made",
        "connection_lost",
        "data_received",
        "eof_received",
        "pause_writing",
        "resume_writing",
    },
    # https://docs.python.org/3/library/logging.html#handler-objects / formatter-objects
    "logging.Handler": {"emit", "flush", "close", "handle", "createLock"},
    "logging.Formatter": {"format", "formatTime", "formatException", "formatStack"},
    "logging.StreamHandler": {"emit", "flush", "close"},
    # https://docs.gunicorn.org/en/stable/settings.html#logger-class: a Logger subclass.
    "Logger": {"access", "atoms", "setup"},
    "glogging.Logger": {"access", "atoms", "setup"},
    # https://docs.python.org/3/library/http.server.html#http.server.BaseHTTPRequestHandler
    "BaseHTTPRequestHandler": {"do_GET", "do_POST", "do_PUT", "do_HEAD", "log_message"},
    "http.server.BaseHTTPRequestHandler": {"do_GET", "do_POST", "log_message"},
}


# Underscore names their projects document as public API.
DOCUMENTED_UNDERSCORE_NAMES = {"_exit", "_asdict", "_replace", "_fields", "_make"}


def sources() -> Iterator[Path]:
    for folder in SOURCES:
        yield from sorted((REPO / folder).rglob("*.py"))


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def first_party_modules(tree: ast.AST) -> set[str]:
    """Names bound to first-party modules by ``import`` / ``from`` in this file."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FIRST_PARTY:
                    names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (
            node.level > 0 or (node.module or "").split(".")[0] in FIRST_PARTY
        ):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def foreign_bases(tree: ast.AST) -> set[str]:
    """Names bound by imports from other projects (the standard library included)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in FIRST_PARTY:
                    names.add((alias.asname or alias.name).split(".")[0])
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] not in FIRST_PARTY
        ):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def foreign_typed_names(tree: ast.AST, foreign: set[str]) -> set[str]:
    """Local names that evidently hold another project's objects."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            if root_name(node.value) in foreign:
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            annotation = node.annotation
            if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
                annotation = ast.parse(annotation.value, mode="eval").body
            if root_name(annotation) in foreign:
                target = node.arg if isinstance(node, ast.arg) else ast.unparse(node.target)
                names.add(target)
    return names


def violations(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = first_party_modules(tree)
    foreign = foreign_bases(tree)
    foreign_values = foreign | foreign_typed_names(tree, foreign)
    where = path.relative_to(REPO)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in FIRST_PARTY:
                continue
            if any(is_private(part) for part in node.module.split(".")):
                yield f"{where}:{node.lineno}: from {node.module} import ..."
            for alias in node.names:
                if is_private(alias.name):
                    yield f"{where}:{node.lineno}: from {node.module} import {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FIRST_PARTY:
                    continue
                if any(is_private(part) for part in alias.name.split(".")):
                    yield f"{where}:{node.lineno}: import {alias.name}"
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            if node.attr in DOCUMENTED_UNDERSCORE_NAMES:
                continue
            root = root_name(node)
            if root in foreign_values and root not in own:
                yield f"{where}:{node.lineno}: {ast.unparse(node)}"


@pytest.mark.parametrize("path", list(sources()), ids=lambda p: str(p.relative_to(REPO)))
def test_no_private_names_of_dependencies(path: Path) -> None:
    found = list(violations(path))
    assert not found, "private names of another project:\n" + "\n".join(found)


def test_the_worker_overrides_only_documented_hooks() -> None:
    """The gunicorn worker defines ``run`` and methods of its own, none of gunicorn's."""
    from gunicorn.workers.base import Worker

    from webhook.server.async_worker import AsyncioWorker

    ours = {name for name in vars(AsyncioWorker) if not name.startswith("__")}
    inherited = {name for name in dir(Worker) if not name.startswith("__")}
    assert ours & inherited <= DOCUMENTED_HOOKS["Worker"] | {"alive"}, ours & inherited


def test_the_scan_finds_what_it_looks_for() -> None:
    probe = REPO / "tests" / "_private_probe_tmp.py"
    probe.write_text(
        "from gunicorn.workers.gthread import TConn, _x\n"
        "import asyncio.sslproto._thing\n"
        "import argparse\n"
        "def f(parser: argparse.ArgumentParser):\n    return parser._actions\n"
    )
    try:
        found = list(violations(probe))
    finally:
        probe.unlink()
    assert len(found) == 3, found
