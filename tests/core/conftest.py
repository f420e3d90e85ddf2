"""Fixtures for the core tests: policy sets loaded once per session."""

from __future__ import annotations

import pytest

from webhook.core.policy.loader import load_policies
from webhook.core.policy.model import PolicySet

from .support import MPS_DAEMON_EXAMPLE, MPS_EXAMPLE, load_all_examples, load_bundled


@pytest.fixture(scope="session")
def bundled() -> PolicySet:
    return load_bundled()


@pytest.fixture(scope="session")
def mps_example() -> PolicySet:
    return load_policies(MPS_EXAMPLE)


@pytest.fixture(scope="session")
def mps_daemon_example() -> PolicySet:
    return load_policies(MPS_DAEMON_EXAMPLE)


@pytest.fixture(scope="session")
def all_examples() -> PolicySet:
    return load_all_examples()
