"""The house rules of docs/architecture.md, checked on the source.

Each package may import only what the architecture allows; other packages use the core only
through its public face (``webhook.core``); modules stay under 400 lines and functions under
60 unless their docstring says why they are long; bench/ imports no test module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "webhook"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
LONG_REASON = "long because"

# Which first-party packages each part of webhook/ may import (besides itself).
ALLOWED_IMPORTS: dict[str, set[str]] = {
    "webhook.core": {"webhook.constants", "webhook.errors"},
    # The safety-net policy carries facts of the policies (webhook.install.policy_facts).
    "webhook.install": {
        "webhook.core",
        "webhook.constants",
        "webhook.errors",
        "webhook.cel_inlining",
    },
    "webhook.server": {
        "webhook.core",
        "webhook.constants",
        "webhook.errors",
        "webhook.install",
        "webhook.json_logging",
    },
    "webhook.node": {"webhook.core", "webhook.constants", "webhook.errors", "webhook.json_logging"},
    "webhook.cli": {
        "webhook.core",
        "webhook.constants",
        "webhook.errors",
        "webhook.manifest",
        "webhook.offline",
        "webhook.policy_check",
        "webhook.plan",
        "webhook.server",
        "webhook.node",
        "webhook.dra",
        "webhook.compile",
        "webhook.all_modes",
    },
    # `gpushare dra-templates`: the core's templates, applied with the server's policy store.
    "webhook.dra": {"webhook.core", "webhook.constants", "webhook.errors", "webhook.server"},
    "webhook.compile": {
        "webhook.core",
        "webhook.constants",
        "webhook.errors",
        "webhook.cel_inlining",
    },
    # CEL variables folded into their users: for the safety net (install) and compile alike.
    "webhook.cel_inlining": set(),
    # `gpushare policy check`: the core's set checks and the node side's pool clashes.
    "webhook.policy_check": {"webhook.core", "webhook.constants", "webhook.errors", "webhook.node"},
    # `gpushare plan`: workloads read as mutate reads them, decided by the core, packed.
    "webhook.plan": {
        "webhook.core",
        "webhook.constants",
        "webhook.errors",
        "webhook.manifest",
        "webhook.offline",
    },
    # `gpushare mutate|explain --all-modes`: each policy alone, through the offline verdicts.
    "webhook.all_modes": {
        "webhook.core",
        "webhook.constants",
        "webhook.manifest",
        "webhook.offline",
    },
    # The offline verdicts of `gpushare mutate` / `explain`, on the manifests it reads.
    "webhook.offline": {
        "webhook.core",
        "webhook.constants",
        "webhook.errors",
        "webhook.manifest",
        "webhook.server",
    },
}
# The core may not depend on any transport or node library.
CORE_FORBIDDEN_LIBRARIES = {"flask", "werkzeug", "gunicorn", "prometheus_client", "pynvml"}


def modules() -> Iterator[Path]:
    yield from sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def owner(name: str) -> str | None:
    """The part of ``ALLOWED_IMPORTS`` that module ``name`` belongs to."""
    return next(
        (part for part in ALLOWED_IMPORTS if name == part or name.startswith(part + ".")), None
    )


@pytest.mark.parametrize("path", list(modules()), ids=lambda p: str(p.relative_to(REPO)))
def test_module_imports_follow_the_architecture(path: Path) -> None:
    name = module_name(path)
    part = owner(name)
    for imported in imported_modules(path):
        top = imported.split(".")[0]
        if part == "webhook.core":
            assert top not in CORE_FORBIDDEN_LIBRARIES, f"{name} imports {imported}"
        if top != "webhook" or part is None or owner(imported) == part:
            continue
        target = owner(imported) or ".".join(imported.split(".")[:2])
        assert target in ALLOWED_IMPORTS[part], f"{name} may not import {imported}"
        if target == "webhook.core":
            assert imported == "webhook.core", (
                f"{name} imports {imported}: use the core's public face, `from webhook.core "
                "import ...`"
            )


def test_the_core_public_face_is_explicit() -> None:
    import webhook.core

    exported = set(webhook.core.__all__)
    assert exported and all(hasattr(webhook.core, name) for name in exported)


@pytest.mark.parametrize("path", list(modules()), ids=lambda p: str(p.relative_to(REPO)))
def test_module_and_function_length(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path} is over {MAX_MODULE_LINES} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            docstring = (ast.get_docstring(node) or "").lower()
            assert length <= MAX_FUNCTION_LINES or LONG_REASON in docstring, (
                f"{path}:{node.lineno} {node.name} is {length} lines; split it or say in its "
                f"docstring why it is {LONG_REASON} ..."
            )


def test_bench_imports_no_test_module() -> None:
    for path in sorted((REPO / "bench").rglob("*.py")):
        for imported in imported_modules(path):
            assert imported.split(".")[0] != "tests", f"{path} imports {imported}"
