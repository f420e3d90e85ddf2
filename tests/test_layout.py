"""The house rules of docs/architecture.md, checked on the source.

Each part of webhook/ (a package, or a module outside every package) may import only what
the architecture allows (``ALLOWED_IMPORTS``, the same table as docs/architecture.md's), and
no two parts import each other, however indirectly. A package is used only through its
public face: other parts import the package itself (its ``__init__``, whose ``__all__``
names what they may use), never its inner modules. Inside the core no modules import each
other in a circle. Modules stay under 400 lines and functions under 60 unless their
docstring says why they are long; bench/ imports no test module.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "webhook"
ARCHITECTURE = REPO / "docs" / "architecture.md"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
LONG_REASON = "long because"

# Which first-party parts each part of webhook/ may import (besides itself). A part is a
# package (its modules together) or a module outside every package. docs/architecture.md
# holds the same table ("package | may import"); a test keeps the two equal.
ALLOWED_IMPORTS: dict[str, set[str]] = {
    # Names shared with the cluster, the error hierarchy, the one log format: under all.
    "webhook.constants": set(),
    "webhook.errors": set(),
    "webhook.json_logging": set(),
    "webhook.core": {"webhook.constants", "webhook.errors"},
    # CEL variables folded into their users: for the safety net (install) and compile alike.
    "webhook.cel_inlining": set(),
    # Manifests read with bounds: mutate, explain and plan read the same.
    "webhook.manifest": {"webhook.errors"},
    # The policies a long-running process serves, reloaded from disk: each webhook worker,
    # and `gpushare dra-templates --watch`.
    "webhook.policy_store": {"webhook.core", "webhook.errors"},
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
        "webhook.json_logging",
        "webhook.policy_store",
    },
    "webhook.node": {"webhook.core", "webhook.constants", "webhook.errors", "webhook.json_logging"},
    # The dra mode's templates, decided by the core, kept in the cluster.
    "webhook.dra": {"webhook.core", "webhook.constants", "webhook.errors"},
    # gpushare.io/milligpu advertised on every GPU node, for quota on GPU share.
    "webhook.quota": {"webhook.constants", "webhook.json_logging"},
    "webhook.compile": {
        "webhook.core",
        "webhook.constants",
        "webhook.errors",
        "webhook.cel_inlining",
    },
    # The offline verdicts of `gpushare mutate` / `explain`, on the manifests it reads.
    "webhook.offline": {"webhook.core", "webhook.constants", "webhook.errors", "webhook.manifest"},
    # `gpushare mutate|explain --all-modes`: each policy alone, through the offline verdicts.
    "webhook.all_modes": {
        "webhook.core",
        "webhook.constants",
        "webhook.manifest",
        "webhook.offline",
    },
    # `gpushare plan`: workloads read as mutate reads them, decided by the core, packed.
    "webhook.plan": {
        "webhook.core",
        "webhook.constants",
        "webhook.errors",
        "webhook.manifest",
        "webhook.offline",
    },
    # The command line: flags and printing around everything else; nothing imports it.
    "webhook.cli": {
        "webhook.core",
        "webhook.constants",
        "webhook.errors",
        "webhook.manifest",
        "webhook.offline",
        "webhook.all_modes",
        "webhook.policy_store",
        "webhook.install",
        "webhook.server",
        "webhook.node",
        "webhook.dra",
        "webhook.quota",
        "webhook.compile",
        "webhook.plan",
    },
}
# The core may not depend on any transport or node library.
CORE_FORBIDDEN_LIBRARIES = {"flask", "werkzeug", "gunicorn", "prometheus_client", "pynvml"}
CORE = "webhook.core"


def modules() -> Iterator[Path]:
    yield from sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULE_NAMES = {module_name(path) for path in modules()}
PACKAGES = sorted(part for part in ALLOWED_IMPORTS if (REPO / part.replace(".", "/")).is_dir())


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST, *, type_checking: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under ``node``, those inside functions included; those under
    ``if TYPE_CHECKING:`` only with ``type_checking``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child):
            if type_checking:
                yield from _import_nodes(child, type_checking=type_checking)
            for orelse in child.orelse:
                yield from _import_nodes(orelse, type_checking=type_checking)
        else:
            yield from _import_nodes(child, type_checking=type_checking)


def imported_modules(path: Path, *, type_checking: bool = True) -> Iterator[str]:
    """The modules ``path`` imports, absolute. ``from package import name`` where
    ``package.name`` is a module of webhook/ means that module (``from webhook.server import
    admission`` reaches into the server); otherwise it means the package's face."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in _import_nodes(tree, type_checking=type_checking):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif node.module and node.level == 0:
            inner = [f"{node.module}.{alias.name}" for alias in node.names]
            inner = [name for name in inner if name in MODULE_NAMES]
            yield from inner
            if len(inner) < len(node.names):
                yield node.module


def owner(name: str) -> str | None:
    """The part of ``ALLOWED_IMPORTS`` that module ``name`` belongs to."""
    return next(
        (part for part in ALLOWED_IMPORTS if name == part or name.startswith(part + ".")), None
    )


def test_every_module_belongs_to_a_part() -> None:
    orphans = sorted(name for name in MODULE_NAMES if name != "webhook" and owner(name) is None)
    assert not orphans, f"add these to ALLOWED_IMPORTS and docs/architecture.md: {orphans}"


@pytest.mark.parametrize("path", list(modules()), ids=lambda p: str(p.relative_to(REPO)))
def test_module_imports_follow_the_architecture(path: Path) -> None:
    name = module_name(path)
    part = owner(name)
    for imported in imported_modules(path):
        top = imported.split(".")[0]
        if part == CORE:
            assert top not in CORE_FORBIDDEN_LIBRARIES, f"{name} imports {imported}"
        if top != "webhook" or part is None or owner(imported) == part:
            continue
        target = owner(imported) or imported
        assert target in ALLOWED_IMPORTS[part], f"{name} may not import {imported}"
        assert imported == target, (
            f"{name} imports {imported}: use the public face of {target}, `from {target} "
            "import ...`"
        )


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_face_names_what_it_offers(package: str) -> None:
    face = importlib.import_module(package)
    exported = getattr(face, "__all__", None)
    assert exported, f"{package}/__init__.py has no __all__"
    assert len(set(exported)) == len(exported), f"{package}.__all__ names something twice"
    unresolved = [name for name in exported if not hasattr(face, name)]
    assert not unresolved, f"{package}.__all__ names what it does not have: {unresolved}"


def test_other_parts_use_only_the_names_a_face_offers() -> None:
    faces = {package: set(importlib.import_module(package).__all__) for package in PACKAGES}
    for path in modules():
        part = owner(module_name(path))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _import_nodes(tree, type_checking=True):
            if not isinstance(node, ast.ImportFrom) or node.module not in faces:
                continue
            if node.module == part:
                continue
            for alias in node.names:
                assert alias.name in faces[node.module], (
                    f"{path.relative_to(REPO)} imports {alias.name} from {node.module}, whose "
                    "__all__ does not offer it"
                )


def _cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One circle in ``graph`` (its nodes in order, the first repeated at the end), if any."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for successor in sorted(graph.get(node, ())):
            found = visit(successor, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_no_two_parts_import_each_other() -> None:
    graph: dict[str, set[str]] = {part: set() for part in ALLOWED_IMPORTS}
    for path in modules():
        part = owner(module_name(path))
        if part is None:
            continue
        for imported in imported_modules(path):
            target = owner(imported)
            if target is not None and target != part:
                graph[part].add(target)
    cycle = _cycle(graph)
    assert cycle is None, "parts of webhook/ import each other: " + " -> ".join(cycle or [])


def test_the_core_modules_import_no_circle() -> None:
    """A circle of imports between the core's modules, counted statically.

    Imports inside functions count: deferring one hides the circle from Python at import
    time, not from a reader (the planner's caches on ``PolicySet`` were one). Imports under
    ``if TYPE_CHECKING:`` do not: they never run and only name types for annotations (a
    policy's ``schemes`` field names ``SchemeSettings``, whose module reads the policy
    ``Mode``). A package means its ``__init__``; the parents Python initialises first are
    not counted, or every package face that imports its own modules would be a circle.
    """
    graph: dict[str, set[str]] = {}
    for path in modules():
        name = module_name(path)
        if owner(name) != CORE:
            continue
        graph[name] = {
            imported
            for imported in imported_modules(path, type_checking=False)
            if owner(imported) == CORE and imported != name
        }
    cycle = _cycle(graph)
    assert cycle is None, "core modules import each other: " + " -> ".join(cycle or [])


def documented_imports() -> dict[str, set[str]]:
    """docs/architecture.md's table "package | may import": backquoted names, or nothing."""
    lines = ARCHITECTURE.read_text(encoding="utf-8").splitlines()
    header = next(
        i for i, line in enumerate(lines) if re.match(r"\|\s*package\s*\|\s*may import\s*\|", line)
    )
    table: dict[str, set[str]] = {}
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        package, allowed = (cell.strip() for cell in line.strip().strip("|").split("|"))
        table[package.strip("`")] = set(re.findall(r"`([^`]+)`", allowed))
    return table


def test_the_documented_import_table_is_the_checked_one() -> None:
    assert documented_imports() == ALLOWED_IMPORTS


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
