"""Fixtures for the server tests: the real bundled policies behind a Flask test client."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from webhook.server.app import AdmissionOptions, create_app
from webhook.server.json_logs import AdmissionLog
from webhook.server.metrics import AdmissionMetrics
from webhook.server.policy_store import PolicyStore

from .support import BUNDLED_POLICIES


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    """A private copy of the bundled policies, so tests may change files."""
    target = tmp_path / "policies"
    target.mkdir()
    for source in BUNDLED_POLICIES.glob("*.yaml"):
        shutil.copy(source, target / source.name)
    return target


@pytest.fixture
def store() -> PolicyStore:
    return PolicyStore.loaded(BUNDLED_POLICIES)


@pytest.fixture
def admission_log_stream() -> io.BytesIO:
    return io.BytesIO()


@pytest.fixture
def metrics() -> AdmissionMetrics:
    return AdmissionMetrics()


@pytest.fixture
def app(store: PolicyStore, metrics: AdmissionMetrics, admission_log_stream: io.BytesIO) -> Flask:
    return create_app(
        store,
        options=AdmissionOptions(excluded_namespaces=frozenset({"kube-system", "gpushare-system"})),
        metrics=metrics,
        admission_log=AdmissionLog(admission_log_stream),
    )


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()
