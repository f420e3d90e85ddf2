"""The access-log work gunicorn does per request happens only when a line is written."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from gunicorn.config import Config

from webhook.server.gunicorn_logger import QuietAccessLogger, logging_config


def logger() -> QuietAccessLogger:
    config = Config()
    config.set("logconfig_dict", logging_config("info"))
    config.set("logger_class", "webhook.server.gunicorn_logger.QuietAccessLogger")
    built = config.logger_class(config)
    assert isinstance(built, QuietAccessLogger)
    return built


def test_the_served_configuration_builds_no_access_line(monkeypatch: pytest.MonkeyPatch) -> None:
    quiet = logger()
    built: list[Any] = []
    monkeypatch.setattr(quiet, "atoms", lambda *args: built.append(args) or {})
    # gunicorn itself would build the line: a logconfig_dict counts as access logging on.
    assert quiet.access_log_enabled
    quiet.access(object(), object(), {}, 0.001)
    assert built == []


def test_an_access_logger_turned_up_gets_its_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    loud = logger()
    loud.access_log.setLevel(logging.INFO)
    built: list[Any] = []

    def atoms(*args: Any) -> dict[str, str]:
        built.append(args)
        return {}

    monkeypatch.setattr(loud, "atoms", atoms)
    loud.access(object(), object(), {}, 0.001)
    assert len(built) == 1
