"""The node's event lines: the project's one log format, with the event name and fields on top."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from webhook.node import events


@pytest.fixture
def event_stream() -> Iterator[io.StringIO]:
    """``events.configure`` on a string buffer; the logger is put back as it was afterwards."""
    logger = logging.getLogger(events.LOGGER_NAME)
    saved = (list(logger.handlers), logger.level, logger.propagate)
    stream = io.StringIO()
    events.configure(stream)
    try:
        yield stream
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved


def test_an_event_is_one_json_line_in_the_project_format(event_stream: io.StringIO) -> None:
    events.emit(
        "daemon_restart_scheduled",
        "Restarting the MPS control daemon in 2s (attempt 2).",
        level=logging.WARNING,
        delay_s=2.0,
        attempt=2,
        servers=[4000000],
    )
    (line,) = event_stream.getvalue().splitlines()
    entry = json.loads(line)
    assert list(entry)[:5] == ["time", "level", "logger", "message", "event"]
    assert entry["time"].endswith("+00:00")
    assert entry["level"] == "warning"
    assert entry["logger"] == "gpushare.node"
    assert entry["message"] == "Restarting the MPS control daemon in 2s (attempt 2)."
    assert entry["event"] == "daemon_restart_scheduled"
    assert (entry["delay_s"], entry["attempt"], entry["servers"]) == (2.0, 2, [4000000])
    assert "msg" not in entry


def test_a_field_may_not_overwrite_what_the_format_writes(event_stream: io.StringIO) -> None:
    with pytest.raises(ValueError, match=r"fields \['logger', 'time'\] the log format owns"):
        events.emit("node_ready", "Node labelled.", time="now", logger="me")
    assert event_stream.getvalue() == ""
