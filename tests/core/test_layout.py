"""The core's shape: small modules and functions, modes reached through their package face."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "webhook" / "core"
MODULES = sorted(CORE.rglob("*.py"))
MODE_MODULES = {"mps", "mps_daemon", "time_slicing"}


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(CORE)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert len(source.splitlines()) <= 400
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            assert node.end_lineno - node.lineno + 1 <= 60, node.name


def test_sharing_modes_do_not_import_each_other() -> None:
    for path in (CORE / "modes").glob("*.py"):
        if path.stem == "__init__":
            continue
        siblings = {f"webhook.core.modes.{name}" for name in MODE_MODULES - {path.stem}}
        assert not _imported(path) & siblings, path.name


def test_outside_modes_the_core_uses_only_the_package_face() -> None:
    for path in MODULES:
        if path.parent.name == "modes":
            continue
        inner = {name for name in _imported(path) if name.startswith("webhook.core.modes.")}
        assert not inner, f"{path.relative_to(CORE)} imports {sorted(inner)}"
