"""Fixtures for the server tests: the real bundled policies behind a WSGI test client."""

from __future__ import annotations

import io
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from werkzeug.test import Client

from webhook.json_logging import json_handler
from webhook.policy_store import PolicyStore
from webhook.server.app import WebhookApp, create_app
from webhook.server.batched_log import ADMISSION_LOGGER
from webhook.server.metrics import AdmissionMetrics

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
def admission_log_stream() -> Iterator[io.StringIO]:
    """The admission log lines, as JSON lines, of the app under test."""
    stream = io.StringIO()
    handler = json_handler(stream)
    logger = logging.getLogger(ADMISSION_LOGGER)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield stream
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture
def metrics() -> AdmissionMetrics:
    return AdmissionMetrics()


@pytest.fixture
def app(
    store: PolicyStore, metrics: AdmissionMetrics, admission_log_stream: io.StringIO
) -> WebhookApp:
    return create_app(store, metrics=metrics)


@pytest.fixture
def client(app: WebhookApp) -> Client:
    return Client(app)
