"""Fixtures shared by test modules in several folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.helm import HelmBuildError, helm_binary


@pytest.fixture(scope="module")
def helm() -> Path:
    """The Helm binary; a failed build fails the tests (never skipped: Go is required)."""
    try:
        return helm_binary()
    except HelmBuildError as error:
        pytest.fail(str(error), pytrace=False)
