"""The admission lines' handler: whole lines, at most PIPE_BUF bytes a write, never late."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator

import pytest

from webhook.json_logging import JsonFormatter
from webhook.server import batched_log
from webhook.server.batched_log import PIPE_BUF, BatchedLineHandler


@pytest.fixture
def recorded_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    writes: list[bytes] = []

    def record(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return len(data)

    monkeypatch.setattr(batched_log.os, "write", record)
    yield writes


def handler_logger(handler: logging.Handler) -> logging.Logger:
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(f"test.batched.{id(handler)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return logger


def test_lines_are_written_whole_in_batches_under_pipe_buf(recorded_writes: list[bytes]) -> None:
    handler = BatchedLineHandler(max_delay=60)
    logger = handler_logger(handler)
    for index in range(200):
        logger.info("admission", extra={"uid": f"u-{index}", "pad": "x" * 100})
    handler.flush()
    assert len(recorded_writes) < 200 / 10  # batched, not a write per line
    assert all(len(write) <= PIPE_BUF and write.endswith(b"\n") for write in recorded_writes)
    lines = b"".join(recorded_writes).decode().splitlines()
    assert [json.loads(line)["uid"] for line in lines] == [f"u-{i}" for i in range(200)]


def test_a_line_is_written_within_the_delay_without_a_flush() -> None:
    read_fd, write_fd = os.pipe()
    handler = BatchedLineHandler(fd=write_fd, max_delay=0.05)
    logger = handler_logger(handler)
    try:
        logger.info("admission", extra={"uid": "late"})
        os.set_blocking(read_fd, False)
        deadline = time.monotonic() + 5
        data = b""
        while time.monotonic() < deadline and not data.endswith(b"\n"):
            try:
                data += os.read(read_fd, PIPE_BUF)
            except BlockingIOError:
                time.sleep(0.01)
        assert json.loads(data)["uid"] == "late"
    finally:
        handler.close()
        os.close(read_fd)
        os.close(write_fd)


def test_close_writes_what_is_pending(recorded_writes: list[bytes]) -> None:
    handler = BatchedLineHandler(max_delay=60)
    handler_logger(handler).info("admission", extra={"uid": "last"})
    assert recorded_writes == []
    handler.close()
    assert json.loads(recorded_writes[0])["uid"] == "last"
