"""Installing prints no deprecation warnings: the package metadata is built, offline, by the
setuptools the project requires, and nothing it says is a warning.

The check in full (needs the package index): a fresh venv, then
``pip install -v -e .`` and no ``Deprecat`` in its output (pip shows the build backend's
warnings only with ``-v``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_license_is_an_spdx_expression_not_a_table_or_classifier() -> None:
    # setuptools 77+ deprecates the table form and License :: classifiers (PEP 639).
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    classifiers = PYPROJECT["project"].get("classifiers", [])
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert "setuptools>=77" in PYPROJECT["build-system"]["requires"][0]


def test_building_the_metadata_prints_no_warning(tmp_path: Path) -> None:
    import setuptools

    major = int(setuptools.__version__.split(".")[0])
    if major < 77:
        pytest.fail(f"setuptools {setuptools.__version__} < 77: pip install -e '.[dev]'")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "webhook", tmp_path / "webhook")
    build = (
        "import sys; from setuptools import build_meta; "
        "print(build_meta.prepare_metadata_for_build_editable(sys.argv[1]))"
    )
    out = tmp_path / "metadata"
    out.mkdir()
    run = subprocess.run(
        [sys.executable, "-W", "default", "-c", build, str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    said = run.stdout + run.stderr
    assert "Warning" not in said and "Deprecat" not in said, said
    metadata = (out / run.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata
