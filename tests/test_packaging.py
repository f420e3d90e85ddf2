"""Installing prints no deprecation warnings: the package metadata is built, offline, by the
setuptools the project requires, and nothing it says is a warning.

The check in full (needs the package index): a fresh venv, then
``pip install -v -e .`` and no ``Deprecat`` in its output (pip shows the build backend's
warnings only with ``-v``).
"""

from __future__ import annotations

import re
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


def built_metadata(tmp_path: Path) -> tuple[str, str]:
    """The METADATA the build backend writes for an editable install, and what it said."""
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
    metadata = (out / run.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    return metadata, run.stdout + run.stderr


def test_building_the_metadata_prints_no_warning(tmp_path: Path) -> None:
    metadata, said = built_metadata(tmp_path)
    assert "Warning" not in said and "Deprecat" not in said, said
    assert "License-Expression: Apache-2.0" in metadata


def test_the_kubernetes_client_is_the_cluster_extra_alone(tmp_path: Path) -> None:
    """The admission service never talks to the API: `pip install gpushare` leaves the
    client (126 MB) out; `gpushare[cluster]` brings it for the commands that do
    (tests/test_cluster_extra.py), and the dev extra, which the tests install, includes it."""
    optional = PYPROJECT["project"]["optional-dependencies"]
    assert not [d for d in PYPROJECT["project"]["dependencies"] if "kubernetes" in d]
    assert optional["cluster"] == ["kubernetes>=30"]
    assert "gpushare[plots,cluster]" in optional["dev"]
    metadata, _ = built_metadata(tmp_path)
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    client = [line for line in requires if re.match(r"Requires-Dist: kubernetes\b(?!-)", line)]
    assert client == ['Requires-Dist: kubernetes>=30; extra == "cluster"'], requires
    assert "Provides-Extra: cluster" in metadata.splitlines()


def test_the_wheel_carries_every_data_file_the_package_reads(tmp_path: Path) -> None:
    """A non-Python file under webhook/ that the code opens must ship in the wheel: the
    image installs the wheel, not the checkout (its server failed to boot without the table
    of workload kinds)."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "webhook", tmp_path / "webhook")
    build = (
        "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    )
    out = tmp_path / "dist"
    out.mkdir()
    run = subprocess.run(
        [sys.executable, "-c", build, str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    import zipfile

    wheel = out / run.stdout.strip().splitlines()[-1]
    shipped = set(zipfile.ZipFile(wheel).namelist())
    data = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "webhook").rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    }
    assert data, "no data files found under webhook/"
    assert data <= shipped, sorted(data - shipped)
